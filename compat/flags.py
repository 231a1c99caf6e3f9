"""Flag conformance: every option of upstream llama-server's `--help`, in every spelling and through
its `LLAMA_ARG_*` variable, run through both programs' argument parsers.

Upstream reads its arguments left to right and `--version` prints and exits 0 when it is reached, so
`llama-server OPT VALUE --version` exiting 0 means OPT and VALUE were accepted, and a refused value
exits 1 with the refusal on stderr before `--version` is read. The variables are read before any
argument, so `LLAMA_ARG_X=VALUE llama-server --version` checks a variable the same way. The options
that answer by exiting (`--help`, `--list-devices`, ...) are run alone.

Each option gets a representative valid value (from its value hint, or the small table below where
the hint is not enough), a bad one (`x`, or a missing file for options naming a file) and, for a
number, one with text after it (`1x`); the results of the last two are recorded whatever they
are. Upstream's answers are recorded under compat/golden/b11434/flags/, one file per help group,
so checking bloomery needs no upstream binary.

Bloomery passes a case when it gives the same exit status and the same refusal line and usage
head, or the same warnings, and, for an accepted value, `--print-config` shows that the value
landed: the option's origin is the spelling or variable used, every spelling and the variable land
the same, and the resolved values differ from the default run (for an option with `--no-`
spellings, the two polarities differ from each other). Where upstream's help states a literal
default (`(default: 512)`), ours must state the same. Options whose feature is not built yet are
listed from `--print-config`'s `not_built`; other differences are explained in
compat/flags-known-differences.json ("parsing": accepted or refused unlike upstream; "effect":
parsed alike but without upstream's effect), and anything else fails.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent
GOLDEN = ROOT / "golden" / "b11434" / "flags"
KNOWN = ROOT / "flags-known-differences.json"

# Options upstream answers by printing and exiting; they are run alone, and their first stdout line
# (digits masked) is compared along with the exit status.
EXITS = {"-h", "--help", "--usage", "--version", "-cl", "--cache-list", "--completion-bash",
         "--list-devices"}
# Hints of one number.
NUMERIC_HINTS = {"N", "<0|1>", "<0...100>", "P", "L", "SIMILARITY", "SECONDS", "PORT"}
# Hints naming a file or folder: their bad value is a path that does not exist.
PATH_HINTS = {"FNAME", "FILE", "PATH", "DIR", "JINJA_TEMPLATE_FILE"}

# Valid values the hint alone does not give, by any spelling of the option.
BY_NAME = {
    "--prio": "2", "--prio-batch": "2", "--prio-draft": "2", "--prio-batch-draft": "2",
    "--numa": "isolate",
    "--chat-template-kwargs": '{"k": "v"}',
    "--slot-save-path": "$DIR", "--media-path": "$DIR", "--path": "$DIR", "--models-dir": "$DIR",
    "--log-prompts-dir": "$DIR",
    # written to: kept apart from the file the other options read
    "--log-file": "$DIR/log.txt",
    "--load-mode": "mlock", "--lazy-mode": "off",
    "--reasoning-format": "none",
    "--spec-draft-sampling": "probabilistic",
    "--fit": "off",
}
# Valid values by value hint.
BY_HINT = {
    "FNAME": "$FILE", "FILE": "$FILE", "PATH": "$FILE", "JINJA_TEMPLATE_FILE": "$FILE",
    "DIR": "$DIR",
    "TYPE": "q8_0",
    "M": "ff",
    "lo-hi": "0-3",
    "<0|1>": "1",
    "<0...100>": "7",
    "[on|off|auto]": "on",
    "SAMPLERS": "top_k;temperature",
    "SEQUENCE": "kt",
    "TOKEN_ID(+/-)BIAS": "15043+1",
    "SCHEMA": '{"type": "object"}', "JSON": '{"type": "object"}',
    "KEY=TYPE:VALUE,...": "a.b=bool:false",
    "<tensor name pattern>=<buffer type>,...": "exps=CPU",
    "FNAME:SCALE,...": "$FILE:0.5",
    "START END": ["1", "5"],
    "<dev1,dev2,..>": "none", "DEVICE": "none",
    "N0,N1,N2,...": "3,1",
    "MiB0,MiB1,MiB2,...": "512",
    "HOST": "0.0.0.0",
    "TOOL1,TOOL2,...": "read_file",
    "OPTION": "docker:img",
    "LEVEL": "high",
    "JINJA_TEMPLATE": "chatml",
    "SIMILARITY": "0.5", "P": "0.5", "L": "0.5",
    "P0,P1,...": "0.5,0.25",
    "a|bp|N+M": "0+1",
    "DEV=SIZE,...": "CPU=1G",
}


def negative(spelling):
    return spelling.startswith("--no-") or spelling.startswith("-no-")


class Option:
    def __init__(self, group, spellings, hint, env):
        self.group, self.spellings, self.hint, self.env = group, spellings, hint, env
        self.help = ""

    def is_switch(self):
        return not self.hint

    def negatives(self):
        """A switch's negative spellings. The help lists the positive ones first; the negative
        ones start at the first `--no-` spelling, or at the short one just before it
        (`-nkvo, --no-kv-offload`). A switch spelled only negatively is a plain flag."""
        s = self.spellings
        first = next((i for i, x in enumerate(s) if negative(x)), None)
        if not self.is_switch() or first in (None, 0):
            return []
        if first > 1 and not s[first - 1].startswith("--") and s[first - 2].startswith("--"):
            first -= 1
        return s[first:]


def split_head(line):
    """An option's first help line: its spellings and value hint. Upstream pads the spellings to
    column 40, or puts the help on the next line when they are longer than 37."""
    head = line[:40].rstrip() if len(line) > 40 and line[39] == " " and len(line[:40].rstrip()) <= 37 \
        else line.rstrip()
    spellings, rest = [], []
    for piece in (p.strip() for p in head.split(",")):
        # a hint may itself hold commas (`N0,N1,...`); spellings always start with '-'
        if not rest and piece.startswith("-"):
            name, _, hint = piece.partition(" ")
            spellings.append(name)
            if hint:
                rest.append(hint)
        else:
            rest.append(piece)
    return spellings, ",".join(rest)


def parse_help(text):
    options, group = [], ""
    for line in text.splitlines():
        m = re.fullmatch(r"----- (.*) -----", line)
        if m:
            group = m.group(1)
        elif line.startswith("-"):
            spellings, hint = split_head(line)
            options.append(Option(group, spellings, hint, None))
            options[-1].help = line[40:]
        elif options:
            m = re.fullmatch(r"\s*\(env: (\w+)\)", line)
            if m:
                options[-1].env = m.group(1)
            else:
                options[-1].help += " " + line.strip()
    return options


def stated_default(help_text):
    """The first value of the `(default: ...)` a help text states, or None."""
    m = re.search(r"\(default: ([^)]*)\)", help_text)
    return re.split(r"[,;]| = ", m.group(1))[0].strip().strip("'\"") if m else None


def documented_default(help_text):
    """The default a help text states when it is a literal value (a number, a boolean word or an
    enum word), which both programs' help must agree on; None for a default stated in words."""
    first = stated_default(help_text)
    return first if first is not None and re.fullmatch(r"-?[\d.]+|[a-z0-9_]+", first) else None


