#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/<family>.json: what the Hugging Face `tokenizers` library
(pinned in tools/requirements.txt) makes of a fixed set of strings, for nibble's tokenizer tests.
Also writes synthetic.json: tiny tokenizers trained here, in variants that exercise components
and options the real files do not use (Split behaviours, added-token flags, Metaspace schemes,
unknown tokens, other normalizers, post-processors and decoders), with the same kind of cases.

For every string: ids (add_special_tokens=True), ids_no_special (False), decoded
(decode(ids, skip_special_tokens=True)) and decoded_keep_special (skip_special_tokens=False).
Also a few arbitrary id sequences (seeded), to test decode on ids that encode() would never make
(broken UTF-8 byte runs, special tokens in the middle).

Usage: tools/make_tokenizer_fixtures.py [--data ../shared/data/tokenizers] [--out tests/fixtures/tokenizer]
"""

import argparse
import json
import random
import unicodedata
from pathlib import Path

import copy

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

FAMILIES = ["mixtral", "qwen3", "deepseek_v3"]

# Every family's special tokens are written into every fixture: in the others they are plain text.
SPECIAL_TEXTS = [
    "<s>Hello</s>",
    "Hello <s> world </s> end",
    "<s><s></s>",
    "x<s>y",
    "  <s>  ",
    "<unk> is unknown",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "<think>reasoning here</think>The answer.",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>",
    "<｜User｜>hello<｜Assistant｜>world<|EOT|>",
    "<｜fim▁begin｜>def f():<｜fim▁hole｜>pass<｜fim▁end｜>",
]

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "  leading spaces",
    "trailing spaces   ",
    "\tTabs\tand\ttabs\t",
    "line1\nline2\n\nline3\n",
    "windows\r\nline\r\n\r\nend\r\n",
    "mixed \t \n \r\n  \n\t end",
    "   \n\n   ",
    " " * 300 + "after many spaces",
    "Café naïve résumé façade Ångström",
    unicodedata.normalize("NFD", "Café naïve résumé façade Ångström"),
    unicodedata.normalize("NFD", "한국어 텍스트"),
    "\u0301abc starts with a combining mark",
    "ﬁ ligature, ½ fraction, Ω ohm, K kelvin",
    "你好，世界！这是一个测试。",
    "こんにちは、世界。カタカナとひらがな。",
    "안녕하세요 세계",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Привет мир, Γειά σου κόσμε",
    "สวัสดีชาวโลก",
    "שָׁלוֹם עוֹלָם",
    "I ❤️ 🍕 and 🚀!",
    "👨‍👩‍👧‍👦 family, 👩🏽‍💻 coder",
    "🇫🇷🇺🇸🇯🇵 flags",
    "👍🏽👍🏿",
    "∑∫√∞≠≤≥ ∀x∈ℝ",
    "𝄞 𐍈 🧿 four-byte characters",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(12))\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v[0] != 0 ? 1 : 0;\n}\n",
    "1234567890123456789",
    "Pi is 3.14159265358979 and e=2.71828; 1,000,000 items.",
    "１２３ ٣٤٥ ¹²³",
    "I'M here, they'll go, we'd see, it's fine, DON'T, You've, she'S, THEY'RE",
    "it'ſ and it'S",
    "<0x41> literally <0xZZ> <0x0A>",
    "a\x00b\x01c\x7f\x1bd\x85e\u200bf\ufeffg",
    "Unicode spaces:\u00a0\u2003\u3000|\u180e|\u2028|",
    "https://example.com/path?q=1&r=2 mail@example.org",
    '{"key": [1, 2, {"nested": true}], "s": "x\\ny"}',
    "!!!??? ... --- *** ___",
    "▁ metaspace char ▁▁ in text",
    "Ġ byte-level char Ċ in text",
    "supercalifragilisticexpialidocious " + "a" * 500,
    "ALL CAPS SENTENCE WITH NUMBERS 2024",
] + SPECIAL_TEXTS


def long_text(size=20000):
    """Deterministic mixed text of about `size` characters."""
    rng = random.Random(1234)
    parts = [t for t in TEXTS if t and len(t) < 200]
    words = ["the", "model", "token", "Mixture", "of", "Experts", "naïve", "日本語", "😀", "42",
             "x_1", "\n", "\t", "  ", "it's", "Ünïcödé", "(a+b)", "über", "Заголовок", "—"]
    out = []
    total = 0
    while total < size:
        piece = rng.choice(parts) if rng.random() < 0.2 else rng.choice(words) + " "
        out.append(piece)
        total += len(piece)
    return "".join(out)


def random_id_sequences(tok, count=12, length=24):
    rng = random.Random(99)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    special = [i for i, t in tok.get_added_tokens_decoder().items() if t.special][:8]
    byte_ids = [tok.token_to_id(f"<0x{b:02X}>") for b in (0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x41)]
    byte_ids = [i for i in byte_ids if i is not None]
    sequences = []
    for _ in range(count):
        seq = []
        for _ in range(length):
            r = rng.random()
            if r < 0.1 and special:
                seq.append(rng.choice(special))
            elif r < 0.3 and byte_ids:
                seq.append(rng.choice(byte_ids))
            else:
                seq.append(rng.randrange(vocab))
        sequences.append(seq)
    return sequences


def encode_cases(tok, texts):
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=True).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(ids, skip_special_tokens=True),
            "decoded_keep_special": tok.decode(ids, skip_special_tokens=False),
        })
    return cases


def make_fixture(path: Path):
    tok = Tokenizer.from_file(str(path))
    cases = encode_cases(tok, TEXTS + [long_text()])
    decode_cases = []
    for ids in random_id_sequences(tok):
        decode_cases.append({
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=True),
            "decoded_keep_special": tok.decode(ids, skip_special_tokens=False),
        })
    return {
        "tokenizers_version": tokenizers.__version__,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "cases": cases,
        "decode_cases": decode_cases,
    }


SYNTHETIC_TEXTS = [
    "Hello, world! How are you?",
    "", " ", "   ", "a", "  two  spaces  ", "tab\tand\nnewline\r\n",
    "Café naïve", unicodedata.normalize("NFD", "Café naïve"), "ﬁ ½ Ω İstanbul ΣΑΣ",
    "I'M here, they'll go", "1234567 and 89", "你好世界 😀 👨‍👩‍👧",
    "x = foo(a, b);  // done.", "!!! ?? ..",
    "<s>Hello</s>", "<s> spaced </s>", "a<s>b",
    "cat concat cats a cat. cat", "DOG dog Dog hotdog",
    "x  <ls>  y", "x <rs>   y", "x  <both>  y", "<ls><rs><both>",
    "▁already ▁metaspace", "zzz qqq jjj", "1,000.5!",
]


def base_tokenizers():
    """Tiny BPE tokenizers trained on the fixture texts; returns name -> tokenizer.json dict."""
    corpus = TEXTS + SYNTHETIC_TEXTS + [long_text(5000)]
    # The Metaspace and subword bases learn only ASCII, so that other characters exercise byte
    # fallback and unknown tokens. (limit_alphabet would do it too, but breaks ties randomly.)
    ascii_corpus = ["".join(c for c in text if c.isascii()) for text in corpus]
    specials = ["<unk>", "<s>", "</s>"]

    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    byte_level.decoder = decoders.ByteLevel()
    byte_level.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=420, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))

    metaspace = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    metaspace.decoder = decoders.Metaspace()
    metaspace.train_from_iterator(ascii_corpus, trainers.BpeTrainer(
        vocab_size=220, special_tokens=specials, show_progress=False))
    metaspace_json = json.loads(metaspace.to_str())
    vocab = metaspace_json["model"]["vocab"]
    for b in range(256):  # byte-fallback tokens live in the model's vocab, as in Mistral's
        vocab[f"<0x{b:02X}>"] = len(vocab)

    subword = Tokenizer(models.BPE(unk_token="<unk>"))
    subword.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(r"\s+"), "removed")
    subword.train_from_iterator(ascii_corpus, trainers.BpeTrainer(
        vocab_size=200, special_tokens=specials, show_progress=False,
        continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    subword_json = json.loads(subword.to_str())
    subword_json["decoder"] = None
    # The trainer numbers this alphabet in hash order; renumber so the fixture is reproducible.
    vocab = subword_json["model"]["vocab"]
    ordinary = sorted(t for t in vocab if t not in specials)
    subword_json["model"]["vocab"] = {t: i for i, t in enumerate(specials + ordinary)}

    return {"byte_level": json.loads(byte_level.to_str()), "metaspace": metaspace_json,
            "subword": subword_json}


def added(content, id, special=False, normalized=False, lstrip=False, rstrip=False,
          single_word=False):
    return {"id": id, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": normalized, "special": special}


def split(pattern, behavior, invert=False, kind="Regex"):
    return {"type": "Split", "pattern": {kind: pattern}, "behavior": behavior, "invert": invert}


def byte_level(add_prefix_space=False, use_regex=False):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": False,
            "use_regex": use_regex}


def special_token(name, id):
    return {"id": name, "ids": [id], "tokens": [name]}


def variants(bases):
    """(name, base, overrides); "model" overrides are merged into the base model."""
    out = []
    n = len(bases["byte_level"]["model"]["vocab"])
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            out.append((f"split_{behavior}_{'inverted' if invert else 'plain'}", "byte_level", {
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                    split(r"\s+|[,.!?;]", behavior, invert), byte_level()]}}))
    out.append(("split_literal", "byte_level", {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        split(" ", "MergedWithPrevious", kind="String"), byte_level()]}}))
    out.append(("byte_level_prefix_space", "byte_level", {
        "pre_tokenizer": byte_level(add_prefix_space=True, use_regex=True),
        "post_processor": byte_level(add_prefix_space=True, use_regex=True)}))
    out.append(("added_token_flags", "byte_level", {
        "normalizer": {"type": "Lowercase"},
        "added_tokens": [added("<ls>", n, special=True, lstrip=True),
                         added("<rs>", n + 1, rstrip=True),
                         added("cat", n + 2, single_word=True),
                         added("DOG", n + 3, normalized=True),
                         added("<both>", n + 4, special=True, lstrip=True, rstrip=True),
                         added("<s>", 1, special=True)]}))
    out.append(("normalizer_chain", "byte_level", {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Lowercase"},
        {"type": "Strip", "strip_left": True, "strip_right": True},
        {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "#"}]}}))
    out.append(("normalizer_nfd", "byte_level", {"normalizer": {"type": "NFD"}}))
    out.append(("template_both_ends", "byte_level", {"post_processor": {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": special_token("<s>", 1), "</s>": special_token("</s>", 2)}}}))
    out.append(("bert_processing", "byte_level", {"post_processor": {
        "type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1]}}))
    out.append(("post_sequence", "byte_level", {"post_processor": {"type": "Sequence", "processors": [
        byte_level(), {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1],
                       "trim_offsets": True, "add_prefix_space": False}]}}))
    out.append(("ignore_merges", "byte_level", {"model": {"ignore_merges": True}}))
    for scheme in ["always", "first", "never"]:
        for do_split in [True, False]:
            metaspace = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme,
                         "split": do_split}
            out.append((f"metaspace_{scheme}_{'split' if do_split else 'whole'}", "metaspace", {
                "pre_tokenizer": metaspace, "decoder": metaspace,
                "added_tokens": [added("<s>", 1, special=True), added("</s>", 2, special=True)]}))
    out.append(("mistral_style", "metaspace", {
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}))
    out.append(("unknown_fused", "metaspace", {"model": {"byte_fallback": False}}))
    out.append(("unknown_not_fused", "metaspace", {"model": {"byte_fallback": False, "fuse_unk": False}}))
    out.append(("decoder_replace_strip", "metaspace", {"decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"Regex": "▁+"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2, "stop": 0}]}}))
    out.append(("subword_affixes", "subword", {}))
    return out


def compose(base, overrides):
    result = copy.deepcopy(base)
    for key, value in overrides.items():
        if key == "model":
            result["model"].update(value)
        else:
            result[key] = value
    return result


def make_synthetic():
    bases = base_tokenizers()
    out = {"tokenizers_version": tokenizers.__version__, "bases": bases, "variants": []}
    for name, base, overrides in variants(bases):
        tok = Tokenizer.from_str(json.dumps(compose(bases[base], overrides)))
        out["variants"].append({"name": name, "base": base, "overrides": overrides,
                                "vocab_size": tok.get_vocab_size(with_added_tokens=True),
                                "cases": encode_cases(tok, SYNTHETIC_TEXTS)})
    return out


def write(out: Path, fixture, summary):
    out.write_text(json.dumps(fixture, ensure_ascii=False, separators=(",", ":")) + "\n",
                   encoding="utf-8")
    print(f"{out}: {summary}, {out.stat().st_size // 1024} KiB")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="../shared/data/tokenizers", type=Path)
    parser.add_argument("--out", default="tests/fixtures/tokenizer", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        fixture = make_fixture(args.data / family / "tokenizer.json")
        write(args.out / f"{family}.json", fixture, f"{len(fixture['cases'])} strings")
    synthetic = make_synthetic()
    write(args.out / "synthetic.json", synthetic, f"{len(synthetic['variants'])} variants")


if __name__ == "__main__":
    main()
