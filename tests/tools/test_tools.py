#!/usr/bin/env python3
"""tools/summarize_kernel_timeline.py on a made-up trace whose per-kernel figures are worked out by
hand: kernels that overlap (a kernel ending inside an earlier one adds nothing), an idle gap, the
step taken by default (the last but one), the layer listing, and a trace without embedding kernels;
tools/summarize_layer_trace.py on made-up replays of a layer after a warm-up."""
import os
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "summarize_kernel_timeline.py")
LAYER_TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "summarize_layer_trace.py")

# One step, times in ns from the step's start: (start, end, name).
STEP = [
    (0, 1000, "nibble::cuda::(anonymous namespace)::embedding_kernel(int const*)"),
    (1000, 4000, "void nibble::cuda::(anonymous namespace)::rms_norm_kernel<2, float>(Args)"),
    (3000, 10000, "void nibble::cuda::(anonymous namespace)::fp8_gemv_kernel<1, 2>(Args)"),
    (5000, 8000, "void nibble::cuda::(anonymous namespace)::fp8_gemv_kernel<1, 2>(Args)"),  # inside the one before
    (12000, 15000, "void nibble::cuda::(anonymous namespace)::combine_kernel<float>(Args)"),  # 2 µs idle first
    (15000, 16000, "void nibble::cuda::(anonymous namespace)::rms_norm_kernel<2, float>(Args)"),
]


def trace(steps, offsets):
    lines = ['"Start (ns)","Duration (ns)","Name"']
    for step, base in zip(steps, offsets):
        for s, e, name in step:
            lines.append(f'{base + s},{e - s},"{name}"')
    return "\n".join(lines) + "\n"


def run(text, *args, tool=TOOL):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, tool, f.name, *args], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


def row(out, label):
    for line in out.splitlines():
        if line.rstrip().endswith(label):
            return [float(x.rstrip("%")) for x in line.split()[:4]]
    raise AssertionError(f"no row for {label!r} in:\n{out}")


class SummarizeKernelTimeline(unittest.TestCase):
    def test_exposed_own_and_idle_by_place_in_layer(self):
        # Three steps; the default (-2) is the second, whose kernels are the first's shifted by 1 ms.
        slow = [(s, e * 2, n) for s, e, n in STEP]  # a different first step, to tell them apart
        result = run(trace([slow, STEP, STEP], [0, 1_000_000, 2_000_000]), "--layer", "1")
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        self.assertIn("step -2: 6 kernels, 16.0 µs", out)
        # exposed, share, own, idle (µs): the second gemv ends inside the first and adds nothing.
        self.assertEqual(row(out, "embedding_kernel #1")[0], 1.0)
        # Both RMSNorms are the first of their layer: 3 + 1 µs.
        self.assertEqual(row(out, "rms_norm_kernel<2, float> #1"), [4.0, 25.0, 4.0, 0.0])
        self.assertEqual(row(out, "fp8_gemv_kernel<1, 2> #1"), [6.0, 37.5, 7.0, 0.0])
        self.assertEqual(row(out, "fp8_gemv_kernel<1, 2> #2"), [0.0, 0.0, 3.0, 0.0])
        self.assertEqual(row(out, "combine_kernel<float> #1"), [5.0, 31.2, 3.0, 2.0])
        # The RMSNorm after the combine starts layer 2; --layer 1 lists layer 1's four kernels.
        listing = out[out.index("layer 1, kernel by kernel"):]
        self.assertEqual(len([l for l in listing.splitlines() if "#" in l]), 4)
        self.assertNotIn("#2\n", listing.split("combine_kernel")[1])

    def test_one_device_of_a_tensor_parallel_trace(self):
        # Two GPUs: device 1's kernels twice as long, interleaved with device 0's by start time. Each
        # device's step is its own; the all-reduce + add + RMSNorm after a combine starts a layer.
        fused = "void nibble::cuda::(anonymous namespace)::p2p_all_reduce_add_rms_norm_kernel<2, true>(Args)"
        step = STEP[:-1] + [(15000, 16000, fused)]
        lines = ['"Start (ns)","Duration (ns)","Device","Name"']
        for base in (0, 1_000_000, 2_000_000):
            for s, e, name in step:
                lines.append(f'{base + s},{e - s},0,"{name}"')
                lines.append(f'{base + s + 1},{2 * (e - s)},1,"{name}"')
        text = "\n".join(lines) + "\n"
        out0 = run(text, "--layer", "1").stdout
        self.assertIn("step -2: 6 kernels, 16.0 µs", out0)
        self.assertEqual(row(out0, "combine_kernel<float> #1"), [5.0, 31.2, 3.0, 2.0])
        self.assertEqual(row(out0, "p2p_all_reduce_add_rms_norm_kernel<2, true> #1")[0], 1.0)
        listing = out0[out0.index("layer 1, kernel by kernel"):]
        self.assertEqual(len([l for l in listing.splitlines() if "#" in l]), 4)  # not the fused norm
        out1 = run(text, "--device", "1").stdout
        self.assertIn("step -2: 6 kernels", out1)
        self.assertEqual(row(out1, "embedding_kernel #1")[0], 2.0)

    def test_a_trace_without_steps_fails_clearly(self):
        result = run(trace([STEP[1:]], [0]))
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no step", result.stdout)


# A replayed layer, ns from the replay's start: C starts early (programmatic dependent launch) and
# ends 2 µs after B; the replays start 20 µs apart.
LAYER = [
    (0, 3000, "void nibble::cuda::(anonymous namespace)::route_kernel(Args)"),
    (1000, 10000, "void nibble::cuda::(anonymous namespace)::moe_gemm_kernel<16>(Args)"),
    (2000, 12000, "void nibble::cuda::(anonymous namespace)::activation_kernel(Args)"),
    (12000, 13000, "void nibble::cuda::(anonymous namespace)::combine_kernel<float>(Args)"),
]


class SummarizeLayerTrace(unittest.TestCase):
    def test_medians_of_the_repeating_tail(self):
        warm_up = [(0, 500_000, "void random_fill_kernel(Args)"), (0, 900_000, "void other_kernel(Args)")]
        replays = [[(s, e, n) for s, e, n in LAYER]] * 12
        result = run(trace([warm_up] + replays, [0] + [1_000_000 + 20_000 * i for i in range(12)]),
                     tool=LAYER_TOOL)
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        self.assertIn("4 kernels a replay; medians over the last 10 replays; a replay spans 13.0 µs", out)
        # exposed, own (µs): A 3 of its own; B ends 7 past A; C 2 past B though it ran 10; D 1.
        rows = [[float(x) for x in line.split()[:2]] for line in out.splitlines()[2:]]
        self.assertEqual(rows, [[3.0, 3.0], [7.0, 9.0], [2.0, 10.0], [1.0, 1.0]])
        self.assertTrue(out.splitlines()[3].endswith("moe_gemm_kernel<16>"))

    def test_a_trace_that_does_not_repeat_fails_clearly(self):
        result = run(trace([LAYER], [0]), tool=LAYER_TOOL)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no repeating tail", result.stdout)


if __name__ == "__main__":
    unittest.main()
