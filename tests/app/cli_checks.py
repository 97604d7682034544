"""Checks shared by the tests that run the `nibble` command (tests/app, standard library only): a
failure that ends with exit status 1 and one clear error line, and reading the float32 .npy files
that `nibble logits` writes."""
import pathlib
import struct

CRASH_SIGNS = ["Traceback", "terminate called", "Aborted", "Segmentation"]


def assert_fails_clearly(test, result, *needles):
    """Exit status 1, exactly one `nibble: error: ` line and it is the last, naming every needle; no
    sign of a crash."""
    test.assertEqual(result.returncode, 1, f"exit {result.returncode}\n{result.stderr}")
    lines = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("nibble: error: ")]
    test.assertEqual(len(errors), 1, result.stderr)
    test.assertEqual(lines[-1], errors[0], result.stderr)
    for needle in needles:
        test.assertIn(needle, errors[0])
    for bad in CRASH_SIGNS:
        test.assertNotIn(bad, result.stderr)


def read_npy_f32(path):
    """A 2-D little-endian float32 .npy file as a list of row tuples."""
    data = pathlib.Path(path).read_bytes()
    assert data[:6] == b"\x93NUMPY", "not an npy file"
    header_len = struct.unpack("<H", data[8:10])[0]
    header = data[10:10 + header_len].decode()
    assert "'<f4'" in header and "False" in header, header
    shape = tuple(int(x) for x in header.split("(")[1].split(")")[0].split(",") if x.strip())
    count = shape[0] * shape[1]
    values = struct.unpack(f"<{count}f", data[10 + header_len:10 + header_len + 4 * count])
    return [values[r * shape[1]:(r + 1) * shape[1]] for r in range(shape[0])]