def good_value(o):
    if o.is_switch():
        return []
    for s in o.spellings:
        if s in BY_NAME:
            return [BY_NAME[s]]
    if o.hint in BY_HINT:
        v = BY_HINT[o.hint]
        return v if isinstance(v, list) else [v]
    if o.hint.startswith("{"):
        return [o.hint.strip("{}").split(",")[-1]]
    if o.hint.startswith("none,draft"):
        return ["ngram-mod"]
    return ["7"]


def bad_value(o):
    bad = "$DIR/missing/x" if o.hint in PATH_HINTS else "x"
    return [bad] * len(good_value(o))


def edge_value(o):
    """For a numeric value: a number with text after it, which std::stoi and std::stof read up
    to the text."""
    return ["1x"] if o.hint in NUMERIC_HINTS else None


def make_cases(o):
    """The command lines and environments one option is checked with. `kind` is "exit" (run
    alone), "good", "bad" or "edge" (the value), "on"/"off" for a switch's variable."""
    if any(s in EXITS for s in o.spellings):
        return [{"kind": "exit", "args": [s], "env": {}} for s in o.spellings]
    values = [("good", good_value(o))]
    if not o.is_switch():
        values.append(("bad", bad_value(o)))
    if edge_value(o):
        values.append(("edge", edge_value(o)))
    cases = []
    for kind, value in values:
        for s in o.spellings:
            cases.append({"kind": kind, "args": [s] + value, "env": {}})
        if o.env:
            if o.is_switch():
                continue
            cases.append({"kind": kind, "args": [], "env": {o.env: " ".join(value)}})
    if o.env and o.is_switch():
        cases += [{"kind": "on", "args": [], "env": {o.env: "1"}},
                  {"kind": "off", "args": [], "env": {o.env: "0"}},
                  {"kind": "bad", "args": [], "env": {o.env: "x"}}]
        if o.negatives():
            no = o.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)
            cases.append({"kind": "off", "args": [], "env": {no: "1"}})
    return cases


