#!/usr/bin/env python3
"""Compares greedy /completion answers saved by scripts/gpu-vs-upstream.sh: for each model and
each bloomery engine (card, cpu), how many generated tokens equal upstream's (counted up to the
first difference, per prompt), and the largest difference of a top-5 logprob over the positions
where both generated the same tokens so far and name the same candidate.

usage: compare-completions.py RESULTS_DIR MODEL...
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


def main():
    root = Path(sys.argv[1])
    print(f"{'model':28} {'engine':6} {'tokens equal':>14} {'max logprob gap':>16}")
    for model in sys.argv[2:]:
        up = load(root / f"{model}.upstream.json")
        for engine in ("card", "cpu"):
            ours = load(root / f"{model}.{engine}.json")
            if isinstance(up, str) or isinstance(ours, str):
                print(f"{model:28} {engine:6} {'no answer':>14}")
                continue
            same, total, gap = compare(up, ours)
            print(f"{model:28} {engine:6} {f'{same}/{total}':>14} {gap:16.4f}")


if __name__ == "__main__":
    main()
