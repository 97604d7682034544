#!/usr/bin/env python3
"""Independent check of a Quark W4A8KV8 (or FP8) checkpoint against the bf16 checkpoint it was made
from, with numpy only (no nibble code): reads both with its own safetensors parser, unpacks the int32
experts in the "reorder" order [0,2,4,6,1,3,5,7], rescales by weight_scale1 x weight_scale, and checks
that every element is within half a quantization step of the source weight and that each step is the
row's max|W|/7; decodes FP8 e4m3fn weights and checks them the same way against amax/448; checks the
static input and KV-cache scales are positive and finite and that every other tensor is copied
byte for byte.

Usage: check_quark_checkpoint.py SOURCE_DIR QUANTIZED_DIR     (exit status 0 when all checks pass)
"""
import json
import pathlib
import re
import struct
import sys

import numpy as np

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of a word holds element ORDER[i] of its 8
EXPERT = re.compile(r"model\.layers\.\d+\.block_sparse_moe\.experts\.\d+\.w[123]\.weight")
ATTENTION = re.compile(r"model\.layers\.\d+\.self_attn\.([qkvo])_proj\.weight")
NUMPY = {"F32": "<f4", "F16": "<f2", "I32": "<i4", "I64": "<i8", "I8": "i1", "U8": "u1", "BF16": "<u2",
         "F8_E4M3": "u1"}


def e4m3fn_table():
    """float32 value of every e4m3fn byte (bias 7, no infinities, 0x7F/0xFF NaN)."""
    values = np.zeros(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        exponent, mantissa = (b >> 3) & 0xF, b & 7
        if exponent == 15 and mantissa == 7:
            values[b] = np.nan
        elif exponent == 0:
            values[b] = sign * mantissa * 2.0 ** -9
        else:
            values[b] = sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    return values


E4M3FN = e4m3fn_table()


class Checkpoint:
    """Every tensor of a safetensors model directory: name -> (dtype, shape, raw bytes)."""

    def __init__(self, directory):
        directory = pathlib.Path(directory)
        index = directory / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in directory.glob("*.safetensors"))
        if not files:
            raise SystemExit(f"{directory}: no safetensors files")
        self.tensors = {}
        for name in files:
            data = (directory / name).read_bytes()
            (length,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8:8 + length])
            header.pop("__metadata__", None)
            body = data[8 + length:]
            for tensor, info in header.items():
                begin, end = info["data_offsets"]
                self.tensors[tensor] = (info["dtype"], tuple(info["shape"]), body[begin:end])

    def raw(self, name):
        dtype, shape, data = self.tensors[name]
        return np.frombuffer(data, dtype=NUMPY[dtype]).reshape(shape), dtype

    def float64(self, name):
        array, dtype = self.raw(name)
        if dtype == "BF16":
            return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        if dtype == "F8_E4M3":
            return E4M3FN[array]
        return array.astype(np.float64)


class Report:
    def __init__(self):
        self.errors = []
        self.counts = {}
        self.worst = {}

    def fail(self, message):
        self.errors.append(message)

    def count(self, kind, worst_steps=None):
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if worst_steps is not None:
            self.worst[kind] = max(self.worst.get(kind, 0.0), worst_steps)


def scalar(q, name, report):
    if name not in q.tensors:
        report.fail(f"{name}: missing")
        return None
    value = q.float64(name)
    if value.size != 1 or value.ndim > 1:
        report.fail(f"{name}: shape {value.shape}, expected a scalar")
        return None
    value = float(value.reshape(-1)[0])
    if not np.isfinite(value) or value <= 0:
        report.fail(f"{name}: {value} is not a positive finite scale")
        return None
    return value


