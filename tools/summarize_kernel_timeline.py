#!/usr/bin/env python3
"""Where one decode step's time goes with the kernels overlapping (programmatic dependent launch):
reads a kernel trace of `nibble bench-one-batch` (CSV with "Start (ns)", "Duration (ns)" and "Name"
columns, and "Device" where several GPUs ran: bench/kernel_trace.cc writes one, as does `nsys stats --report cuda_gpu_trace --format csv`
on a trace taken with `--cuda-graph-trace=node`), cuts the kernels into decode steps at each embedding
kernel, and for step --step (by default the last but one) prints, by kernel (and its place in a layer), the time it moves the
step's end on: its end minus the latest end before it (zero when it ends inside an earlier kernel),
its own duration, and the gap before it started (idle GPU). scripts/gpu-check's `timeline` mode runs it.

    tools/summarize_kernel_timeline.py trace.csv [--step -2] [--layer 10] [--device 0]

--layer also lists that layer's kernels one by one (a layer starts at each RMSNorm, or tensor
parallelism's all-reduce + add + RMSNorm, that follows a combine, or at the step's first RMSNorm).
--device keeps one GPU's kernels (tensor parallelism: each rank's GPU runs a step of its own)."""
import argparse
import collections
import csv
import io
import re
import sys


def short_name(name: str) -> str:
    name = re.sub(r"nibble::(cuda::)?(<unnamed>|\(anonymous namespace\))::", "", name)
    name = re.sub(r"\(.*$", "", name)
    name = re.sub(r"^void ", "", name)
    return name if len(name) <= 60 else name[:57] + "..."


def trace_table(path):
    """The kernel trace's table in `path` as a csv.DictReader (after any lines before its header), or
    None where there is none."""
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find("Start")
    if start < 0:
        return None
    start = text.rfind("\n", 0, start) + 1
    return csv.DictReader(io.StringIO(text[start:]))


def column(fields, prefix):
    for f in fields:
        if f.strip('"').startswith(prefix):
            return f
    raise KeyError(prefix)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv_file")
    ap.add_argument("--step", type=int, default=-2,
                    help="which step, counted from 0 over the whole run (warm-up and graph captures included); "
                    "negative counts from the end: -2, the last step but one, is a replayed decode step")
    ap.add_argument("--layer", type=int, default=10)
    ap.add_argument("--device", type=int, default=0, help="the GPU whose kernels count, where the trace has a Device column")
    args = ap.parse_args()
    reader = trace_table(args.csv_file)
    if reader is None:
        print("no trace table in", args.csv_file)
        return 1
    f_start, f_dur, f_name = column(reader.fieldnames, "Start"), column(reader.fieldnames, "Duration"), column(
        reader.fieldnames, "Name")
    f_device = next((f for f in reader.fieldnames if f.strip('"').startswith("Device")), None)
    kernels = []
    for row in reader:
        if f_device is not None and row[f_device].strip() != str(args.device):
            continue
        try:
            s, d = float(row[f_start].replace(",", "")), float(row[f_dur].replace(",", ""))
        except (ValueError, AttributeError):
            continue
        name = row[f_name]
        if "[CUDA mem" in name or "memcpy" in name.lower() or "memset" in name.lower():
            continue
        kernels.append((s, s + d, short_name(name)))
    kernels.sort()
    # Steps: each embedding kernel starts one (the prefill's first, then every decode step's).
    starts = [i for i, k in enumerate(kernels) if k[2].startswith("embedding_kernel")]
    segments = list(zip(starts, starts[1:] + [len(kernels)]))
    if not -len(segments) <= args.step < len(segments):
        print(f"{len(segments)} steps (embedding kernels): no step {args.step}")
        return 1
    first, last = segments[args.step]
    step = kernels[first:last]
    wall = max(e for _, e, _ in step) - step[0][0]
    # Each kernel's place in its layer: the n-th call of that name since the layer's first RMSNorm.
    layer, seen, labels, layer_of = 0, collections.Counter(), [], []
    prev = ""
    for _, _, name in step:
        if (name.startswith("rms_norm") or name.startswith("p2p_all_reduce_add_rms_norm")) and (
                prev.startswith("combine") or prev.startswith("embedding")):
            layer += 1
            seen.clear()
        seen[name] += 1
        labels.append(f"{name} #{seen[name]}")
        layer_of.append(layer)
        prev = name
    exposed, own, gap = (collections.defaultdict(float) for _ in range(3))
    calls = collections.Counter()
    latest = step[0][0]
    rows = []
    for (s, e, _), label, lay in zip(step, labels, layer_of):
        x = max(0.0, e - latest)
        g = max(0.0, s - latest)
        exposed[label] += x
        own[label] += e - s
        gap[label] += g
        calls[label] += 1
        if lay == args.layer:
            rows.append((label, s, e, x, g))
        latest = max(latest, e)
    total = sum(exposed.values())
    print(f"step {args.step}: {len(step)} kernels, {wall / 1e3:.1f} µs from the first start to the last end")
    print(f"{'exposed µs':>10} {'share':>6} {'own µs':>8} {'idle µs':>8} {'calls':>5}  kernel #place in layer")
    for label, x in sorted(exposed.items(), key=lambda kv: -kv[1]):
        print(f"{x / 1e3:10.1f} {100 * x / total:5.1f}% {own[label] / 1e3:8.1f} {gap[label] / 1e3:8.1f} {calls[label]:5d}  {label}")
    if rows:
        print(f"\nlayer {args.layer}, kernel by kernel (µs from the layer's first start):")
        print(f"{'start':>8} {'end':>8} {'own':>7} {'exposed':>8} {'idle':>6}  kernel")
        t0 = rows[0][1]
        for label, s, e, x, g in rows:
            print(f"{(s - t0) / 1e3:8.2f} {(e - t0) / 1e3:8.2f} {(e - s) / 1e3:7.2f} {x / 1e3:8.2f} {g / 1e3:6.2f}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
