#!/usr/bin/env bash
# On the lent GPU machine (after scripts/device-pack.sh here, carrying .device): A/B of engine
# settings given as environment assignments, on the benchmark model's shape cut to -l layers
# (written in seconds), each variant through the same `bloomery-bench` in one call, then
# upstream's CUDA llama-bench on the same file when it is built under $WORK (bench-gpu.sh or
# `upstream.sh --cuda` builds it there). With -c, every variant first runs bloomery-gpu-check on
# tiny synthetic files (its kernels against the CPU and its placements' greedy tokens) and the
# variant's figures are printed only if that passes.
# Usage: scripts/gpu-ab.sh [-l LAYERS] [-p PROMPT] [-n TOKENS] [-r REPS] [-c] VARIANT...
#   e.g. scripts/gpu-ab.sh -c "" "BLOOMERY_PDL=1" "BLOOMERY_PDL=1 BLOOMERY_MMV_ITEMS=2"
# ("" is the defaults). Prints one line per variant: pp and tg tok/s (mean +- sd of the reps).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
D=.device
W="${WORK:-/tmp/bloomery-bench}"
L=12 P=512 N=128 R=3 C=0
while getopts "l:p:n:r:c" o; do
  case $o in l) L=$OPTARG ;; p) P=$OPTARG ;; n) N=$OPTARG ;; r) R=$OPTARG ;; c) C=1 ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || set -- ""
mkdir -p "$W/ab" || exit 1
M="$W/ab/qwen3-30b-a3b-L$L-q4_K.gguf"
if [ ! -f "$M" ]; then
  "$D/make-synthetic" --preset qwen3-30b-a3b --layers "$L" --type q4_K --vocab "$D/vocab.gguf" \
    --out "$M.part" >/dev/null && mv "$M.part" "$M" || exit 1
fi
if [ "$C" = 1 ]; then
  T="$W/ab/tiny"
  mkdir -p "$T"
  for p in tiny-qwen3 tiny-qwen3moe; do
    [ -f "$T/$p.gguf" ] || "$D/make-synthetic" --preset $p --type q4_K --vocab "$D/vocab.gguf" \
      --out "$T/$p.gguf" >/dev/null || exit 1
  done
fi
for v in "$@"; do
  read -ra ENVS <<<"$v"
  if [ "$C" = 1 ]; then
    if ! env "${ENVS[@]}" "$D/bloomery-gpu-check" "$T/tiny-qwen3.gguf" "$T/tiny-qwen3moe.gguf" \
      >"$W/ab/check.log" 2>&1; then
      echo "[${v:-defaults}] gpu-check FAILED:"
      grep -v " ok$" "$W/ab/check.log" | tail -n 20
      continue
    fi
  fi
  echo "[${v:-defaults}]"
  env "${ENVS[@]}" "$D/bloomery-bench" -m "$M" --gpu 0 -t "$(nproc)" -u 512 -p "$P" -n "$N" \
    -r "$R" 2>"$W/ab/bench.log" | grep "|" || tail -n 5 "$W/ab/bench.log"
done
UP="$W/up/b/bin/llama-bench"
if [ -x "$UP" ]; then
  echo "[upstream]"
  "$UP" -m "$M" -ngl 99 -t "$(nproc)" -b 2048 -ub 512 -p "$P" -n "$N" -r "$R" 2>&1 | grep "|"
fi