def unpack_int4(words):
    """int32 (rows, cols/8) -> int (rows, cols): nibble i of each word is element ORDER[i]."""
    nibbles = (words.astype(np.uint32)[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    codes = np.empty_like(nibbles)
    codes[:, :, ORDER] = nibbles
    codes = codes.reshape(words.shape[0], -1).astype(np.int64)
    return np.where(codes >= 8, codes - 16, codes)


def check_int4(source, q, name, report):
    base = name[:-len(".weight")]
    w = source.float64(name)
    words, dtype = q.raw(name)
    if dtype != "I32" or words.shape != (w.shape[0], w.shape[1] // 8):
        return report.fail(f"{name}: {dtype} {words.shape}, expected I32 {(w.shape[0], w.shape[1] // 8)}")
    weight_scale = scalar(q, base + ".weight_scale", report)
    scale1 = q.float64(base + ".weight_scale1") if base + ".weight_scale1" in q.tensors else None
    if weight_scale is None or scale1 is None or scale1.shape != (w.shape[0],):
        return report.fail(f"{base}.weight_scale1: missing or not of shape ({w.shape[0]},)")
    step = (scale1.astype(np.float32) * np.float32(weight_scale)).astype(np.float64)  # per row
    codes = unpack_int4(words)
    if np.abs(codes).max() > 7:
        report.fail(f"{name}: codes outside [-7, 7]")
    row_max = np.abs(w).max(axis=1)
    expected = np.where(row_max > 0, row_max / 7, step)
    if not np.all(np.abs(step - expected) <= 1e-6 * expected):
        return report.fail(f"{name}: row scales are not max|W|/7 (worst ratio {np.max(step / expected):.6g})")
    error_steps = np.abs(codes * step[:, None] - w) / step[:, None]
    worst = float(error_steps.max())
    if worst > 0.5 + 1e-5:
        return report.fail(f"{name}: an element is {worst:.4f} steps from the source weight (> 0.5)")
    report.count("INT4 experts", worst)


def check_fp8(source, q, name, report, kind):
    base = name[:-len(".weight")]
    w = source.float64(name)
    raw, dtype = q.raw(name)
    if dtype != "F8_E4M3" or raw.shape != w.shape:
        return report.fail(f"{name}: {dtype} {raw.shape}, expected F8_E4M3 {w.shape}")
    scale = scalar(q, base + ".weight_scale", report)
    if scale is None:
        return
    amax = np.abs(w).max()
    if amax > 0 and abs(scale - amax / 448) > 1e-6 * amax / 448:
        return report.fail(f"{name}: weight_scale {scale} is not amax/448 = {amax / 448}")
    value = w / scale  # what the FP8 code approximates, |value| <= 448
    magnitude = np.maximum(np.abs(value), 2.0 ** -6)  # subnormals: the spacing of the first binade
    spacing = 2.0 ** (np.floor(np.log2(magnitude)) - 3)
    error_steps = np.abs(E4M3FN[raw] - value) / spacing
    worst = float(np.nanmax(error_steps))
    if np.isnan(E4M3FN[raw]).any() or worst > 0.5 + 1e-6:
        return report.fail(f"{name}: an FP8 element is {worst:.4f} steps from the source weight (> 0.5)")
    report.count(kind, worst)


def main(source_dir, quantized_dir):
    config = json.loads((pathlib.Path(quantized_dir) / "config.json").read_text())
    qc = config.get("quantization_config") or {}
    report = Report()
    if qc.get("quant_method") != "fp8":
        report.fail(f"quantization_config.quant_method is {qc.get('quant_method')!r}, expected 'fp8'")
    int4 = qc.get("int4_experts") is not None
    if int4 and (qc["int4_experts"].get("bits"), qc["int4_experts"].get("group")) != (4, "column"):
        report.fail(f"int4_experts is {qc['int4_experts']}, expected bits 4, group column")
    if (qc.get("export") or {}).get("pack_method", "reorder") != "reorder":
        report.fail("export.pack_method is not reorder")
    static_kv = qc.get("kv_cache_scheme") == "static"
    static_act = qc.get("activation_scheme") == "static"

    source, q = Checkpoint(source_dir), Checkpoint(quantized_dir)
    expected_names = set()
    for name in sorted(source.tensors):
        expected_names.add(name)
        base = name[:-len(".weight")]
        if EXPERT.fullmatch(name):
            expected_names.add(base + ".weight_scale")
            if int4:
                expected_names.add(base + ".weight_scale1")
                check_int4(source, q, name, report)
            else:
                check_fp8(source, q, name, report, "FP8 experts")
        elif match := ATTENTION.fullmatch(name):
            expected_names.add(base + ".weight_scale")
            check_fp8(source, q, name, report, "FP8 attention projections")
            if static_act:
                expected_names.add(base + ".input_scale")
                scalar(q, base + ".input_scale", report)
            if static_kv and match.group(1) in "kv":
                expected_names.add(base + ".output_scale")
                scalar(q, base + ".output_scale", report)
        elif name not in q.tensors:
            report.fail(f"{name}: missing")
        elif q.tensors[name] != source.tensors[name]:
            report.fail(f"{name}: not a byte-for-byte copy of the source tensor")
        else:
            report.count("tensors copied")
    for extra in sorted(set(q.tensors) - expected_names):
        report.fail(f"{extra}: unexpected tensor")

    for kind, n in report.counts.items():
        worst = f", worst element {report.worst[kind]:.3f} steps from the source" if kind in report.worst else ""
        print(f"{kind}: {n}{worst}")
    for error in report.errors[:20]:
        print(f"error: {error}", file=sys.stderr)
    if report.errors:
        print(f"{len(report.errors)} problems", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
