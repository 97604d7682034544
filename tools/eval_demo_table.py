#!/usr/bin/env python3
"""The README's accuracy table for the demo model: `nibble eval` (arithmetic and perplexity on the
full held-out sets) for every quantization scheme and KV cache dtype, each set against bf16 (weights
none, KV bf16): accuracy gap in points, answers that changed, perplexity ratio. Prints a Markdown table
and writes every run's JSON summary and per-item details under --out.

  python3 tools/eval_demo_table.py --nibble build/nibble [--device cuda] [--limit N] --out /tmp/evals
(standard library only, so that it runs on the GPU machine as it is)
"""
import argparse
import json
import pathlib
import subprocess
import sys

SCHEMES = [("none", "bf16"), ("none", "fp8_e4m3"), ("fp8", "bf16"), ("fp8", "fp8_e4m3"),
           ("quark_int4fp8_moe", "bf16"), ("quark_int4fp8_moe", "fp8_e4m3")]


def run_eval(args, task, quantization, kv, out):
    name = f"{task}-{quantization}-{kv}"
    details = out / f"{name}.details.jsonl"
    cmd = [args.nibble, "eval", "--model-path", args.model_path, "--task", task, "--quantization", quantization,
           "--kv-cache-dtype", kv, "--device", args.device, "--details", str(details)]
    if args.limit:
        cmd += ["--limit", str(args.limit if task == "arithmetic" else max(1, args.limit // 4))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"eval_demo_table: {' '.join(cmd)} failed:\n{r.stderr}")
    summary = json.loads(r.stdout)
    (out / f"{name}.json").write_text(json.dumps(summary) + "\n")
    items = [json.loads(line) for line in details.read_text().splitlines()]
    print(f"{name}: {json.dumps(summary)}", file=sys.stderr, flush=True)
    return summary, items


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nibble", default="build/nibble")
    p.add_argument("--model-path", default="models/demo-moe")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--limit", type=int, default=0, help="problems (passages: a quarter); 0: the full sets")
    p.add_argument("--out", default="/tmp/demo-evals")
    args = p.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    results = {}
    for quantization, kv in SCHEMES:
        results[(quantization, kv)] = (run_eval(args, "arithmetic", quantization, kv, out),
                                       run_eval(args, "perplexity", quantization, kv, out))
    (base_a, base_items), (base_p, _) = results[("none", "bf16")]
    rows = []
    print(f"\n{args.device}, {base_a['n']} problems, {base_p['n']} passages ({base_p['tokens']} tokens)\n")
    print("| weights | KV cache | accuracy | vs bf16 | answers changed | perplexity | vs bf16 |")
    print("|---|---|---|---|---|---|---|")
    for (quantization, kv), ((a, items), (ppl, _)) in results.items():
        changed = sum(x["correct"] != y["correct"] for x, y in zip(items, base_items))
        gap = 100 * (a["accuracy"] - base_a["accuracy"])
        ratio = ppl["perplexity"] / base_p["perplexity"]
        print(f"| {quantization} | {kv} | {100 * a['accuracy']:.1f}% | {gap:+.1f} | {changed} | "
              f"{ppl['perplexity']:.3f} | {100 * (ratio - 1):+.2f}% |")
        rows.append({"quantization": quantization, "kv_cache_dtype": kv, "accuracy": a["accuracy"],
                     "accuracy_gap_points": gap, "answers_changed": changed, "perplexity": ppl["perplexity"],
                     "perplexity_ratio": ratio, "arithmetic_seconds": a["seconds"],
                     "perplexity_seconds": ppl["seconds"]})
    (out / "table.json").write_text(json.dumps({"device": args.device, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
