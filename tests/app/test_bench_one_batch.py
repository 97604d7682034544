#!/usr/bin/env python3
"""`nibble bench-one-batch`, `nibble plan` and `--load-format dummy` on the CPU backend.

bench-one-batch runs on the tiny fixtures (real and dummy weights); its JSON must hold SGLang's
figures and agree with itself (throughput = batch / latency, totals = sums, the roofline = bytes over
the measured bandwidth), its bytes per decode step must equal a count made here from config.json, and
greedy decoding must not depend on the batch. `nibble plan` is checked on the full-size example configs
against weight sizes worked out here, and the acceptance cases (Grok-1 W4A8 fits 2 H200s, not one;
Mixtral-8x22B bf16 does not fit one H200, W4A8 does).

Usage: test_bench_one_batch.py PATH_TO_NIBBLE   (from the repository root; standard library only)
"""
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import unittest

from cli_checks import assert_fails_clearly

NIBBLE = None
MIXTRAL = pathlib.Path("tests/fixtures/tiny-mixtral")
GROK = pathlib.Path("tests/fixtures/tiny-grok1")
GB = 2 ** 30


def run(*args):
    return subprocess.run([NIBBLE, *map(str, args)], capture_output=True, text=True, timeout=300)


def config_of(model):
    return json.loads((pathlib.Path(model) / "config.json").read_text())


