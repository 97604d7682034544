#!/usr/bin/env python3
"""`nibble quantize` as a user runs it, on the tiny Mixtral and Grok-1 fixtures: the checkpoint it
writes (config block, tokenizer files, shards), loading it with --quantization auto against online
quantization of the source, tools/check_quark_checkpoint.py's independent check of every element
(run with .venv-tools' or .venv-test's python where numpy is installed, skipped otherwise), and bad
input ending with exit status 1 and one clear line.

Usage: test_quantize.py PATH_TO_NIBBLE   (from the repository root; standard library only)
"""
import json
import math
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from cli_checks import assert_fails_clearly, read_npy_f32  # noqa: E402

NIBBLE = None
MIXTRAL = pathlib.Path("tests/fixtures/tiny-mixtral")
GROK1 = pathlib.Path("tests/fixtures/tiny-grok1")
CHECKER = pathlib.Path("tools/check_quark_checkpoint.py")
IDS = ",".join(map(str, json.loads(pathlib.Path("tests/fixtures/tiny-mixtral-reference.json").read_text())["ids"]))


def run(*args):
    return subprocess.run([NIBBLE, *map(str, args)], capture_output=True, text=True, timeout=300)


def numpy_python():
    """A python with numpy for the checker: .venv-tools (scripts/install-tools) or .venv-test."""
    for candidate in [".venv-tools/bin/python", ".venv-test/bin/python"]:
        if pathlib.Path(candidate).exists():
            probe = subprocess.run([candidate, "-c", "import numpy"], capture_output=True)
            if probe.returncode == 0:
                return candidate
    return None


def set_f32(model, name, value):
    """Overwrites the first element of the F32 tensor `name` in a sharded checkpoint, in place."""
    shard = model / json.loads((model / "model.safetensors.index.json").read_text())["weight_map"][name]
    data = bytearray(shard.read_bytes())
    length = struct.unpack("<Q", data[:8])[0]
    info = json.loads(data[8:8 + length])[name]
    assert info["dtype"] == "F32", info
    begin = 8 + length + info["data_offsets"][0]
    data[begin:begin + 4] = struct.pack("<f", value)
    shard.write_bytes(bytes(data))


def relative_l2(a, b):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / sum(x * x for x in a))


