#!/usr/bin/env python3
"""Where a replayed MoE layer's time goes, kernel by kernel: reads a kernel trace of
`nibble-bench-moe` at one token count (CSV with "Start (ns)", "Duration (ns)" and "Name" columns, as
bench/kernel_trace.cc writes), finds the sequence of kernels the run ends by repeating (the timed
replays), and prints for each kernel of it, over the last --replays repetitions, the median of its own
duration and of the time it moves the replay's end on (its end minus the latest end before it: zero when
it ends inside an earlier kernel). scripts/gpu-check's `layer-trace` mode runs it.

    tools/summarize_layer_trace.py trace.csv [--replays 10]"""
import argparse
import statistics
import sys

from summarize_kernel_timeline import column, short_name, trace_table


def period_of(names):
    """The shortest p such that the last 3·p names repeat with period p (None if there is none)."""
    for p in range(1, len(names) // 3 + 1):
        tail = names[-3 * p:]
        if all(tail[i] == tail[i + p] for i in range(2 * p)):
            return p
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv_file")
    ap.add_argument("--replays", type=int, default=10)
    args = ap.parse_args()
    reader = trace_table(args.csv_file)
    if reader is None:
        print("no trace table in", args.csv_file)
        return 1
    f_start, f_dur, f_name = (column(reader.fieldnames, c) for c in ("Start", "Duration", "Name"))
    kernels = []
    for row in reader:
        try:
            s, d = float(row[f_start]), float(row[f_dur])
        except (ValueError, TypeError):
            continue
        kernels.append((s, s + d, short_name(row[f_name])))
    kernels.sort()
    names = [k[2] for k in kernels]
    p = period_of(names)
    if p is None:
        print(f"{len(kernels)} kernels and no repeating tail")
        return 1
    replays = min(args.replays, len(kernels) // p - 1)
    own = [[] for _ in range(p)]
    exposed = [[] for _ in range(p)]
    spans = []
    for r in range(replays, 0, -1):
        first = len(kernels) - r * p
        latest = kernels[first - 1][1]  # the replay before's last end (a replay starts after it)
        begin = kernels[first][0]
        for i in range(p):
            s, e, _ = kernels[first + i]
            own[i].append(e - s)
            exposed[i].append(max(0.0, e - max(latest, begin)))
            latest = max(latest, e)
        spans.append(latest - begin)
    print(f"{p} kernels a replay; medians over the last {replays} replays; a replay spans "
          f"{statistics.median(spans) / 1e3:.1f} µs from its first start to its last end")
    print(f"{'exposed µs':>10} {'own µs':>8}  kernel")
    for i in range(p):
        print(f"{statistics.median(exposed[i]) / 1e3:10.1f} {statistics.median(own[i]) / 1e3:8.1f}  "
              f"{names[len(names) - p + i]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
