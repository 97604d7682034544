#!/usr/bin/env python3
"""Sums the kernel times of an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum`) by
kernel name: calls, total µs, share of the sum, µs per call; largest first. scripts/gpu-check's
`profile` mode runs it on one decode step of `nibble bench-one-batch`."""
import argparse
import collections
import csv
import io
import re
import sys


def short_name(name: str) -> str:
    name = re.sub(r"\(.*$", "", name)  # parameter list
    name = re.sub(r"^void ", "", name)
    return name if len(name) <= 90 else name[:87] + "..."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv_file")
    args = ap.parse_args()
    text = open(args.csv_file, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')  # ncu prints its own lines before the table
    if start < 0:
        print("no ncu table in", args.csv_file)
        return 1
    totals = collections.defaultdict(float)
    calls = collections.Counter()
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "")
        scale = {"ns": 1e-3, "nsecond": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
        name = short_name(row["Kernel Name"])
        totals[name] += value * scale
        calls[name] += 1
    total = sum(totals.values())
    print(f"{sum(calls.values())} kernels, {total:.1f} µs in all")
    print(f"{'µs':>9} {'share':>6} {'calls':>5} {'µs/call':>8}  kernel")
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{us:9.1f} {100 * us / total:5.1f}% {calls[name]:5d} {us / calls[name]:8.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
