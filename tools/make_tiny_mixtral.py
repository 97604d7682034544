#!/usr/bin/env python3
"""Makes tests/fixtures/tiny-mixtral: a tiny random Mixtral in Hugging Face format (sharded bf16
safetensors, config.json, a Metaspace + byte-fallback BPE tokenizer.json trained on a built-in text)
and its float32 reference logits from Hugging Face transformers.

Run with the tools venv (scripts/install-tools): .venv-tools/bin/python tools/make_tiny_mixtral.py
"""
import argparse
import json
import pathlib

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import MixtralConfig, MixtralForCausalLM

TEXT = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of
foolishness. Question: Tom has 3 apples and buys 4 more. How many apples does he have? Answer: 7
Question: A train travels 60 miles in 2 hours. What is its speed? Answer: 30 miles per hour.
In the beginning the river ran quietly past the old mill, and the miller's daughter sang as she
worked. The weather was fine and the fields were green; the village children played by the water.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 12345. Café, naïve, résumé, 東京, 😀.
"""

PROMPT = "The quick brown fox jumps over the lazy dog. Question: Tom has 3 apples and buys 4 more."


def make_tokenizer(vocab_size):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials + byte_tokens,
                                  initial_alphabet=[], show_progress=False)
    tok.train_from_iterator(TEXT.splitlines(keepends=True) * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


def make_model(out, seed):
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors"):
        old.unlink()
    torch.manual_seed(seed)

    tok = make_tokenizer(vocab_size=512)
    assert tok.token_to_id("<s>") == 1 and tok.token_to_id("</s>") == 2
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False, "model_max_length": 512,
        "tokenizer_class": "LlamaTokenizerFast"}, indent=2) + "\n")

    config = MixtralConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-5,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.08)
    model = MixtralForCausalLM(config).eval()
    # Norm weights away from 1 so that a loader ignoring them fails the test.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="200KB")

    # Reference: the bf16 weights, computed in float32.
    ref = MixtralForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = tok.encode(PROMPT).ids
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].float().numpy()
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return ref, ids, logits, float((top2[:, 1] - top2[:, 0]).min())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="tests/fixtures/tiny-mixtral")
    parser.add_argument("--seed", type=int, default=1539)
    parser.add_argument("--min-margin", type=float, default=0.04,
                        help="retry seeds until every position's top-1 logit leads by this much, so "
                             "that the argmax comparison tests the engine, not rounding noise")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    seed = args.seed
    while True:
        ref, ids, logits, margin = make_model(out, seed)
        if margin >= args.min_margin:
            break
        seed += 1
    with torch.no_grad():
        generated = ref.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                 min_new_tokens=32)[0, len(ids):].tolist()
    np.save(out.parent / "tiny-mixtral-logits.npy", logits.astype(np.float32))
    (out.parent / "tiny-mixtral-reference.json").write_text(json.dumps({
        "prompt": PROMPT, "ids": ids, "greedy_32": generated,
        "seed": seed, "min_top1_margin": margin}, indent=2) + "\n")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({size / 1e6:.2f} MB), {len(ids)} prompt ids, logits {logits.shape}, "
          f"seed {seed}, min top-1 margin {margin:.4f}")


if __name__ == "__main__":
    main()
