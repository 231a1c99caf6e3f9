#!/usr/bin/env python3
"""Extracts the Unicode tables llama.cpp b11434 tokenizes with (src/unicode-data.cpp) into
src/tokenizer/unicode_data.rs, so category, whitespace, lowercase and NFD answers match upstream's
Unicode version exactly rather than whatever Unicode version Rust's std was built with.

usage: gen_unicode_data.py path/to/llama.cpp/src/unicode-data.cpp > src/tokenizer/unicode_data.rs
"""
import re
import sys


def body_of(src, name):
    start = src.index(name)
    body = src[src.index("{", src.index("=", start)) + 1:]
    return body[: body.index("\n};")]


def table(src, name):
    rows = re.findall(r"\{([^}]*)\}", body_of(src, name))
    return [tuple(int(x, 16) for x in re.findall(r"0x[0-9A-Fa-f]+", row)) for row in rows]


def flat(src, name):
    return [int(x, 16) for x in re.findall(r"0x[0-9A-Fa-f]+", body_of(src, name))]


def main():
    src = open(sys.argv[1], encoding="utf-8").read()
    flags = table(src, "unicode_ranges_flags")
    ws = sorted(flat(src, "unicode_set_whitespace"))
    lower = table(src, "unicode_map_lowercase")
    nfd = table(src, "unicode_ranges_nfd")
    out = []
    out.append("//! Unicode tables of llama.cpp b11434, extracted by gen_unicode_data.py. Do not edit.\n")
    out.append("/// (first codepoint, category flags); a range ends where the next begins.")
    out.append(f"pub static RANGES_FLAGS: [(u32, u16); {len(flags)}] = [")
    out += [f"    (0x{a:06X}, 0x{b:04X})," for a, b in flags]
    out.append("];\n")
    out.append(f"pub static WHITESPACE: [u32; {len(ws)}] = [")
    out += [f"    0x{a:06X}," for a in ws]
    out.append("];\n")
    out.append("/// (codepoint, lowercase), ascending.")
    out.append(f"pub static LOWERCASE: [(u32, u32); {len(lower)}] = [")
    out += [f"    (0x{a:06X}, 0x{b:06X})," for a, b in lower]
    out.append("];\n")
    out.append("/// (first, last, NFD base codepoint), ascending.")
    out.append(f"pub static NFD: [(u32, u32, u32); {len(nfd)}] = [")
    out += [f"    (0x{a:06X}, 0x{b:06X}, 0x{c:06X})," for a, b, c in nfd]
    out.append("];")
    print("\n".join(out))


main()
