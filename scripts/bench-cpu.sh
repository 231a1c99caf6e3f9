#!/usr/bin/env bash
# Runs bloomery-bench and upstream's llama-bench (b11434, CPU) on the same models in one run and
# prints pp/tg tok/s for both and the ratio ours/upstream.
# Usage: scripts/bench-cpu.sh [-p 512] [-n 128] [-t 2] [MODEL.gguf ...]
# Default models: Gemma 3 270M, plus $BLOOMERY_CACHE/models/synthetic-qwen3moe.gguf when present.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
P=512 N=128 T=2
while getopts "p:n:t:" o; do
  case $o in p) P=$OPTARG ;; n) N=$OPTARG ;; t) T=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
  models=("$CACHE/models/gemma-3-270m-q4_k_m.gguf")
  moe="$CACHE/models/synthetic-qwen3moe.gguf"
  if [ -f "$moe" ]; then models+=("$moe"); else echo "note: $moe absent, qwen3moe not benchmarked" >&2; fi
fi
nice cargo build -q --release --bin bloomery-bench
UP_BIN="$(dirname "$(scripts/upstream.sh)")/llama-bench"
[ -x "$UP_BIN" ] || { echo "upstream llama-bench not found at $UP_BIN" >&2; exit 1; }

# prints "pp tg" tok/s
ours() {
  target/release/bloomery-bench -m "$1" -p "$P" -n "$N" -t "$T" |
    awk -F'|' '/ pp[0-9]/ {split($5, a, " "); pp=a[1]} / tg[0-9]/ {split($5, a, " "); tg=a[1]} END {print pp, tg}'
}
upstream() {
  "$UP_BIN" -m "$1" -p "$P" -n "$N" -t "$T" -r 1 -o json 2>/dev/null | python3 -c '
import json, sys
rows = json.load(sys.stdin)
pp = [r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0]
tg = [r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0]
print(pp[0] if pp else 0, tg[0] if tg else 0)'
}

printf "%-32s %-7s %12s %12s %8s\n" model test bloomery upstream ratio
for m in "${models[@]}"; do
  read -r opp otg < <(ours "$m")
  read -r upp utg < <(upstream "$m")
  name=$(basename "$m")
  for row in "pp$P $opp $upp" "tg$N $otg $utg"; do
    set -- $row
    ratio=$(python3 -c "print(f'{$2 / $3:.2f}' if $3 else 'n/a')")
    printf "%-32s %-7s %12.2f %12.2f %8s\n" "$name" "$1" "$2" "$3" "$ratio"
  done
done
