#!/usr/bin/env bash
# On the lent GPU machine (after scripts/device-pack.sh here, carrying .device): builds upstream's
# CUDA llama-bench from the packed sources in the background (llama-server needs its web UI assets, which this offline machine cannot provision), writes the synthetic
# Qwen3-30B-A3B-shaped Q4_K model with our writer, and prints pp512, pp4096 and tg128 tok/s for
# bloomery (whole model on the card) and upstream (-ngl 99), measured in the same run, with
# ratios. Logs and raw numbers go to $OUT (or $WORK).
# Usage: scripts/bench-gpu.sh [-r REPS] [-m MODEL.gguf]
set -euo pipefail
cd "$(dirname "$0")/.."
D=.device
W="${WORK:-/tmp/bloomery-bench}"
LOG="${OUT:-$W}"
R=3 M=""
while getopts "r:m:" o; do
  case $o in r) R=$OPTARG ;; m) M=$OPTARG ;; *) exit 2 ;; esac
done
mkdir -p "$W/up" "$LOG"
UP="$W/up/b/bin/llama-bench"
if [ ! -x "$UP" ]; then
  (tar xf "$D/llama-src.tar.xz" -C "$W/up" &&
    cmake -S "$W/up" -B "$W/up/b" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF &&
    cmake --build "$W/up/b" -j "$(nproc)" --target llama-bench) >"$LOG/upstream-build.log" 2>&1 &
  build=$!
else
  build=""
fi
if [ -z "$M" ]; then
  M="$W/qwen3-30b-a3b-q4_K.gguf"
  [ -f "$M" ] || { time "$D/make-synthetic" --preset qwen3-30b-a3b --type q4_K --vocab "$D/vocab.gguf" --out "$M"; }
fi
ours() { # -p P -n N -> mean tok/s (0 when the run failed, its error in ours.txt)
  local v
  v=$("$D/bloomery-bench" -m "$M" --gpu 0 -u 512 -r "$R" "$@" 2>>"$LOG/ours.txt" | tee -a "$LOG/ours.txt" |
    awk -F'|' '/ (pp|tg)[0-9]/ {split($5, a, " "); print a[1]}') || true
  echo "${v:-0}"
}
pp512=$(ours -p 512 -n 0)
pp4096=$(ours -p 4096 -n 0)
tg128=$(ours -p 0 -n 128)
if [ -n "$build" ]; then
  wait "$build" || { tail -30 "$LOG/upstream-build.log"; exit 1; }
fi
"$UP" -m "$M" -ngl 99 -p 512,4096 -n 128 -ub 512 -r "$R" -o json >"$LOG/upstream.json" 2>"$LOG/upstream-bench.log"
python3 - "$LOG/upstream.json" "$pp512" "$pp4096" "$tg128" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
up = {}
for r in rows:
    key = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    up[key] = r["avg_ts"]
ours = dict(zip(["pp512", "pp4096", "tg128"], map(float, sys.argv[2:5])))
print(f"{'test':<8} {'bloomery':>10} {'upstream':>10} {'ratio':>7}")
for k, v in ours.items():
    u = up.get(k, 0.0)
    print(f"{k:<8} {v:>10.1f} {u:>10.1f} {v / u if u else float('nan'):>7.2f}")
PY
