#!/usr/bin/env python3
"""Answers from upstream's `gguf` Python package, for bloomery's model tests to compare against.

  gguf_oracle.py dequant DIR TYPE...   reads DIR/TYPE.bin (raw blocks), writes DIR/TYPE.f32
                                       (little-endian f32 from gguf.quants.dequantize)
  gguf_oracle.py inventory FILE        prints JSON: version, metadata (type and value per key) and
                                       tensors (name, ggml type, shape, absolute offset, bytes)

The package is found on PYTHONPATH (the test points it at the llama.cpp sdist's gguf-py).
"""
import json
import sys

import numpy as np


def dequant(directory, names):
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    for name in names:
        raw = np.fromfile(f"{directory}/{name}.bin", dtype=np.uint8)
        qtype = GGMLQuantizationType[name.upper()]
        out = dequantize(raw, qtype).astype("<f4", copy=False)
        out.tofile(f"{directory}/{name}.f32")


def field_value(field, vtype, elem_type):
    """A metadata value as JSON: strings as text, floats by their exact repr, arrays as lists."""
    from gguf.constants import GGUFValueType

    def scalar(part, t):
        if t == GGUFValueType.STRING:
            return bytes(part).decode("utf-8")
        v = part.tolist()[0]
        if t in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            return repr(float(v))
        if t == GGUFValueType.BOOL:
            return bool(v)
        return int(v)

    if vtype == GGUFValueType.ARRAY:
        return [scalar(field.parts[i], elem_type) for i in field.data]
    return scalar(field.parts[field.data[0]], vtype)


def inventory(path):
    from gguf import GGUFReader

    r = GGUFReader(path)
    meta = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = field.types[0]
        elem = field.types[-1] if len(field.types) > 1 else None
        meta[key] = {
            "type": vtype.name,
            "elem": elem.name if elem is not None else None,
            "value": field_value(field, vtype, elem),
        }
    tensors = [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "shape": [int(d) for d in t.shape],
            "offset": int(t.data_offset),
            "size": int(t.n_bytes),
        }
        for t in r.tensors
    ]
    version = int(r.fields["GGUF.version"].parts[-1][0])
    json.dump({"version": version, "metadata": meta, "tensors": tensors}, sys.stdout)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "dequant":
        dequant(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 3 and sys.argv[1] == "inventory":
        inventory(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
