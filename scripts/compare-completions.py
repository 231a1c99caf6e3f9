#!/usr/bin/env python3
"""Compares greedy /completion answers saved by scripts/gpu-vs-upstream.sh: for each model and
each engine (bloomery on the card and on the CPU; upstream's own CPU backend, `upcpu`, when it
was run), how many generated tokens equal upstream's (counted up to the
first difference, per prompt), and the largest difference of a top-5 logprob over the positions
where both generated the same tokens so far and name the same candidate.

usage: compare-completions.py [--detail] RESULTS_DIR MODEL...
--detail also prints, per prompt, where the tokens first differ and the logprob gap at the first
generated position (before any difference, so it measures the prompt's numerics alone).
"""
import json
import sys
from pathlib import Path


def load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return str(e)


def compare(up, ours):
    same = total = 0
    gap = 0.0
    for a, b in zip(up, ours):
        pa, pb = a.get("completion_probabilities", []), b.get("completion_probabilities", [])
        total += len(pa)
        for x, y in zip(pa, pb):
            lx = {t["id"]: t["logprob"] for t in x["top_logprobs"]}
            for t in y["top_logprobs"]:
                if t["id"] in lx:
                    gap = max(gap, abs(lx[t["id"]] - t["logprob"]))
            if x["id"] != y["id"]:
                break
            same += 1
    return same, total, gap


def detail(up, ours):
    for i, (a, b) in enumerate(zip(up, ours)):
        pa, pb = a.get("completion_probabilities", []), b.get("completion_probabilities", [])
        first = next((j for j, (x, y) in enumerate(zip(pa, pb)) if x["id"] != y["id"]), None)
        gap0 = 0.0
        if pa and pb:
            lx = {t["id"]: t["logprob"] for t in pa[0]["top_logprobs"]}
            gap0 = max((abs(lx[t["id"]] - t["logprob"]) for t in pb[0]["top_logprobs"] if t["id"] in lx), default=0.0)
        where = "none" if first is None else str(first)
        top = ""
        if first is not None:
            x, y = pa[first], pb[first]
            top = (f" upstream {[(t['id'], round(t['logprob'], 3)) for t in x['top_logprobs'][:3]]}"
                   f" ours {[(t['id'], round(t['logprob'], 3)) for t in y['top_logprobs'][:3]]}")
        print(f"    prompt {i}: first difference at {where}, gap at 0 {gap0:.4f}{top}")


def main():
    args = sys.argv[1:]
    show = args[0] == "--detail"
    if show:
        args = args[1:]
    root = Path(args[0])
    sys.argv = [sys.argv[0]] + args
    print(f"{'model':28} {'engine':6} {'tokens equal':>14} {'max logprob gap':>16}")
    for model in sys.argv[2:]:
        up = load(root / f"{model}.upstream.json")
        for engine in ("card", "cpu", "upcpu"):
            if not (root / f"{model}.{engine}.json").exists():
                continue
            ours = load(root / f"{model}.{engine}.json")
            if isinstance(up, str) or isinstance(ours, str):
                print(f"{model:28} {engine:6} {'no answer':>14}")
                continue
            same, total, gap = compare(up, ours)
            print(f"{model:28} {engine:6} {f'{same}/{total}':>14} {gap:16.4f}")
            if show:
                detail(up, ours)


if __name__ == "__main__":
    main()
