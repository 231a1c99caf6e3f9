#!/usr/bin/env python3
"""Writes a seed corpus for the gguf_reader fuzz target into fuzz/corpus/gguf_reader: small GGUF
files made with upstream's gguf-py writer, covering every metadata type (nested arrays too) and
tensors of many ggml types. Needs PYTHONPATH pointing at the llama.cpp sdist's gguf-py."""
import os

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

OUT = os.path.join(os.path.dirname(__file__), "corpus", "gguf_reader")
os.makedirs(OUT, exist_ok=True)
rng = np.random.default_rng(3)

def write(name, types, arch="llama", nested=False):
    path = os.path.join(OUT, name)
    w = GGUFWriter(path, arch)
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_uint8("t.u8", 1); w.add_int8("t.i8", -1); w.add_uint16("t.u16", 2); w.add_int16("t.i16", -2)
    w.add_int32("t.i32", -3); w.add_float32("t.f32", 0.5); w.add_bool("t.b", True)
    w.add_uint64("t.u64", 4); w.add_int64("t.i64", -4); w.add_float64("t.f64", 0.25)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    if nested:
        w.add_array("t.nested", [[1, 2], ["x"]])
    for i, t in enumerate(types):
        bs, ts = GGML_QUANT_SIZES[t]
        n = bs if bs > 1 else 8
        raw = rng.integers(0, 256, size=(n // bs) * ts, dtype=np.uint8)
        w.add_tensor(f"blk.0.t{i}.weight", raw, raw_dtype=t)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

write("floats.gguf", [Q.F32, Q.F16, Q.BF16])
write("legacy.gguf", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0])
write("kquants.gguf", [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K], arch="qwen3moe")
write("iquants.gguf", [Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S], arch="gemma3")
write("lowbit.gguf", [Q.IQ4_NL, Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.NVFP4], nested=True)