def case_name(case):
    parts = [f"{k}={v}" for k, v in case["env"].items()] + case["args"]
    return " ".join(json.dumps(p) if (" " in p or not p) else p for p in parts)


class Sandbox:
    """A scratch HOME (no config files, an empty model cache), a valid file and folder for the
    options that name one, and a minimal environment free of the caller's LLAMA_ARG_* variables."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="bloomery-flags-")
        self.file = os.path.join(self.dir, "value.json")
        # valid as a key file, template, grammar, schema and JSON file
        Path(self.file).write_text('{"type": "object"}\n')
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.dir,
                    "XDG_CONFIG_HOME": os.path.join(self.dir, "config"),
                    "XDG_CACHE_HOME": os.path.join(self.dir, "cache"), "LANG": "C"}

    def expand(self, s):
        return s.replace("$FILE", self.file).replace("$DIR", self.dir)

    def mask(self, s):
        return s.replace(self.file, "$FILE").replace(self.dir, "$DIR")

    def run(self, binary, case, suffix):
        env = dict(self.env)
        env.update({k: self.expand(v) for k, v in case["env"].items()})
        args = [binary] + [self.expand(a) for a in case["args"]] + suffix
        try:
            p = subprocess.run(args, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        except subprocess.TimeoutExpired:
            # a program that took `--version`/`--print-config` as a value starts serving instead
            return -1, "", "error: still running after 30 s (started serving?)"
        return p.returncode, self.mask(p.stdout.decode("utf-8", "replace")), \
            self.mask(p.stderr.decode("utf-8", "replace"))

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def refusal(stderr):
    """The refusal's shape: its error line and the spellings-and-hint column of the usage it
    shows (the help sentence after it is each program's own)."""
    lines = stderr.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("error"):
            shape = line
            if i + 3 < len(lines) and lines[i + 2] == "usage:":
                shape += " | usage: " + lines[i + 3][:40].rstrip()
            return shape
    return None


def first_line(text):
    return re.sub(r"\d+", "#", text.splitlines()[0]) if text.strip() else ""


# Lines that are no warning about the options: the version, upstream's log prefix, the warnings
# upstream's CPU build gives for GPU options (a CUDA build gives none), and ours naming features
# not built yet (listed from --print-config instead).
NOT_WARNINGS = ("version: ", "built with ", "warning: no usable GPU found",
                "warning: one possible reason is", "warning: consult docs/build.md",
                "warning: llama.cpp was compiled without", "warn: not built yet: ")
LOG_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [IWE] ")


def warnings(stderr):
    """The warnings printed while the options were read."""
    lines = (LOG_PREFIX.sub("", line) for line in stderr.splitlines())
    return [line for line in lines if line and not line.startswith(NOT_WARNINGS)]


def observe(binary, box, case, ours):
    """One case's result. Upstream is stopped at `--version`; bloomery too, for the warnings it
    prints while reading the options, and at `--print-config` when the value is accepted, so
    where it landed can be checked."""
    if case["kind"] == "exit":
        rc, out, err = box.run(binary, case, [])
        return {"exit": rc, "stdout": first_line(out)}
    rc, out, err = box.run(binary, case, ["--version"])
    res = {"exit": rc, "refusal": refusal(err) if rc else None,
           "warnings": None if rc else warnings(err)}
    if not ours and rc == 0:
        # upstream's logger writes from a thread that `--version`'s exit() does not wait for, so
        # a warning can be lost on a busy machine (never one too many): the longest of 3 runs
        for _ in range(2):
            again = warnings(box.run(binary, case, ["--version"])[2])
            if len(again) > len(res["warnings"]):
                res["warnings"] = again
    if ours and rc == 0:
        rc, out, err = box.run(binary, case, ["--print-config"])
        try:
            res["config"] = json.loads(out)
        except ValueError:
            res["exit"], res["refusal"] = -1, f"--print-config exited {rc} with no JSON"
    return res


def run_all(binary, box, cases, ours):
    with ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 2) * 2)) as pool:
        return list(pool.map(lambda c: observe(binary, box, c, ours), cases))


