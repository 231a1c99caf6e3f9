#!/usr/bin/env bash
# On the lent GPU machine (after scripts/device-pack.sh here, carrying .device): the time of each
# CUDA kernel bloomery's engine runs, read by Nsight Compute with the clocks left alone, for decode
# steps and for one prompt ubatch of a model with the benchmark model's layer shapes (the
# qwen3-30b-a3b preset cut to -l layers, so it is written in seconds). Prints, per kernel name,
# how many ran, their total and mean time, and the total per decode step or per ubatch.
# ncu runs kernels one at a time, so these are kernel times without overlap or launch gaps:
# compare their sum with the step's wall time from bloomery-bench to see the gaps.
# Usage: scripts/gpu-profile.sh [-l LAYERS] [-p PROMPT] [-n TOKENS] [-- placement flags]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
D=.device
W="${WORK:-/tmp/bloomery-prof}"
LOG="${OUT:-$W}"
L=2 P=512 N=4
while getopts "l:p:n:" o; do
  case $o in l) L=$OPTARG ;; p) P=$OPTARG ;; n) N=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
PLACE=("$@")
mkdir -p "$W" "$LOG" || exit 1
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || {
  echo "no ncu on this machine" >&2
  exit 1
}
M="$W/qwen3-30b-a3b-L$L-q4_K.gguf"
if [ ! -f "$M" ]; then
  "$D/make-synthetic" --preset qwen3-30b-a3b --layers "$L" --type q4_K --vocab "$D/vocab.gguf" \
    --out "$M.part" && mv "$M.part" "$M" || exit 1
fi

# NAME STEPS BENCH-ARGS...: profiles one bloomery-bench run and prints the per-kernel table,
# with totals divided by STEPS.
profile() {
  local name=$1 steps=$2
  shift 2
  local csv="$LOG/ncu-$name.csv"
  echo "== $name: bloomery-bench $* ${PLACE[*]:+-- ${PLACE[*]}}"
  "$D/bloomery-bench" -m "$M" --gpu 0 -r 1 --no-warmup -t "$(nproc)" "$@" ${PLACE[@]:+-- "${PLACE[@]}"} 2>&1 | tail -3
  "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$D/bloomery-bench" -m "$M" --gpu 0 -r 1 --no-warmup -t "$(nproc)" "$@" ${PLACE[@]:+-- "${PLACE[@]}"} \
    >"$csv" 2>"$LOG/ncu-$name.err" || {
    echo "ncu failed; the end of its log:"
    tail -n 8 "$LOG/ncu-$name.err" "$csv"
    return
  }
  python3 - "$csv" "$steps" "$L" <<'PY'
import csv, sys, collections
path, steps, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = [l for l in open(path) if l.startswith('"')]
tot, cnt = collections.defaultdict(float), collections.Counter()
for row in csv.DictReader(lines):
    if row.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = row["Kernel Name"].split("(")[0]
    name = name if len(name) < 60 else name[:57] + "..."
    tot[name] += float(row["Metric Value"].replace(",", "")) / 1e3
    cnt[name] += 1
all_us = sum(tot.values())
print(f"{'kernel':60} {'count':>7} {'us/step':>10} {'mean us':>9} {'share':>6}")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
    print(f"{k:60} {cnt[k]:7d} {v / steps:10.1f} {v / cnt[k]:9.2f} {100 * v / all_us:5.1f}%")
print(f"{'all kernels':60} {sum(cnt.values()):7d} {all_us / steps:10.1f}   ({layers} layers)")
PY
}

profile "decode" "$N" -p 0 -n "$N"
profile "prompt" 1 -p "$P" -n 0 -b "$P"
