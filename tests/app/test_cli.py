#!/usr/bin/env python3
"""Runs the `nibble` command as a user would: logits/tokenize/generate on the tiny Mixtral fixture
against Hugging Face's reference outputs, and every kind of bad input, which must end with exit
status 1 and one clear line on stderr (no crash, no signal, no stack trace).

Usage: test_cli.py PATH_TO_NIBBLE   (from the repository root; standard library only)
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

from cli_checks import assert_fails_clearly, read_npy_f32

NIBBLE = None
MODEL = pathlib.Path("tests/fixtures/tiny-mixtral")
REFERENCE = json.loads(pathlib.Path("tests/fixtures/tiny-mixtral-reference.json").read_text())


def run(*args):
    return subprocess.run([NIBBLE, *map(str, args)], capture_output=True, text=True, timeout=300)


def read_reference_logits():
    return read_npy_f32("tests/fixtures/tiny-mixtral-logits.npy")


class Usage(unittest.TestCase):
    def test_logits_match_transformers(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "logits.npy"
            ids = ",".join(map(str, REFERENCE["ids"]))
            r = run("logits", "--model-path", MODEL, "--ids", ids, "--out", out, "--device", "cpu")
            self.assertEqual(r.returncode, 0, r.stderr)
            got, ref = read_npy_f32(out), read_reference_logits()
        self.assertEqual(len(got), len(ref))
        for g, e in zip(got, ref):
            err = math.sqrt(sum((a - b) ** 2 for a, b in zip(g, e)) / sum(b * b for b in e))
            self.assertLessEqual(err, 1e-2)
            self.assertEqual(max(range(len(g)), key=g.__getitem__), max(range(len(e)), key=e.__getitem__))

    def test_tokenize_applies_bos(self):
        r = run("tokenize", "--model-path", MODEL, "--text", REFERENCE["prompt"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout), REFERENCE["ids"])

    def test_generate_greedy(self):
        for quant in ["none", "fp8", "quark_int4fp8_moe"]:
            r = run("generate", "--model-path", MODEL, "--prompt", REFERENCE["prompt"], "--max-new-tokens", 8,
                    "--quantization", quant, "--kv-cache-dtype", "fp8_e4m3", "--device", "cpu")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(REFERENCE["prompt"]), r.stdout)
            self.assertIn("tokens/s", r.stderr)

    def test_sampling_is_reproducible_with_a_seed(self):
        args = ["generate", "--model-path", MODEL, "--prompt", "Question:", "--max-new-tokens", 16,
                "--temperature", 0.8, "--top-p", 0.9, "--top-k", 50, "--ignore-eos"]
        a, b = run(*args, "--seed", 5), run(*args, "--seed", 5)
        self.assertEqual(a.returncode, 0, a.stderr)
        self.assertEqual(a.stdout, b.stdout)


class BadInput(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.model = pathlib.Path(self.tmp.name) / "model"
        shutil.copytree(MODEL, self.model)

    def tearDown(self):
        self.tmp.cleanup()

    def assertFailsClearly(self, result, *needles):
        assert_fails_clearly(self, result, *needles)

    def logits(self, *extra):
        return run("logits", "--model-path", self.model, "--ids", "1,2,3", "--out",
                   pathlib.Path(self.tmp.name) / "out.npy", *extra)

    def shard(self, index=1):
        return sorted(self.model.glob("*.safetensors"))[index]

    def test_missing_directory(self):
        self.assertFailsClearly(run("logits", "--model-path", "/nonexistent/model", "--ids", "1", "--out", "x.npy"),
                                "/nonexistent/model", "does not exist")

    def test_truncated_shard(self):
        shard = self.shard()
        data = shard.read_bytes()
        shard.write_bytes(data[:len(data) // 2])
        self.assertFailsClearly(self.logits(), shard.name)

    def test_header_lies_about_offsets(self):
        shard = self.shard()
        data = bytearray(shard.read_bytes())
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        name = next(k for k in header if k != "__metadata__")
        begin, end = header[name]["data_offsets"]
        header[name]["data_offsets"] = [begin, end + 2]
        text = json.dumps(header).encode()
        text += b" " * (-(len(text)) % 8)
        shard.write_bytes(struct.pack("<Q", len(text)) + text + bytes(data[8 + n:]))
        self.assertFailsClearly(self.logits(), shard.name, name)

    def test_garbage_header(self):
        shard = self.shard(0)
        shard.write_bytes(struct.pack("<Q", 12) + b"{not json!!}" + b"\0" * 64)
        self.assertFailsClearly(self.logits(), shard.name)

    def test_unknown_model_type(self):
        config = json.loads((self.model / "config.json").read_text())
        config["model_type"] = "llama"
        (self.model / "config.json").write_text(json.dumps(config))
        self.assertFailsClearly(self.logits(), "model_type", "llama")

    def test_config_missing_field(self):
        config = json.loads((self.model / "config.json").read_text())
        del config["num_local_experts"]
        (self.model / "config.json").write_text(json.dumps(config))
        self.assertFailsClearly(self.logits(), "num_local_experts")

    def test_missing_config(self):
        (self.model / "config.json").unlink()
        self.assertFailsClearly(self.logits(), "config.json")

    def test_tokenizer_of_the_wrong_kind(self):
        tok = json.loads((self.model / "tokenizer.json").read_text())
        tok["model"] = {"type": "WordPiece", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}
        (self.model / "tokenizer.json").write_text(json.dumps(tok))
        self.assertFailsClearly(run("tokenize", "--model-path", self.model, "--text", "hi"), "WordPiece")
        self.assertFailsClearly(run("generate", "--model-path", self.model, "--prompt", "hi"), "WordPiece")

    def test_missing_tokenizer(self):
        (self.model / "tokenizer.json").unlink()
        self.assertFailsClearly(run("generate", "--model-path", self.model, "--prompt", "hi"), "tokenizer.json")

    def test_bad_ids_and_flags(self):
        self.assertFailsClearly(self.logits_with_ids("1,x,3"), '"x"')
        self.assertFailsClearly(self.logits_with_ids("1,99999"), "99999")
        self.assertFailsClearly(self.logits("--quantization", "int3"), "int3")
        self.assertFailsClearly(self.logits("--kv-cache-dtype", "fp4"), "fp4")
        self.assertFailsClearly(run("generate", "--model-path", self.model, "--prompt", "hi", "--top-p", "0"),
                                "top_p")

    def logits_with_ids(self, ids):
        return run("logits", "--model-path", self.model, "--ids", ids, "--out", pathlib.Path(self.tmp.name) / "o.npy")

    def test_missing_tensor(self):
        index = json.loads((self.model / "model.safetensors.index.json").read_text())
        index["weight_map"]["model.layers.9.mlp.extra.weight"] = self.shard().name
        (self.model / "model.safetensors.index.json").write_text(json.dumps(index))
        self.assertFailsClearly(self.logits(), "model.layers.9.mlp.extra.weight")


if __name__ == "__main__":
    NIBBLE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