def upstream_answers(upstream):
    """Every option of upstream's `--help` with its cases and upstream's answers, by help group."""
    box = Sandbox()
    try:
        p = subprocess.run([upstream, "--help"], env=box.env, capture_output=True, text=True)
        plan = [(o, make_cases(o)) for o in parse_help(p.stdout)]
        results = iter(run_all(upstream, box, [c for _, cs in plan for c in cs], ours=False))
    finally:
        box.close()
    groups = {}
    for o, cs in plan:
        for c in cs:
            c.update(next(results))
        groups.setdefault(o.group, {"group": o.group, "options": []})["options"].append(
            {"spellings": o.spellings, "negatives": o.negatives(), "hint": o.hint, "env": o.env,
             "default": documented_default(o.help), "cases": cs})
    return list(groups.values())


def record(upstream):
    """Writes upstream's answers, one golden file per help group, and returns them."""
    groups = upstream_answers(upstream)
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for old in GOLDEN.glob("*.json"):
        old.unlink()
    for i, g in enumerate(groups):
        path = GOLDEN / f"{i:02}-{g['group'].replace(' ', '-')}.json"
        path.write_text(json.dumps(g, indent=1, ensure_ascii=False) + "\n")
    return groups


def load_goldens():
    return [json.loads(p.read_text()) for p in sorted(GOLDEN.glob("*.json"))]


def values(config):
    """The resolved values alone, without where they came from."""
    doc = json.loads(json.dumps(config))
    doc["config"].pop("origins", None)
    doc["config"].pop("not_built", None)

    def strip(v):
        if isinstance(v, dict):
            if set(v) == {"value", "source"}:
                return strip(v["value"])
            return {k: strip(x) for k, x in v.items()}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return strip(doc)


def origin_of(case):
    if case["args"]:
        return {"flag": case["args"][0]}
    (var, _), = case["env"].items()
    return {"env": var}


def check_option(opt, got, baseline, our_help):
    """The first difference between upstream's recorded answers for one option and ours, or None;
    and the features not built that our answers name. `our_help` is our help text for it."""
    pending = set()
    if opt.get("default") is not None and stated_default(our_help) != opt["default"]:
        return f"documented default: upstream {opt['default']}, ours {stated_default(our_help)}", pending
    by_case = list(zip(opt["cases"], got))
    for case, res in by_case:
        name = case_name(case)
        if case["kind"] == "exit":
            if res["exit"] != case["exit"] or res["stdout"] != case["stdout"]:
                return (f"{name}: upstream exit {case['exit']} `{case['stdout']}`, "
                        f"ours exit {res['exit']} `{res['stdout']}`"), pending
            continue
        if (res["exit"] == 0) != (case["exit"] == 0) or (case["exit"] and res["exit"] != case["exit"]):
            theirs = f"exit {case['exit']}" + (f" `{case['refusal']}`" if case["refusal"] else "")
            ours = f"exit {res['exit']}" + (f" `{res['refusal']}`" if res.get("refusal") else "")
            return f"{name}: upstream {theirs}, ours {ours}", pending
        if case["exit"]:
            if res["refusal"] != case["refusal"]:
                return f"{name}: upstream `{case['refusal']}`, ours `{res['refusal']}`", pending
            continue
        if res["warnings"] != case["warnings"]:
            return f"{name}: upstream warns {case['warnings']}, ours {res['warnings']}", pending
        config = res["config"]["config"]
        pending |= {n["feature"] for n in config.get("not_built", [])}
        if case["kind"] in ("bad", "edge"):
            continue
        if case["kind"] in ("good", "on") and origin_of(case) not in config.get("origins", {}).values():
            return f"{name}: ours records no origin {origin_of(case)}", pending
    # where the value landed: every spelling and the variable land the same, and it changes
    # something (a switch with `--no-` spellings: its two polarities differ)
    toggle = bool(opt["negatives"])
    landed = {}
    for c, r in by_case:
        if c["exit"] == 0 and c["kind"] in ("good", "on", "off"):
            negated = bool(c["args"]) and c["args"][0] in opt["negatives"]
            on = c["kind"] == "on" or (c["kind"] == "good" and not negated)
            landed.setdefault(on, []).append((case_name(c), values(r["config"])))
    for on, seen in landed.items():
        for name, v in seen[1:]:
            if v != seen[0][1]:
                return f"{name} lands elsewhere than {seen[0][0]}: {first_change(seen[0][1], v)}", pending
    if True in landed:
        name, v = landed[True][0]
        other = landed[False][0][1] if toggle and False in landed else baseline
        if v == other:
            return f"{name}: ours changed nothing in --print-config", pending
    if not toggle and False in landed and landed[False][0][1] != baseline:
        name, v = landed[False][0]
        return f"{name} changed {first_change(baseline, v)}", pending
    return None, pending


