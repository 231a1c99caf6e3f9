#!/usr/bin/env python3
"""Records the upstream server's JSON schema -> GBNF conversions as test data.

Starts upstream llama-server (b11434) with --verbose on a free local port, sends each schema below
as the `json_schema` of a one-token /completion request, and takes the grammar from the server's
"Converted grammar:" debug line (or, for a refused schema, the HTTP error message). Writes
tests/data/grammar_schema/server-cases.json in the same layout as upstream-cases.json, plus
"error" (the server's message) for refused schemas; status UNCONSTRAINED when the server set no
grammar and reported no error.

usage: record-schema-grammars.py [LLAMA_SERVER] [MODEL_GGUF]
"""
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

CACHE = os.environ.get("BLOOMERY_CACHE", os.path.expanduser("~/.cache/bloomery"))
SERVER = sys.argv[1] if len(sys.argv) > 1 else os.path.join(CACHE, "upstream/b11434/bin/llama-server")
MODEL = sys.argv[2] if len(sys.argv) > 2 else os.path.join(CACHE, "models/gemma-3-270m-q4_k_m.gguf")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "grammar_schema", "server-cases.json")

# floats of many magnitudes, written in their shortest spelling, to check nlohmann's layout of them
_rng = random.Random(11434)
FLOATS = [repr(_rng.uniform(1, 10) * 10.0 ** _rng.randint(-30, 30)) for _ in range(200)]

# cases whose grammar holds floats written back from the request, which only match when the
# request's JSON reader rounds decimal text to the nearest double as upstream's does
NEEDS_EXACT_FLOATS = {"number spellings"}

