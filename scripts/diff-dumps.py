#!/usr/bin/env python3
"""Compares two tensor dumps of one forward pass, tensor by tensor, in graph order.

ours:     BLOOMERY_DUMP=DIR (src/engine/dump.rs), files SEQ-NAME-WIDTHxROWS.f32
upstream: llama-eval-callback built with the dump patch (docs/NUMERICS.md), files
          SEQ-NAME-NE0xNE1xNE2xNE3.f32

Prints, for each name present in both, the largest absolute difference and the RMS of the
difference relative to the RMS of upstream's values. Where the row counts differ (upstream keeps
only the output rows after the last layer's attention), the last rows are compared.
Usage: diff-dumps.py OURS_DIR UPSTREAM_DIR [--first N]
"""
import re
import sys
from pathlib import Path

import numpy as np

PAT = re.compile(r"^(\d+)-(.+)-(\d+(?:x\d+)+)\.f32$")


def load(d, last=True):
    out = {}
    for p in sorted(Path(d).iterdir()):
        m = PAT.match(p.name)
        if not m:
            continue
        seq, name, dims = int(m.group(1)), m.group(2), [int(x) for x in m.group(3).split("x")]
        if name in out and not last:
            continue
        out[name] = (seq, dims, p)
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    first = "--first" in sys.argv
    ours, theirs = load(args[0], last=not first), load(args[1], last=not first)
    rows = []
    for name, (seq, dims, p) in ours.items():
        if name not in theirs:
            continue
        a = np.fromfile(p, dtype=np.float32)
        b = np.fromfile(theirs[name][2], dtype=np.float32)
        w = dims[0]
        ta, tb = a.size // w, b.size // (theirs[name][1][0] or 1)
        if theirs[name][1][0] != w and a.size % b.size and b.size % a.size:
            rows.append((seq, name, f"shapes differ: {dims} vs {theirs[name][1]}"))
            continue
        n = min(a.size, b.size)
        a, b = a[-n:], b[-n:]
        d = np.abs(a.astype(np.float64) - b)
        rel = np.sqrt(np.mean(d**2)) / max(np.sqrt(np.mean(b.astype(np.float64) ** 2)), 1e-30)
        rows.append((seq, name, f"max |d| {d.max():.3e}  rms rel {rel:.3e}  (|b| max {np.abs(b).max():.3e}, {n} values)"))
    for _, name, text in sorted(rows):
        print(f"{name:>22}  {text}")


if __name__ == "__main__":
    main()