def first_change(a, b, path=""):
    """The path of the first value that differs between two --print-config documents."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_change(a.get(k), b.get(k), f"{path}.{k}")
    return f"{path}: {json.dumps(a)[:60]} -> {json.dumps(b)[:60]}"


def check(binary, goldens):
    """Runs every recorded case through bloomery. Returns (group, rows) per help group, one row
    per option: (spellings, result, detail). An explanation of a parsing difference that no longer
    differs is reported too, so the list of differences stays true."""
    known = json.loads(KNOWN.read_text())
    spellings = {s for g in goldens for o in g["options"] for s in o["spellings"]}
    stray = sorted(k for part in known.values() for k in part if k not in spellings)
    if stray:
        raise SystemExit(f"{KNOWN.name} names options upstream does not have: {', '.join(stray)}")
    box = Sandbox()
    try:
        base = box.run(binary, {"args": [], "env": {}}, ["--print-config"])
        baseline = values(json.loads(base[1]))
        ours_help = box.run(binary, {"args": [], "env": {}}, ["--help"])[1]
        helps = {o.spellings[0]: o.help for o in parse_help(ours_help)}
        flat = [c for g in goldens for o in g["options"] for c in o["cases"]]
        results = iter(run_all(binary, box, flat, ours=True))
    finally:
        box.close()
    report = []
    for g in goldens:
        rows = []
        for o in g["options"]:
            got = [next(results) for _ in o["cases"]]
            diff, pending = check_option(o, got, baseline, helps.get(o["spellings"][0], ""))
            name = ", ".join(o["spellings"])
            why = next((known["parsing"][s] for s in o["spellings"] if s in known["parsing"]), None)
            inert = next((known["effect"][s] for s in o["spellings"] if s in known["effect"]), None)
            if diff and why:
                rows.append((name, "differs (explained)", f"{why}; {diff}"))
            elif diff:
                rows.append((name, "differs", diff))
            elif why:
                rows.append((name, "explained but equal", f"remove it from {KNOWN.name}: {why}"))
            elif pending:
                rows.append((name, "not built yet", ", ".join(sorted(pending))))
            elif inert:
                rows.append((name, "effect differs", inert))
            else:
                rows.append((name, "equal", ""))
        report.append((g["group"], rows))
    return report


FAILING = ("differs", "explained but equal")


def upstream_drift(live, goldens):
    """The first place where upstream's answers now differ from the recorded goldens, or None."""
    def flat(groups):
        keys = ("exit", "refusal", "stdout", "warnings")
        return {(case_name(c), c["kind"]): {k: c.get(k) for k in keys}
                for g in groups for o in g["options"] for c in o["cases"]}
    now, then = flat(live), flat(goldens)
    for key in sorted(set(now) | set(then)):
        if now.get(key) != then.get(key):
            return f"{key[0]}: recorded {then.get(key)}, now {now.get(key)}"
    return None


def report_lines(report):
    """The flag part of REPORT.md: counts per help group, then every option whose effect differs."""
    cols = ["equal", "not built yet", "effect differs", "differs (explained)", "differs"]
    lines = ["## Flags", "",
             "Every option of upstream's `--help`, in every spelling and through its variable, with a "
             "valid value, a bad one and, for a number, one with text after it; and the literal "
             "defaults the two help texts state (compat/flags.py). \"Effect differs\": parsed as "
             "upstream parses it, but without upstream's effect (compat/flags-known-differences.json).",
             "",
             "| group | options | " + " | ".join(cols) + " | first difference |",
             "|---|---|" + "---|" * len(cols) + "---|"]
    for group, rows in report:
        counts = [sum(1 for _, r, _ in rows if r == c) for c in cols]
        first = next((f"{n}: {d}" for n, r, d in rows if r in FAILING), "")
        lines.append(f"| {group} | {len(rows)} | " + " | ".join(map(str, counts)) +
                     f" | {first.replace('|', '/')} |")
    lines += ["", "### Options whose effect differs", "", "| option | group | why |", "|---|---|---|"]
    for group, rows in report:
        for n, r, d in rows:
            if r != "equal":
                why = f"not built yet: {d}" if r == "not built yet" else f"{r}: {d}"
                lines.append(f"| {n} | {group} | {why.replace('|', '/')} |")
    return lines