def weight_bytes(fmt, rows, cols):
    """One (rows, cols) weight with its F32 per-row scale when quantized."""
    return {"bf16": rows * cols * 2, "fp8": rows * cols + rows * 4, "int4": rows * cols // 2 + rows * 4}[fmt]


def formats(quantization):
    return {"none": ("bf16", "bf16"), "fp8": ("fp8", "fp8"), "quark_int4fp8_moe": ("fp8", "int4")}[quantization]


def shape(c):
    experts = c.get("num_local_experts", c.get("num_experts"))
    head_dim = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    norms = 4 if c["model_type"] == "grok-1" else 2
    return experts, head_dim, norms


def layer_bytes(c, quantization, tp=1, active_experts=None):
    """Bytes of one layer on one GPU: attention split by heads, experts along their intermediate dim."""
    attention, expert = formats(quantization)
    E, D, norms = shape(c)
    H, I = c["hidden_size"], c["intermediate_size"] // tp
    q, kv = c["num_attention_heads"] // tp, max(1, c["num_key_value_heads"] // tp)
    one_expert = weight_bytes(expert, 2 * I, H) + weight_bytes(expert, H, I)
    return (weight_bytes(attention, (q + 2 * kv) * D, H) + weight_bytes(attention, H, q * D) + E * H * 2
            + norms * H * 2 + one_expert * (E if active_experts is None else active_experts))


def model_bytes(c, quantization, tp=1):
    # embed_tokens and lm_head (a tied one is its own copy) whole on every rank, the final norm
    V, H = c["vocab_size"], c["hidden_size"]
    return 2 * V * H * 2 + H * 2 + c["num_hidden_layers"] * layer_bytes(c, quantization, tp)


def kv_bytes_per_token(c, kv_dtype, tp=1):
    _, D, _ = shape(c)
    return c["num_hidden_layers"] * 2 * max(1, c["num_key_value_heads"] // tp) * D * (1 if kv_dtype == "fp8_e4m3" else 2)


class BenchOneBatch(unittest.TestCase):
    def bench(self, model, *extra, batch=3, input_len=20, output_len=6):
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "bench.json"
            r = run("bench-one-batch", "--model-path", model, "--batch-size", batch, "--input-len", input_len,
                    "--output-len", output_len, "--json", out, "--device", "cpu", *extra)
            self.assertEqual(r.returncode, 0, r.stderr)
            for line in ["Prefill. latency:", "Decode 0. Batch size:", "Decode.  median latency:", "Total. latency:",
                         "Roofline."]:
                self.assertIn(line, r.stdout)
            return json.loads(out.read_text())

    def check_consistent(self, d, model, quantization, kv_dtype, batch, input_len, output_len):
        close = lambda a, b: self.assertAlmostEqual(a, b, delta=1e-9 * max(abs(a), abs(b), 1.0))
        c = config_of(model)
        self.assertEqual((d["batch_size"], d["input_len"], d["output_len"]), (batch, input_len, output_len))
        self.assertEqual((d["quantization"], d["kv_cache_dtype"], d["device"]), (quantization, kv_dtype, "cpu"))
        close(d["prefill_throughput"], batch * input_len / d["prefill_latency"])
        steps = d["decode"]
        self.assertEqual(len(steps), output_len - 1)
        for s in steps:
            self.assertGreater(s["latency"], 0)
            close(s["throughput"], batch / s["latency"])
            close(s["bytes_read"], s["weight_bytes"] + s["kv_bytes"])
            close(s["roofline_latency"], s["bytes_read"] / (d["copy_bandwidth_gb_per_s"] * 1e9))
            close(s["roofline_ratio"], s["latency"] / s["roofline_latency"])
            close(s["achieved_gb_per_s"], s["bytes_read"] / s["latency"] / 1e9)
        latencies = [s["latency"] for s in steps]
        close(d["median_decode_latency"], statistics.median(latencies))
        close(d["median_decode_throughput"], batch / d["median_decode_latency"])
        close(d["median_decode_roofline_ratio"], statistics.median(s["roofline_ratio"] for s in steps))
        close(d["total_latency"], d["prefill_latency"] + sum(latencies))
        close(d["overall_throughput"], batch * (input_len + output_len) / d["total_latency"])
        self.assertEqual(d["bandwidth_source"], "host memcpy")
        self.assertGreater(d["copy_bandwidth_gb_per_s"], 0.1)

        # Bytes per decode step, counted here: uniform routing leaves E·(1 − (1 − k/E)^batch) experts active.
        E, k = shape(c)[0], c["num_experts_per_tok"]
        active = E * (1 - (1 - k / E) ** batch)
        self.assertAlmostEqual(d["expected_active_experts"], active, places=9)
        H = c["hidden_size"]
        weights = (batch * H * 2 + c["vocab_size"] * H * 2 + H * 2
                   + c["num_hidden_layers"] * layer_bytes(c, quantization, active_experts=active))
        for i, s in enumerate(steps):
            self.assertAlmostEqual(s["weight_bytes"], weights, delta=c["num_hidden_layers"])  # rounding per layer
            context = batch * (input_len + 1 + i)
            self.assertEqual(s["kv_bytes"], context * kv_bytes_per_token(c, kv_dtype))
        self.assertEqual([len(o) for o in d["output_ids"]], [output_len] * batch)
        self.assertTrue(all(0 <= t < c["vocab_size"] for o in d["output_ids"] for t in o))

    def test_real_weights_every_scheme(self):
        for quantization, kv in [("none", "bf16"), ("fp8", "fp8_e4m3"), ("quark_int4fp8_moe", "fp8_e4m3")]:
            with self.subTest(quantization=quantization):
                d = self.bench(MIXTRAL, "--quantization", quantization, "--kv-cache-dtype", kv)
                self.check_consistent(d, MIXTRAL, quantization, kv, 3, 20, 6)
                self.assertEqual(d["load_format"], "auto")

    def test_dummy_weights(self):
        for model in [MIXTRAL, GROK]:
            with self.subTest(model=str(model)):
                d = self.bench(model, "--load-format", "dummy", "--quantization", "quark_int4fp8_moe", batch=2,
                               input_len=9, output_len=5)
                self.check_consistent(d, model, "quark_int4fp8_moe", "bf16", 2, 9, 5)
                self.assertEqual(d["load_format"], "dummy")

    def test_dummy_needs_only_the_config(self):
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(MIXTRAL / "config.json", tmp)
            d = self.bench(tmp, "--load-format", "dummy", batch=1, input_len=4, output_len=3)
            self.check_consistent(d, MIXTRAL, "none", "bf16", 1, 4, 3)
            # A real tokenizer beside dummy weights: generate runs end to end.
            r = run("generate", "--model-path", tmp, "--load-format", "dummy", "--tokenizer-path", MIXTRAL,
                    "--prompt", "Question:", "--max-new-tokens", 4)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith("Question:"), r.stdout)
            self.assertIn("dummy weights: layer 3/3", r.stderr)
            r = run("generate", "--model-path", tmp, "--load-format", "dummy", "--prompt", "hi")
            self.assertEqual(r.returncode, 1)
            self.assertIn("tokenizer.json", r.stderr)

    def test_batching_does_not_change_greedy_tokens(self):
        # Prompts come from one seeded stream, so sequence 0 has the same prompt in both batches.
        one = self.bench(MIXTRAL, batch=1, input_len=12, output_len=8)
        four = self.bench(MIXTRAL, batch=4, input_len=12, output_len=8)
        self.assertEqual(one["output_ids"][0], four["output_ids"][0])
        other_seed = self.bench(MIXTRAL, "--seed", 3, batch=1, input_len=12, output_len=8)
        self.assertNotEqual(one["output_ids"], other_seed["output_ids"])

    def test_chunked_prefill_gives_the_same_tokens(self):
        # Leaving almost no memory beyond the weights and KV cache forces the prefill into 16-token
        # chunks (sequences split across steps); greedy tokens must not change.
        whole = self.bench(MIXTRAL, batch=3, input_len=20, output_len=6)
        chunked = self.bench(MIXTRAL, "--mem-fraction-static", 0.99999, batch=3, input_len=20, output_len=6)
        self.assertEqual(whole["prefill_steps"], 1)
        self.assertEqual(chunked["prefill_steps"], 4)  # 60 tokens in steps of 16
        self.assertEqual(whole["output_ids"], chunked["output_ids"])
        self.check_consistent(chunked, MIXTRAL, "none", "bf16", 3, 20, 6)

    def assertFailsClearly(self, r, *needles):
        assert_fails_clearly(self, r, *needles)

    def test_errors(self):
        base = ["bench-one-batch", "--model-path", MIXTRAL, "--batch-size", 2, "--output-len", 4]
        self.assertFailsClearly(run(*base, "--input-len", 20, "--max-total-tokens", 16), "--max-total-tokens 16",
                                "64 tokens")
        self.assertFailsClearly(run(*base, "--input-len", 510), "context of 512")
        self.assertFailsClearly(run(*base, "--input-len", 8, "--mem-fraction-static", 1e-9), "does not fit",
                                "the weights alone need")
        self.assertFailsClearly(run(*base, "--input-len", 8, "--load-format", "npz"), "--load-format npz")
        self.assertFailsClearly(run("bench-one-batch", "--model-path", "configs/qwen3-30b-a3b", "--load-format",
                                    "dummy"), "qwen3_moe")


class Plan(unittest.TestCase):
    def plan(self, model, quantization, tp, *extra):
        r = run("plan", "--model-path", model, "--quantization", quantization, "--tp-size", tp, *extra)
        self.assertIn(r.returncode, (0, 1), r.stderr)
        verdict = r.stdout.strip().splitlines()[-1]
        return r, verdict

    def weights_gb(self, verdict):
        return float(re.search(r"([0-9.]+) GB (?:of weights|per GPU)", verdict).group(1))

    def test_acceptance_cases(self):
        r, verdict = self.plan("configs/grok-1", "quark_int4fp8_moe", 1, "--kv-cache-dtype", "fp8_e4m3")
        self.assertEqual(r.returncode, 1)
        self.assertTrue(verdict.startswith("does not fit"), verdict)
        self.assertIn("--tp-size 2 fits", verdict)
        self.assertIn("nibble: error: grok-1 does not fit", r.stderr)
        r, verdict = self.plan("configs/grok-1", "quark_int4fp8_moe", 2, "--kv-cache-dtype", "fp8_e4m3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(verdict.startswith("fits"), verdict)
        r, verdict = self.plan("configs/mixtral-8x22b", "none", 1)
        self.assertEqual(r.returncode, 1)
        self.assertIn("the weights alone need", verdict)
        r, verdict = self.plan("configs/mixtral-8x22b", "quark_int4fp8_moe", 1)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_weights_match_a_count_from_the_config(self):
        for model in ["configs/mixtral-8x7b", "configs/mixtral-8x22b", "configs/grok-1"]:
            c = config_of(model)
            for quantization in ["none", "fp8", "quark_int4fp8_moe"]:
                for tp in [1, 2, 8]:
                    with self.subTest(model=model, quantization=quantization, tp=tp):
                        _, verdict = self.plan(model, quantization, tp, "--gpu-memory-gb", 10000)
                        self.assertAlmostEqual(self.weights_gb(verdict), model_bytes(c, quantization, tp) / GB,
                                               delta=0.006)

    def test_kv_capacity_and_gpu_size(self):
        c = config_of("configs/mixtral-8x7b")
        r, verdict = self.plan("configs/mixtral-8x7b", "quark_int4fp8_moe", 1, "--kv-cache-dtype", "fp8_e4m3",
                               "--gpu-memory-gb", 80, "--mem-fraction-static", 0.9)
        self.assertEqual(r.returncode, 0, r.stderr)
        budget = int(80 * GB * 0.9)
        tokens = (budget - model_bytes(c, "quark_int4fp8_moe")) // kv_bytes_per_token(c, "fp8_e4m3")
        self.assertIn(f"room for {tokens} tokens", verdict)
        r, verdict = self.plan("configs/mixtral-8x7b", "quark_int4fp8_moe", 1, "--max-total-tokens", 10 ** 9)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--max-total-tokens 1000000000", verdict)

    def test_planning_only_architectures(self):
        for model, tp in [("configs/qwen3-30b-a3b", 1), ("configs/deepseek-v3", 4)]:
            with self.subTest(model=model):
                r, verdict = self.plan(model, "quark_int4fp8_moe", tp)
                self.assertEqual(r.returncode, 0, r.stderr)
        r, verdict = self.plan("configs/deepseek-v3", "auto", 1)
        self.assertIn("--quantization fp8", r.stdout)  # its quantization_config
        self.assertEqual(r.returncode, 1)
        r = run("plan", "--model-path", "configs/grok-1", "--tp-size", 3)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not divisible by --tp-size 3", r.stderr)


if __name__ == "__main__":
    NIBBLE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
