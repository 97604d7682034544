#!/usr/bin/env python3
"""`nibble eval` as a user runs it. On the tiny Mixtral fixture (random weights, so accuracy means
nothing): perplexity against the value computed from Hugging Face's reference logits, the arithmetic
pipeline's scoring and answer extraction re-derived here from its per-item output, and bad input.
On the trained demo model (models/demo-moe, skipped while it is absent): W4A8 (with and without the
FP8 KV cache) against bf16 on a subset of the held-out sets, within the bounds measured on the full
sets (README, "The demo model").

Usage: test_eval.py PATH_TO_NIBBLE   (from the repository root; standard library only)
"""
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import unittest

from cli_checks import assert_fails_clearly, read_npy_f32

NIBBLE = None
TINY = pathlib.Path("tests/fixtures/tiny-mixtral")
REFERENCE = json.loads(pathlib.Path("tests/fixtures/tiny-mixtral-reference.json").read_text())
DEMO = pathlib.Path("models/demo-moe")

# The demo-model check: W4A8 with the FP8 KV cache (the scheme nibble is for) against bf16 on the first
# problems and passages of the held-out sets, small enough for about 30 s on two cores.
DEMO_PROBLEMS = 40
DEMO_PASSAGES = 8
DEMO_MIN_BF16_ACCURACY = 0.95  # 100.0% on the full set (README)
# |W4A8 - bf16| accuracy, paired (same problems). The full set measured -0.2 points (2 answers of 1000
# changed, neither among these 40); issue 8 allows 1 point, so no answer here may change.
DEMO_MAX_ACCURACY_GAP = 0.01
# W4A8 / bf16 perplexity: 1.0111 on the full set, 1.0096 on this subset (CPU); issue 8 allows 1.02. Above
# 1.001 too, so that a W4A8 run that silently stayed in bf16 fails.
DEMO_PERPLEXITY_RATIO = (1.001, 1.015)


def run(*args):
    return subprocess.run([NIBBLE, *map(str, args)], capture_output=True, text=True, timeout=600)


