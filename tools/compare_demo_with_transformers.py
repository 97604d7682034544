#!/usr/bin/env python3
"""Issue 8, acceptance 4: Hugging Face transformers, loading the same files as nibble, gives the same
bf16 logits. For a few prompts: the ids from the `tokenizers` package (checked against `nibble
tokenize`), every position's logits from `nibble logits --quantization none` and from transformers'
MixtralForCausalLM in bf16 (and, as a second reference, bf16 weights with float32 math); prints the
relative L2 distance per prompt and fails (exit 1) above the bound.

  .venv-tools/bin/python tools/compare_demo_with_transformers.py --nibble build/nibble
  python3 tools/compare_demo_with_transformers.py --nibble build/nibble --device cuda   # GPU machine
  python3 tools/compare_demo_with_transformers.py --nibble build/nibble --device cuda --nibble-device cpu
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch
from tokenizers import Tokenizer

PROMPTS = [
    "Question: Jack buys 9 packs of shells. Each pack has 4 shells. He gives away 16 shells. How many "
    "shells does Jack have left?\nAnswer: 9 * 4 = 36. 36 - 16 = 20. The answer is 20.",
    "Question: A train travels 15 miles each hour for 8 hours and then 98 more miles. How many miles "
    "does the train travel in all?\nAnswer:",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
    "in want of a wife.",
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep.",
]


def nibble(binary, *args):
    r = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compare_demo_with_transformers: nibble {args[0]} failed:\n{r.stderr}")
    return r.stdout


def rel_l2(got, ref):
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nibble", default="build/nibble", help="the nibble binary")
    p.add_argument("--model-path", default="models/demo-moe")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="for torch, and nibble unless --nibble-device")
    p.add_argument("--nibble-device", choices=["cpu", "cuda"], help="nibble's backend (default: --device)")
    p.add_argument("--bound", type=float, default=1e-2, help="largest relative L2 distance allowed")
    args = p.parse_args()
    from transformers import MixtralForCausalLM

    model_dir = pathlib.Path(args.model_path)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    device = torch.device(args.device)
    models = {"bf16": MixtralForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device).eval(),
              "fp32 math": MixtralForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()}
    worst, rows = 0.0, []
    with tempfile.TemporaryDirectory() as tmp:
        for i, prompt in enumerate(PROMPTS):
            ids = tok.encode(prompt).ids
            nibble_ids = json.loads(nibble(args.nibble, "tokenize", "--model-path", model_dir, "--text", prompt))
            if nibble_ids != ids:
                sys.exit(f"compare_demo_with_transformers: prompt {i}: nibble tokenize {nibble_ids} != tokenizers {ids}")
            out = pathlib.Path(tmp) / f"{i}.npy"
            nibble(args.nibble, "logits", "--model-path", model_dir, "--ids", ",".join(map(str, ids)), "--out", out,
                   "--quantization", "none", "--device", args.nibble_device or args.device)
            got = np.load(out).astype(np.float64)  # (T, vocab)
            row = {"prompt": i, "tokens": len(ids)}
            with torch.no_grad():
                for name, model in models.items():
                    ref = model(input_ids=torch.tensor([ids], device=device)).logits[0].double().cpu().numpy()
                    row[name] = rel_l2(got, ref)
                    row[f"{name} worst position"] = max(rel_l2(g, r) for g, r in zip(got, ref))
                    row[f"{name} argmax agree"] = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
                    worst = max(worst, row[name])
            rows.append(row)
            print(json.dumps(row))
    print(json.dumps({"model": str(model_dir), "device": args.device, "nibble_device": args.nibble_device or args.device,
                      "prompts": len(rows),
                      "worst_rel_l2": worst, "bound": args.bound, "ok": worst <= args.bound}))
    if worst > args.bound:
        sys.exit(1)


if __name__ == "__main__":
    main()