# (name, schema as JSON text); the text is sent as written so that key order and number spellings hold
CASES = [
    ("null schema constrains nothing", 'null'),
    ("empty schema is any object", '{}'),
    ("nested objects and arrays", '{"type": "object", "properties": {"user": {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}, "required": ["name"]}, "scores": {"type": "array", "items": {"type": "number"}, "minItems": 2}}, "required": ["user"]}'),
    ("property names needing escapes", '{"type": "object", "properties": {"a b": {"type": "integer"}, "quote\\"d": {"type": "boolean"}, "caf\\u00e9": {"type": "null"}, "back\\\\slash": {"type": "string"}}, "required": ["a b", "caf\\u00e9"]}'),
    ("reserved names as properties", '{"type": "object", "properties": {"string": {"type": "string"}, "root": {"type": "integer"}, "value": {}, "date": {"type": "string", "format": "date"}}, "required": ["string", "root", "value", "date"], "additionalProperties": false}'),
    ("enum of mixed values", '{"enum": ["a", 1, 2.5, 1e100, 0.00001, -0.0, true, null, {"k": [1, "x"]}, [], "\\u00e9\\n\\t\\u0001"]}'),
    ("const float and object", '{"type": "object", "properties": {"f": {"const": 0.1}, "o": {"const": {"b": 1, "a": 2}}, "big": {"const": 12345678901234567890}}, "required": ["f", "o", "big"]}'),
    ("string formats", '{"type": "array", "prefixItems": [{"type": "string", "format": "date"}, {"type": "string", "format": "time"}, {"type": "string", "format": "date-time"}, {"type": "string", "format": "uuid3"}, {"type": "string", "format": "email"}, {"format": "uuid"}]}'),
    ("string lengths", '{"type": "array", "prefixItems": [{"type": "string", "minLength": 2, "maxLength": 2}, {"type": "string", "maxLength": 0}, {"type": "string", "maxLength": 1}, {"minLength": 4}]}'),
    ("integer bounds", '{"type": "array", "prefixItems": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "integer", "exclusiveMaximum": 10.5}, {"type": "integer", "minimum": 2.5, "maximum": 7.5}, {"type": "integer", "minimum": 1000000}, {"type": "integer", "minimum": -1000, "maximum": -7}, {"type": "integer", "minimum": 99, "maximum": 1001}, {"type": "integer", "maximum": -1}, {"type": "integer", "minimum": 12345, "maximum": 12345}]}'),
    ("patterns", '{"type": "array", "prefixItems": [{"type": "string", "pattern": "^[A-Z]{2,}-[0-9]{1,4}$"}, {"type": "string", "pattern": "^(ab|cd){2}(ef)?x{,3}.y*$"}, {"type": "string", "pattern": "^\\\\x41\\\\u00e9\\\\.\\\\(\\\\)\\\\[[a-z\\\\]]$"}, {"type": "string", "pattern": "^\\"quoted\\" and caf\\u00e9$"}, {"type": "string", "pattern": "^\\\\d+$"}, {"type": "string", "pattern": "^(?:a(?:b(?:c)+)*)?$"}, {"type": "string", "pattern": "^a{3}b{3}(xy){3}(xy){2}$"}]}'),
    ("anyOf oneOf and type arrays", '{"oneOf": [{"type": ["string", "null"]}, {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": ["boolean", "number"]}}]}]}'),
    ("recursive definitions", '{"$ref": "#/definitions/node", "definitions": {"node": {"type": "object", "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/definitions/node"}}}, "required": ["value"]}}}'),
    ("ref into an array", '{"type": "object", "properties": {"a": {"$ref": "#/$defs/choices/1"}}, "$defs": {"choices": [{"type": "string"}, {"type": "boolean"}]}}'),
    ("additional properties schema", '{"type": "object", "properties": {"id": {"type": "integer"}, "*": {"type": "string"}, "ab": {}, "ac": {}}, "required": ["id"], "additionalProperties": {"type": "array", "items": {"type": "integer"}}}'),
    ("allOf with refs and anyOf", '{"allOf": [{"$ref": "#/$defs/base"}, {"type": "object", "properties": {"extra": {"type": "string"}}}, {"anyOf": [{"type": "object", "properties": {"opt1": {"type": "integer"}}}, {"type": "object", "properties": {"opt2": {"type": "boolean"}}}]}], "$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}}'),
    ("allOf enum intersection", '{"allOf": [{"enum": ["a", "b", "c"]}, {"enum": ["b", "c", "d"]}, {"enum": ["c", "b"]}]}'),
    ("conflicting rule names", '{"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}, "a-b": {"type": "string"}, "a b": {"type": "boolean"}}, "required": ["a", "a-b", "a b"]}'),
    ("tuple and array limits", '{"type": "object", "properties": {"t": {"type": "array", "items": [{"type": "integer"}, {"type": "string"}]}, "l": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4}, "one": {"type": "array", "minItems": 1}}}'),
    ("number spellings", '{"enum": [0, -0.0, 18446744073709551615, 18446744073709551616, -9223372036854775808, -9223372036854775809, 1E3, 1.0e-4, 5e-324, 1.7976931348623157e308, ' + ", ".join(FLOATS) + ']}'),
    ("unknown type", '{"type": "kaboom"}'),
    ("remote ref", '{"$ref": "https://example.com/schema.json"}'),
    ("unresolvable ref", '{"$ref": "#/$defs/missing"}'),
    ("negative minItems", '{"type": "array", "minItems": -1}'),
    ("empty enum", '{"enum": []}'),
    ("properties not an object", '{"type": "object", "properties": [1]}'),
    ("invalid pattern", '{"type": "string", "pattern": "^[a-z$"}'),
    ("items false", '{"type": "array", "items": false}'),
    ("non-object schema", '"string"'),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOG_LINE = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")


def grammar_from_log(text):
    """The text after 'Converted grammar: ' up to the next log line, without its last newline."""
    start = text.find("Converted grammar: ")
    if start < 0:
        return None
    lines = text[start + len("Converted grammar: "):].split("\n")
    grammar = []
    for i, line in enumerate(lines):
        if i > 0 and LOG_LINE.match(line):
            break
        grammar.append(line)
    return "\n".join(grammar).rstrip("\n")


def main():
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="schema-srv-", suffix=".log", delete=False)
    server = subprocess.Popen(
        [SERVER, "-m", MODEL, "--host", "127.0.0.1", "--port", str(port), "-c", "512", "--verbose"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        cases = []
        for name, schema in CASES:
            offset = os.path.getsize(log.name)
            body = '{"prompt": "hi", "n_predict": 1, "json_schema": ' + schema + "}"
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
            error = None
            try:
                urllib.request.urlopen(req, timeout=60).read()
            except urllib.error.HTTPError as e:
                error = json.loads(e.read())["error"]["message"]
            time.sleep(0.3)
            with open(log.name, encoding="utf-8", errors="replace") as f:
                f.seek(offset)
                grammar = grammar_from_log(f.read())
            # a null json_schema is no constraint: no grammar, no error
            status = "SUCCESS" if grammar is not None else "FAILURE" if error else "UNCONSTRAINED"
            case = {"name": name, "status": status,
                    "schema": schema, "grammar": grammar or ""}
            if error is not None:
                case["error"] = error
            if name in NEEDS_EXACT_FLOATS:
                case["exact_floats"] = True
            cases.append(case)
            print(f"{case['status']:8} {name}" + (f"  [{error}]" if error else ""))
    finally:
        server.terminate()
        server.wait()
        os.unlink(log.name)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(cases, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(cases)} cases -> {OUT}")


main()
