#!/usr/bin/env python3
"""The demo model's tokenizer: a byte-level BPE (Hugging Face `tokenizers`) trained on the demo corpus
(training prose and training arithmetic problems), with every digit its own token so that numbers read
the same wherever they stand. Writes tokenizer.json and tokenizer_config.json (BOS/EOS, a chat
template) into models/demo-moe/, where tools/train_demo_moe.py and nibble read them.

Run after scripts/install-corpus: .venv-tools/bin/python tools/train_demo_tokenizer.py
"""
import argparse
import json
import pathlib
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_demo_corpus as corpus  # noqa: E402

SPECIALS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2
# Pieces before byte-level BPE: contractions, words with an optional leading space, single digits,
# punctuation runs with an optional leading space, and whitespace (a run before a word leaves its
# last space to the word).
SPLIT = r"'(?:s|t|re|ve|m|ll|d)| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# A user turn is a question; the assistant's turn is the worked answer. The prompt ends with
# "Answer:", exactly as in training, so generation needs no extra text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "{{ 'Question: ' + message['content'] + '\\nAnswer:' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'] + eos_token }}"
    "{% endif %}"
    "{% endfor %}")


def make_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def write_config(out, max_length):
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "add_bos_token": True, "add_eos_token": False, "model_max_length": max_length,
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="corpus")
    parser.add_argument("--eval-dir", default="models/demo-moe/eval")
    parser.add_argument("--out", default="models/demo-moe")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--problems", type=int, default=50000, help="arithmetic documents to train on")
    parser.add_argument("--max-length", type=int, default=1024, help="model_max_length")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    prose = [json.loads(line)["text"] for line in open(pathlib.Path(args.corpus) / "prose_train.jsonl")]
    _, heldout = corpus.load_heldout_problems(pathlib.Path(args.eval_dir) / "arithmetic.jsonl")
    problems = corpus.training_documents(corpus.TRAIN_SEED, args.problems, heldout)
    tok = make_tokenizer(prose + problems, args.vocab_size)
    for i, name in enumerate(SPECIALS):
        assert tok.token_to_id(name) == i, name
    for digit in "0123456789":  # every digit is one token, and no token holds a digit beside others
        assert tok.encode(digit, add_special_tokens=False).tokens == [digit], digit
    assert not [t for t in tok.get_vocab() if len(t) > 1 and any(c.isdigit() for c in t)]
    tok.save(str(out / "tokenizer.json"))
    write_config(out, args.max_length)

    sample = problems[0]
    ids = tok.encode(sample).ids
    assert tok.decode(ids, skip_special_tokens=True) == sample
    prose_tokens = sum(len(e.ids) for e in tok.encode_batch(prose[:200]))
    prose_chars = sum(len(t) for t in prose[:200])
    print(f"train_demo_tokenizer: vocab {tok.get_vocab_size()}, a problem is {len(ids)} tokens, "
          f"prose {prose_chars / prose_tokens:.2f} chars/token -> {out / 'tokenizer.json'}")


if __name__ == "__main__":
    main()
