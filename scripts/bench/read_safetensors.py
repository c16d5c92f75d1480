#!/usr/bin/env python3
"""Reads a uvmrec checkpoint with the `safetensors` package (PyPI), so we know other tools
read our files: prints each tensor's dtype, shape and values (or a summary) as JSON.

    read_safetensors.py FILE [--max-values N] [--reserialize]

--reserialize also writes the same tensors and metadata with safetensors' own serializer and
says whether the bytes equal FILE's (whole file when the metadata has at most one key, since
the reference keeps metadata in a hash map of unstable order; else header JSON and data).
Needs only `safetensors` (numpy, when present, is used for a second read through safe_open).
Exit status: 0 read (and, with --reserialize, identical), 1 not, 2 safetensors missing.
"""
import argparse
import ctypes
import json
import math
import struct
import sys

try:
    import safetensors
except ImportError:
    print("read_safetensors: the safetensors package is not installed (make pydeps)", file=sys.stderr)
    sys.exit(2)

FORMATS = {"F32": "f", "F16": "e", "I8": "b", "U8": "B", "I32": "i", "I64": "q"}
SIZES = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1, "I32": 4, "I64": 8}
TORCH_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I8": "int8",
               "U8": "uint8", "I32": "int32", "I64": "int64"}


def values(dtype, data):
    n = len(data) // SIZES[dtype]
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % n, bytes(data))
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    return list(struct.unpack("<%d%s" % (n, FORMATS[dtype]), bytes(data)))


def finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def reserialize(tensors, metadata):
    """The same tensors through safetensors' serializer (whichever API this version has)."""
    spec_type = getattr(safetensors, "TensorSpec", None)
    if spec_type is None:
        return safetensors.serialize(
            {name: {"dtype": t["dtype"], "shape": t["shape"], "data": bytes(t["data"])}
             for name, t in tensors}, metadata or None)
    keep, specs = [], {}
    for name, t in tensors:
        buf = ctypes.create_string_buffer(bytes(t["data"]), max(len(t["data"]), 1))
        keep.append(buf)
        specs[name] = spec_type(dtype=TORCH_NAMES[t["dtype"]], shape=t["shape"],
                                data_ptr=ctypes.addressof(buf), data_len=len(t["data"]))
    return safetensors.serialize(specs, metadata or None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--max-values", type=int, default=4096,
                    help="tensors with more elements print only a summary")
    ap.add_argument("--reserialize", action="store_true")
    args = ap.parse_args()

    with open(args.file, "rb") as f:
        raw = f.read()
    tensors = safetensors.deserialize(raw)  # validates as the reference implementation does
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + header_len])
    metadata = header.get("__metadata__", {})
    out = {"file": args.file, "safetensors": safetensors.__version__, "metadata": metadata,
           "tensors": {}}
    for name, t in tensors:
        vals = values(t["dtype"], t["data"])
        entry = {"dtype": t["dtype"], "shape": t["shape"], "nbytes": len(t["data"]),
                 "sum": math.fsum(v for v in vals if math.isfinite(v))}
        if len(vals) <= args.max_values:
            entry["values"] = [finite(v) for v in vals]
        out["tensors"][name] = entry

    try:
        import numpy  # noqa: F401  (safe_open's numpy framework needs it)
        with safetensors.safe_open(args.file, framework="numpy") as f:
            for name in f.keys():
                if out["tensors"][name]["dtype"] != "BF16":  # numpy has no bfloat16
                    arr = f.get_tensor(name)
                    assert list(arr.shape) == out["tensors"][name]["shape"], name
        out["safe_open"] = "numpy"
    except ImportError:
        out["safe_open"] = "skipped (no numpy)"

    ok = True
    if args.reserialize:
        again = reserialize(tensors, metadata)
        if len(metadata) <= 1:
            out["identical"] = again == raw
        else:
            n2 = struct.unpack("<Q", again[:8])[0]
            out["identical"] = (json.loads(again[8:8 + n2]) == header
                                and again[8 + n2:] == raw[8 + header_len:] and n2 == header_len)
        ok = out["identical"]
    json.dump(out, sys.stdout, sort_keys=True)
    print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