def eval_json(*args):
    r = run("eval", *args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    return json.loads(lines[0]), r.stderr


def reference_nll(ids, logits):
    """Sum of -log softmax(logits[t])[ids[t + 1]]: what eval's perplexity task computes."""
    total = 0.0
    for t in range(len(ids) - 1):
        row = logits[t]
        peak = max(row)
        total += peak + math.log(sum(math.exp(v - peak) for v in row)) - row[ids[t + 1]]
    return total


def final_integer(text):
    """The demo answer format's prediction (tools/make_demo_corpus.py extract_final_number)."""
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


class Tiny(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = pathlib.Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def write_jsonl(self, name, items):
        path = self.dir / name
        path.write_text("".join(json.dumps(item) + "\n" for item in items))
        return path

    def test_perplexity_matches_transformers(self):
        data = self.write_jsonl("prose.jsonl", [{"text": REFERENCE["prompt"]}])
        got, stderr = eval_json("--model-path", TINY, "--task", "perplexity", "--data", data)
        ids = REFERENCE["ids"]  # the prompt's encoding, BOS first
        nll = reference_nll(ids, read_npy_f32("tests/fixtures/tiny-mixtral-logits.npy"))
        self.assertEqual(got["task"], "perplexity")
        self.assertEqual(got["n"], 1)
        self.assertEqual(got["tokens"], len(ids) - 1)
        self.assertAlmostEqual(got["perplexity"] / math.exp(nll / (len(ids) - 1)), 1.0, delta=1e-2)
        self.assertIn("eval perplexity: 1/1", stderr)

    def test_perplexity_sums_over_passages(self):
        texts = ["It is a truth universally acknowledged.", "In the beginning God created the heaven and the earth."]
        data = self.write_jsonl("prose.jsonl", [{"text": t} for t in texts])
        details = self.dir / "details.jsonl"
        got, _ = eval_json("--model-path", TINY, "--task", "perplexity", "--data", data, "--details", details)
        items = [json.loads(line) for line in details.read_text().splitlines()]
        self.assertEqual(len(items), 2)
        self.assertEqual(got["tokens"], sum(i["tokens"] for i in items))
        self.assertAlmostEqual(got["perplexity"], math.exp(sum(i["nll"] for i in items) / got["tokens"]), places=6)
        one, _ = eval_json("--model-path", TINY, "--task", "perplexity", "--data", data, "--limit", "1")
        self.assertEqual((one["n"], one["tokens"]), (1, items[0]["tokens"]))
        self.assertAlmostEqual(math.log(one["perplexity"]) * one["tokens"], items[0]["nll"], places=6)

    def test_arithmetic_scoring(self):
        problems = [json.loads(line) for line in
                    (DEMO / "eval" / "arithmetic.jsonl").read_text().splitlines()[:12]]
        data = self.write_jsonl("problems.jsonl", problems)
        details = self.dir / "details.jsonl"
        got, stderr = eval_json("--model-path", TINY, "--task", "arithmetic", "--data", data,
                                "--max-new-tokens", "12", "--details", details, "--max-running-requests", "5")
        items = [json.loads(line) for line in details.read_text().splitlines()]
        self.assertEqual(len(items), 12)
        self.assertEqual(got["n"], 12)
        self.assertIn("eval arithmetic: 12/12", stderr)
        for problem, item in zip(problems, items):
            self.assertEqual(item["question"], problem["question"])
            self.assertEqual(item["prediction"], final_integer(item["generated"]))
            self.assertEqual(item["correct"], item["prediction"] == problem["answer"])
        self.assertEqual(got["correct"], sum(i["correct"] for i in items))
        # Batched greedy answers are what `nibble generate` writes for the same prompt, alone.
        prompt = f"Question: {problems[3]['question']}\nAnswer:"
        r = run("generate", "--model-path", TINY, "--prompt", prompt, "--max-new-tokens", "12")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith(prompt) and r.stdout.endswith("\n"), r.stdout)
        self.assertEqual(r.stdout[len(prompt):-1], items[3]["generated"])
        # Set each answer to what the model predicted: every problem with a prediction is now correct.
        for problem, item in zip(problems, items):
            problem["answer"] = item["prediction"] if item["prediction"] is not None else -12345
        rigged = self.write_jsonl("rigged.jsonl", problems)
        again, _ = eval_json("--model-path", TINY, "--task", "arithmetic", "--data", rigged, "--max-new-tokens", "12")
        self.assertEqual(again["correct"], sum(i["prediction"] is not None for i in items))
        self.assertGreater(again["correct"], 0)

    def assertFailsClearly(self, result, *needles):
        assert_fails_clearly(self, result, *needles)

    def test_bad_input(self):
        ok = self.write_jsonl("ok.jsonl", [{"question": "Tom has 3 apples.", "answer": 3}])
        self.assertFailsClearly(run("eval", "--model-path", TINY, "--task", "translation", "--data", ok), "translation")
        self.assertFailsClearly(run("eval", "--model-path", TINY, "--task", "arithmetic"), "arithmetic.jsonl")
        self.assertFailsClearly(run("eval", "--model-path", TINY, "--task", "arithmetic", "--data", ok, "--limit", "-1"),
                                "--limit")
        bad = self.dir / "bad.jsonl"
        bad.write_text('{"question": "a", "answer": 1}\n{"question": "b", "answer": 2\n')
        self.assertFailsClearly(run("eval", "--model-path", TINY, "--task", "arithmetic", "--data", bad), "bad.jsonl:2")
        no_answer = self.write_jsonl("no_answer.jsonl", [{"question": "a"}])
        self.assertFailsClearly(run("eval", "--model-path", TINY, "--task", "arithmetic", "--data", no_answer),
                                "no_answer.jsonl:1", "answer")
        no_text = self.write_jsonl("no_text.jsonl", [{"passage": "a"}])
        self.assertFailsClearly(run("eval", "--model-path", TINY, "--task", "perplexity", "--data", no_text), "text")
        empty = self.dir / "empty.jsonl"
        empty.write_text("\n")
        self.assertFailsClearly(run("eval", "--model-path", TINY, "--task", "perplexity", "--data", empty), "no items")


@unittest.skipUnless((DEMO / "model.safetensors").exists(),
                     "models/demo-moe/model.safetensors is absent (train it: tools/train_demo_moe.py)")
# Under AddressSanitizer the demo model's evaluation takes over ten minutes on two cores; the release
# build's ctest (make test) runs it.
@unittest.skipIf(os.environ.get("NIBBLE_SANITIZED") == "1", "sanitizer build: the release build runs this check")
class DemoModel(unittest.TestCase):
    def test_w4a8_accuracy_within_bound(self):
        base, _ = eval_json("--model-path", DEMO, "--task", "arithmetic", "--limit", DEMO_PROBLEMS)
        self.assertGreaterEqual(base["accuracy"], DEMO_MIN_BF16_ACCURACY)
        got, _ = eval_json("--model-path", DEMO, "--task", "arithmetic", "--limit", DEMO_PROBLEMS,
                           "--quantization", "quark_int4fp8_moe", "--kv-cache-dtype", "fp8_e4m3")
        self.assertEqual((got["quantization"], got["kv_cache_dtype"]), ("quark_int4fp8_moe", "fp8_e4m3"))
        self.assertLessEqual(abs(got["accuracy"] - base["accuracy"]), DEMO_MAX_ACCURACY_GAP, (base, got))

    def test_w4a8_perplexity_within_bound(self):
        base, _ = eval_json("--model-path", DEMO, "--task", "perplexity", "--limit", DEMO_PASSAGES)
        got, _ = eval_json("--model-path", DEMO, "--task", "perplexity", "--limit", DEMO_PASSAGES,
                           "--quantization", "quark_int4fp8_moe", "--kv-cache-dtype", "fp8_e4m3")
        low, high = DEMO_PERPLEXITY_RATIO
        self.assertTrue(low <= got["perplexity"] / base["perplexity"] <= high, (base, got))


if __name__ == "__main__":
    NIBBLE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
