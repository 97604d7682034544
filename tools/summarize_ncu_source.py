#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction: reads the CSV that
`ncu --import REPORT --page source --csv --print-source sass` prints (one row per SASS instruction with
its warp-stall samples) and prints the sampled stalls summed by opcode and the hottest instructions.

    tools/summarize_ncu_source.py source.csv [--top 40]

Columns are found by name (they vary between Nsight Compute versions): the SASS text ("Source"), the
samples of all warps ("Warp Stall Sampling (All Samples)" or the like) and, where present, the samples
of warps that did not issue. With no such columns the header is printed, so the call still shows what
came back.
"""
import argparse
import collections
import csv
import io
import sys


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    text = open(args.csv, encoding="utf-8", errors="replace").read()
    # ncu prints a few "==PROF==" lines and a "Kernel Name" row before the table's header.
    start = text.find('"Address"')
    if start < 0:
        start = max(text.find('"'), 0)
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    if not rows:
        print("no rows in", args.csv)
        return 1
    columns = list(rows[0].keys())
    source = next((c for c in columns if c.strip().lower() in ("source", "sass")), None)
    samples = next((c for c in columns if "sampling" in c.lower() and "all" in c.lower()), None)
    no_issue = next((c for c in columns if "sampling" in c.lower() and "not" in c.lower()), None)
    if source is None or samples is None:
        print("columns:", columns)
        return 1
    total = sum(number(r[samples]) for r in rows) or 1.0
    by_opcode = collections.Counter()
    for r in rows:
        opcode = r[source].split()[0] if r[source].split() else "?"
        if opcode.startswith("@"):  # a predicate guard
            opcode = r[source].split()[1] if len(r[source].split()) > 1 else opcode
        by_opcode[opcode.split(".")[0]] += number(r[samples])
    print(f"{len(rows)} instructions, {total:.0f} samples ({samples})")
    print("samples by opcode:")
    for opcode, n in by_opcode.most_common(25):
        print(f"  {opcode:<12} {n:10.0f} {100 * n / total:5.1f}%")
    print(f"hottest {args.top} instructions (address: samples, % of all{', not issued' if no_issue else ''}):")
    hot = sorted(range(len(rows)), key=lambda i: -number(rows[i][samples]))[: args.top]
    for i in sorted(hot):
        r = rows[i]
        extra = f" {number(r[no_issue]):8.0f}" if no_issue else ""
        print(f"  {i:5d} {number(r[samples]):8.0f} {100 * number(r[samples]) / total:5.1f}%{extra}  {r[source][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
