#!/usr/bin/env python3
"""Extracts the grammar cases of upstream's tests/test-grammar-integration.cpp (b11434) into
JSON: each `test_grammar(...)` / `test_schema(...)` call becomes
{"kind", "desc", "source", "pass": [...], "fail": [...]}, and each grammar upstream expects to be
refused becomes {"kind": "refused", "source", "root"}. A test string is a list of parts: a
string is text, an integer is a token id (upstream's `token(N)`).

usage: scripts/extract-grammar-cases.py UPSTREAM_TREE > tests/data/grammar/integration.json
"""
import json
import re
import sys


def lex(src):
    """C++ tokens we need: string literals (raw and escaped), identifiers, numbers, punctuation."""
    i, out = 0, []
    while i < len(src):
        c = src[i]
        if src.startswith("//", i):
            i = src.index("\n", i)
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
        elif c.isspace():
            i += 1
        elif src.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', src[i:])
            delim = ")" + m.group(1) + '"'
            start = i + m.end()
            end = src.index(delim, start)
            out.append(("str", src[start:end]))
            i = end + len(delim)
        elif c == '"':
            j, buf = i + 1, []
            while src[j] != '"':
                if src[j] == "\\":
                    e = src[j + 1]
                    simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}
                    if e in simple:
                        buf.append(simple[e])
                        j += 2
                    elif e == "x":
                        m = re.match(r"[0-9a-fA-F]+", src[j + 2:])
                        buf.append(chr(int(m.group(0), 16)))
                        j += 2 + m.end()
                    elif e in "uU":
                        n = 4 if e == "u" else 8
                        buf.append(chr(int(src[j + 2:j + 2 + n], 16)))
                        j += 2 + n
                    else:
                        raise ValueError("escape \\" + e)
                else:
                    buf.append(src[j])
                    j += 1
            out.append(("str", "".join(buf)))
            i = j + 1
        elif c.isalpha() or c == "_":
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", src[i:])
            out.append(("id", m.group(0)))
            i += m.end()
        elif c.isdigit():
            m = re.match(r"[0-9]+", src[i:])
            out.append(("num", int(m.group(0))))
            i += m.end()
        else:
            out.append(("p", c))
            i += 1
    return out


class Parser:
    def __init__(self, toks):
        self.t, self.i = toks, 0

    def peek(self, k=0):
        return self.t[self.i + k] if self.i + k < len(self.t) else ("eof", None)

    def take(self, kind=None, value=None):
        tok = self.peek()
        if (kind and tok[0] != kind) or (value is not None and tok[1] != value):
            raise ValueError(f"expected {kind} {value}, got {tok}")
        self.i += 1
        return tok

    def term(self):
        kind, value = self.peek()
        if kind == "str":
            parts = []
            while self.peek()[0] == "str":
                parts.append(self.take()[1])
            return ["".join(parts)]
        if (kind, value) == ("id", "token"):
            self.take()
            self.take("p", "(")
            n = self.take("num")[1]
            self.take("p", ")")
            return [n]
        if (kind, value) == ("p", "{"):
            self.take()
            items = []
            while self.peek() != ("p", "}"):
                items.append(self.expr())
                if self.peek() == ("p", ","):
                    self.take()
            self.take("p", "}")
            return [items]
        raise ValueError(f"unexpected {self.peek()}")

    def expr(self):
        parts = self.term()
        while self.peek() == ("p", "+"):
            self.take()
            parts += self.term()
        if len(parts) == 1 and isinstance(parts[0], list):
            return parts[0]
        merged = []
        for p in parts:
            if isinstance(p, str) and merged and isinstance(merged[-1], str):
                merged[-1] += p
            else:
                merged.append(p)
        return merged


def main():
    tree = sys.argv[1]
    src = open(f"{tree}/tests/test-grammar-integration.cpp", encoding="utf-8").read()
    body = src[src.index("static void test_simple_grammar()"):]
    toks = lex(body)
    cases = []
    p = Parser(toks)
    strings = {}
    while p.peek()[0] != "eof":
        kind, value = p.peek()
        if kind == "id" and value in ("test_grammar", "test_schema") and p.peek(1) == ("p", "("):
            p.take()
            p.take("p", "(")
            args = []
            while p.peek() != ("p", ")"):
                args.append(p.expr())
                if p.peek() == ("p", ","):
                    p.take()
            p.take("p", ")")
            desc, source, passing, failing = args
            cases.append({
                "kind": "grammar" if value == "test_grammar" else "schema",
                "desc": "".join(desc),
                "source": "".join(source),
                "pass": passing,
                "fail": failing,
            })
        elif kind == "id" and value == "string" and p.peek(1)[0] == "id" and p.peek(2) == ("p", "="):
            # `const std::string NAME = R"""(...)""";` holds a grammar a later line refers to.
            p.take()
            name = p.take("id")[1]
            p.take("p", "=")
            strings[name] = "".join(p.expr())
        elif kind == "id" and value in ("test_build_grammar_fails", "build_grammar_with_root"):
            # `llama_grammar * NAME = build_grammar_with_root(...)`: NAME says which outcome
            # upstream asserts.
            assigned = p.t[p.i - 2][1] if p.i >= 2 else ""
            p.take()
            p.take("p", "(")
            arg = p.take()
            root = "root"
            if p.peek() == ("p", ","):
                p.take()
                root = p.take("str")[1]
            p.take("p", ")")
            source = strings[arg[1]] if arg[0] == "id" else arg[1]
            refused = value == "test_build_grammar_fails" or assigned != "success_result"
            cases.append({"kind": "refused" if refused else "accepted", "source": source, "root": root})
        elif kind == "id" and value == "parse" and p.peek(1) == ("p", "("):
            # `parsed_grammar.parse(grammar_str.c_str())`: the missing-reference case must fail
            # to parse; the missing-root one parses but has no root.
            p.take()
            p.take("p", "(")
            name = p.take("id")[1]
            cases.append({"kind": "refused", "source": strings[name], "root": "root"})
        else:
            p.i += 1
    json.dump(cases, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