class Quantize(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        root = pathlib.Path(cls.tmp.name)
        cls.out = {}
        cls.runs = {}
        for key, model, extra in [("mixtral", MIXTRAL, []), ("grok1", GROK1, []),
                                  ("mixtral-fp8", MIXTRAL, ["--quantization", "fp8"]),
                                  ("mixtral-sharded", MIXTRAL, ["--max-shard-size", "100KB"])]:
            cls.out[key] = root / key
            cls.runs[key] = run("quantize", "--model-path", model, "--output", cls.out[key], *extra)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def logits(self, model, out_name, *extra):
        out = pathlib.Path(self.tmp.name) / out_name
        r = run("logits", "--model-path", model, "--ids", IDS, "--out", out, *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        return read_npy_f32(out)

    def test_runs_with_progress(self):
        for key, r in self.runs.items():
            self.assertEqual(r.returncode, 0, f"{key}: {r.stderr}")
            self.assertIn("calibrating: 8/8 sequences", r.stderr)
            self.assertRegex(r.stderr, r"quantizing: (\d+)/\1 tensors")
            self.assertIn("wrote ", r.stderr)

    def test_config_block_and_copied_files(self):
        for key, source in [("mixtral", MIXTRAL), ("grok1", GROK1)]:
            out = self.out[key]
            config = json.loads((out / "config.json").read_text())
            original = json.loads((source / "config.json").read_text())
            q = config.pop("quantization_config")
            self.assertEqual(config, original)
            self.assertEqual(q["quant_method"], "fp8")
            self.assertEqual(q["int4_experts"], {"bits": 4, "group": "column", "sym": True})
            self.assertEqual((q["activation_scheme"], q["kv_cache_scheme"]), ("static", "static"))
            self.assertEqual(q["export"]["pack_method"], "reorder")
            layers = original["num_hidden_layers"]
            self.assertEqual(q["ignored_layers"],
                             [f"model.layers.{i}.block_sparse_moe.gate" for i in range(layers)] + ["lm_head"])
            for name in ["tokenizer.json", "tokenizer_config.json"]:
                self.assertEqual((out / name).read_bytes(), (source / name).read_bytes())
            self.assertEqual(sorted(p.name for p in out.glob("*.safetensors")), ["model.safetensors"])
        self.assertNotIn("int4_experts", json.loads((self.out["mixtral-fp8"] / "config.json").read_text())
                         ["quantization_config"])

    def test_sharded_output(self):
        out = self.out["mixtral-sharded"]
        shards = sorted(p.name for p in out.glob("*.safetensors"))
        self.assertGreater(len(shards), 2)
        self.assertEqual(shards[0], f"model-00001-of-{len(shards):05d}.safetensors")
        self.assertTrue(all(p.stat().st_size < 150_000 for p in out.glob("*.safetensors")))
        index = json.loads((out / "model.safetensors.index.json").read_text())
        self.assertEqual(sorted(set(index["weight_map"].values())), shards)
        self.assertEqual(self.logits(out, "sharded.npy"), self.logits(self.out["mixtral"], "single.npy"))

    def test_independent_check(self):
        python = numpy_python()
        if python is None:
            self.skipTest("no python with numpy (run scripts/install-tools or scripts/install-test-deps)")
        for key, source in [("mixtral", MIXTRAL), ("grok1", GROK1), ("mixtral-fp8", MIXTRAL)]:
            r = subprocess.run([python, CHECKER, source, self.out[key]], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, f"{key}:\n{r.stdout}{r.stderr}")
            self.assertIn("ok", r.stdout)
            print(f"\n{key}: {r.stdout.strip()}", file=sys.stderr)

    # --quantization auto reads the checkpoint; its logits differ from online quantization only by
    # the calibrated static scales (the C++ test shows they are equal without them). Bounds: the
    # measured mean per-position relative L2 (printed) with headroom.
    def test_auto_is_close_to_online(self):
        for key, source, online, bound in [("mixtral", MIXTRAL, "quark_int4fp8_moe", 0.3),
                                           ("grok1", GROK1, "quark_int4fp8_moe", 0.3),
                                           ("mixtral-fp8", MIXTRAL, "fp8", 0.3)]:
            for kv in ["bf16", "fp8_e4m3"]:
                ref = self.logits(source, "online.npy", "--quantization", online, "--kv-cache-dtype", kv)
                got = self.logits(self.out[key], "auto.npy", "--kv-cache-dtype", kv)
                mean = sum(relative_l2(a, b) for a, b in zip(ref, got)) / len(ref)
                print(f"\n{key} {kv} kv: auto vs online {online}: mean relative L2 {mean:.3f}", file=sys.stderr)
                self.assertGreater(mean, 0)
                self.assertLess(mean, bound)

    def test_generate(self):
        r = run("generate", "--model-path", self.out["grok1"], "--prompt", "The quick brown fox",
                "--max-new-tokens", 8, "--kv-cache-dtype", "fp8_e4m3")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("with quantization quark_int4fp8_moe", r.stderr)


class BadInput(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = pathlib.Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def assertFailsClearly(self, result, *needles):
        assert_fails_clearly(self, result, *needles)

    def quantize(self, model, out, *extra):
        return run("quantize", "--model-path", model, "--output", out, *extra)

    def test_output_not_empty(self):
        out = self.root / "out"
        out.mkdir()
        (out / "keep.txt").write_text("mine")
        self.assertFailsClearly(self.quantize(MIXTRAL, out), str(out), "not an empty directory")
        self.assertEqual((out / "keep.txt").read_text(), "mine")

    def test_bad_flags(self):
        self.assertFailsClearly(self.quantize(MIXTRAL, self.root / "o", "--quantization", "none"), "none")
        self.assertFailsClearly(self.quantize(MIXTRAL, self.root / "o", "--max-shard-size", "big"), "big")
        self.assertFailsClearly(self.quantize(self.root / "missing", self.root / "o"), "does not exist")
        self.assertFalse((self.root / "o").exists())

    def test_quantized_checkpoints(self):
        out = self.root / "q"
        r = self.quantize(MIXTRAL, out, "--max-shard-size", "100KB")
        self.assertEqual(r.returncode, 0, r.stderr)
        # Quantizing twice, or applying another scheme to a quantized checkpoint, is refused.
        self.assertFailsClearly(self.quantize(out, self.root / "again"), "already quantized")
        self.assertFailsClearly(run("logits", "--model-path", out, "--ids", "1,2", "--out", self.root / "x.npy",
                                    "--quantization", "none"), "pre-quantized", "--quantization none")
        # A NaN scale is named.
        name = "model.layers.1.block_sparse_moe.experts.3.w2.weight_scale"
        set_f32(out, name, float("nan"))
        self.assertFailsClearly(run("logits", "--model-path", out, "--ids", "1,2", "--out", self.root / "x.npy"),
                                name, "nan")

    def test_missing_tokenizer(self):
        model = self.root / "model"
        shutil.copytree(MIXTRAL, model)
        (model / "tokenizer.json").unlink()
        self.assertFailsClearly(self.quantize(model, self.root / "o"), "tokenizer.json")


if __name__ == "__main__":
    NIBBLE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
