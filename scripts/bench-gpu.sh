#!/usr/bin/env bash
# On the lent GPU machine (after scripts/device-pack.sh here, carrying .device): builds upstream's
# CUDA llama-bench from the packed sources in the background unless $WORK already holds it
# (llama-server needs its web UI assets, which this offline machine cannot provision), writes the
# synthetic Qwen3-30B-A3B-shaped Q4_K model with our writer, and prints pp512, pp4096 and tg128
# tok/s for bloomery and upstream, measured in the same run, with ratios: one table per scenario.
#   card     the whole model on the card: ours --gpu 0, upstream -ngl 99.
#   cpumoe   dense weights on the card, every expert on the host: ours -- --cpu-moe, upstream
#            -ngl 99 -ncmoe <layers> (llama-bench has no --cpu-moe).
#   budget8  an 8 GiB card: ours under BLOOMERY_CARD_BUDGET=CUDA0=8G with no placement options
#            (the automatic plan spills experts; card slots follow decode's routing); upstream
#            with the smallest -ncmoe whose peak card memory stays within 8192 MiB, found with a
#            few short runs at the longest prompt (or UP_NCMOE when set).
#   fixed8   budget8 with residency off (BLOOMERY_RESIDENCY=off: the slots keep the plan's
#            experts); compared with budget8's upstream run, so run it after budget8.
#   spread8  budget8 with the expert copies spread evenly over the layers
#            (BLOOMERY_EXPERT_COPIES=spread) instead of gathered into whole layers; compared
#            with budget8's upstream run, so run it after budget8.
# Ours run with RUST_LOG=info; the share of expert routes the card slots served, the host's time
# per layer step and the card's share of host experts are printed after each of our runs that
# had host experts.
# -k SKEW writes the synthetic model with make-synthetic --expert-skew SKEW (routing skew; 0, the
# default, is even routing).
# Both sides get the same threads (-t, default nproc), -b 2048 and -ub 512. Card memory is
# sampled with nvidia-smi every 100 ms during every run; peaks are MiB above the card's idle level
# before the run, so each includes its process's CUDA context. A failed run counts 0 and prints
# its log tail; the other runs go on. Logs, memory samples and raw numbers go to $OUT (or $WORK).
# Usage: scripts/bench-gpu.sh [-s card,cpumoe,budget8,fixed8,spread8] [-r REPS] [-t THREADS] [-k SKEW]
#        [-m MODEL.gguf]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
D=.device
W="${WORK:-/tmp/bloomery-bench}"
LOG="${OUT:-$W}"
R=3 M="" S=card T=$(nproc) K=0
while getopts "s:r:t:m:k:" o; do
  case $o in s) S=$OPTARG ;; r) R=$OPTARG ;; t) T=$OPTARG ;; m) M=$OPTARG ;; k) K=$OPTARG ;; *) exit 2 ;; esac
done
IFS=, read -ra SCENARIOS <<<"$S"
for s in "${SCENARIOS[@]}"; do
  case $s in
  card | cpumoe | budget8 | fixed8 | spread8) ;;
  *)
    echo "unknown scenario '$s' (known: card, cpumoe, budget8, fixed8, spread8)" >&2
    exit 2
    ;;
  esac
done
BUDGET_MIB=8192
TESTS=(pp512 pp4096 tg128)
BATCH=(-b 2048)
mkdir -p "$W/up" "$LOG" || exit 1

UP="$W/up/b/bin/llama-bench"
build=""
if [ -x "$UP" ]; then
  echo "upstream llama-bench already built: $UP"
else
  (tar xf "$D/llama-src.tar.xz" -C "$W/up" &&
    UPSTREAM_SRC="$W/up" UPSTREAM_CUDA_PREFIX="$W/up/b" scripts/upstream.sh --cuda) \
    >"$LOG/upstream-build.log" 2>&1 &
  build=$!
fi
if [ -z "$M" ]; then
  M="$W/qwen3-30b-a3b-q4_K-skew$K.gguf"
  if [ ! -f "$M" ]; then
    # written under another name first, so a cut-off run leaves no half model for the next
    if time "$D/make-synthetic" --preset qwen3-30b-a3b --type q4_K --expert-skew "$K" \
      --vocab "$D/vocab.gguf" --out "$M.part"; then
      mv "$M.part" "$M" || exit 1
    else
      echo "the synthetic model could not be written" >&2
      exit 1
    fi
  fi
fi

# The model's layer count (`<arch>.block_count` in the GGUF header), for upstream's -ncmoe.
N_LAYER=$(
  python3 - "$M" <<'PY'
import struct, sys
f = open(sys.argv[1], "rb")
def read(fmt):
    return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]
if f.read(4) != b"GGUF":
    sys.exit(f"{sys.argv[1]} is not a GGUF file")
read("I")
read("Q")
n_kv = read("Q")
scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
def skip(ty):
    if ty == 8:
        f.seek(read("Q"), 1)
    elif ty == 9:
        item, n = read("I"), read("Q")
        if item in scalar:
            f.seek(struct.calcsize(scalar[item]) * n, 1)
        else:
            for _ in range(n):
                skip(item)
    else:
        f.seek(struct.calcsize(scalar[ty]), 1)
for _ in range(n_kv):
    key = f.read(read("Q")).decode()
    ty = read("I")
    if key.endswith(".block_count") and ty in scalar:
        print(read(scalar[ty]))
        sys.exit(0)
    skip(ty)
sys.exit("no block_count in the header")
PY
) || N_LAYER=""
echo "model: $M (${N_LAYER:-?} layers); threads $T, repetitions $R, scenarios ${SCENARIOS[*]}"

# The card's memory in use now, in MiB.
mem_used() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1 | tr -dc 0-9
}

PEAK=0
# NAME CMD...: runs CMD while sampling the card's memory every 100 ms into $LOG/mem-NAME.txt;
# sets PEAK to the most it used above the idle level before CMD started. Returns CMD's status.
sampled() {
  local name=$1 idle pid rc=0
  shift
  local samples="$LOG/mem-$name.txt"
  idle=$(mem_used)
  : >"$samples"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 >"$samples" 2>/dev/null &
  pid=$!
  "$@" || rc=$?
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  PEAK=$(awk -v idle="${idle:-0}" '$1 + 0 > m { m = $1 + 0 } END { print (m > idle ? m - idle : 0) }' "$samples")
  PEAK=${PEAK:-0}
  return "$rc"
}

# WHAT LOG STATUS: says that a run failed and shows the end of its log.
failed() {
  echo "$1 failed (exit $3); the end of $2:"
  tail -n 12 "$2" | sed 's/^/    /'
}

declare -A OURS OURS_ARGS OURS_PEAK UP_ARGS UP_PEAK PROBED

# SCENARIO: one bloomery-bench process per test (each with -r repetitions), placed as the
# scenario says; sets OURS[SCENARIO.TEST] (mean tok/s, 0 when the run failed) and
# OURS_PEAK[SCENARIO] (the largest peak of its runs).
ours() {
  local sc=$1 test p n log rc v vars=() extra=()
  case $sc in
  cpumoe) extra=(-- --cpu-moe) ;;
  budget8) vars=("BLOOMERY_CARD_BUDGET=CUDA0=8G") ;;
  fixed8) vars=("BLOOMERY_CARD_BUDGET=CUDA0=8G" "BLOOMERY_RESIDENCY=off") ;;
  spread8) vars=("BLOOMERY_CARD_BUDGET=CUDA0=8G" "BLOOMERY_EXPERT_COPIES=spread") ;;
  esac
  local shown=("${vars[@]}" --gpu 0 -t "$T" "${BATCH[@]}" -u 512 "${extra[@]}")
  OURS_ARGS[$sc]="${shown[*]}"
  OURS_PEAK[$sc]=0
  for test in "${TESTS[@]}"; do
    p=0 n=0
    case $test in pp*) p=${test#pp} ;; tg*) n=${test#tg} ;; esac
    log="$LOG/ours-$sc-$test.log"
    sampled "ours-$sc-$test" env RUST_LOG=info "${vars[@]}" "$D/bloomery-bench" -m "$M" --gpu 0 -t "$T" "${BATCH[@]}" -u 512 \
      -r "$R" -p "$p" -n "$n" "${extra[@]}" >"$log" 2>&1
    rc=$?
    [ "$PEAK" -gt "${OURS_PEAK[$sc]}" ] && OURS_PEAK[$sc]=$PEAK
    # the t/s column of the row whose test column is $test, found by the header's names
    v=$(awk -F'|' -v want="$test" '
      { for (i = 1; i <= NF; i++) { c[i] = $i; gsub(/ /, "", c[i]) } }
      !tc { for (i = 1; i <= NF; i++) { if (c[i] == "test") tc = i; if (c[i] == "t/s") ts = i }; next }
      ts && c[tc] == want { split($ts, a, " "); print a[1]; exit }' "$log")
    if [ "$rc" -ne 0 ] || [ -z "$v" ]; then
      failed "bloomery $sc $test" "$log" "$rc"
      v=0
    fi
    OURS[$sc.$test]=$v
    echo "bloomery $sc $test: $v tok/s, peak ${PEAK} MiB"
    grep -oE 'expert residency: card slots served.*|card share of host experts.*|host experts over .*' "$log" | sed 's/^/    /'
  done
}

# SCENARIO [llama-bench options]: one llama-bench run of every test, JSON in
# $LOG/upstream-SCENARIO.json; sets UP_PEAK[SCENARIO].
upstream() {
  local sc=$1 rc
  shift
  local json="$LOG/upstream-$sc.json" log="$LOG/upstream-$sc.log"
  UP_PEAK[$sc]=0
  : >"$json"
  if [ ! -x "$UP" ]; then
    echo "upstream $sc: no llama-bench (see $LOG/upstream-build.log)"
    return 1
  fi
  local shown=(-ngl 99 "$@" -t "$T" "${BATCH[@]}" -ub 512)
  UP_ARGS[$sc]="${shown[*]}"
  sampled "upstream-$sc" "$UP" -m "$M" -ngl 99 "$@" -p 512,4096 -n 128 "${BATCH[@]}" -ub 512 -t "$T" \
    -r "$R" -o json >"$json" 2>"$log"
  rc=$?
  UP_PEAK[$sc]=$PEAK
  [ "$rc" -eq 0 ] || failed "upstream $sc" "$log" "$rc"
  return "$rc"
}

# NCMOE: PEAK of a short upstream run at the longest prompt (its KV cache and attention
# scratch are the largest) with the experts of the first NCMOE layers on the host; remembered,
# so no value runs twice. Fails when the run did.
probed() {
  local log="$LOG/upstream-budget8-probe-$1.log" rc
  if [ -z "${PROBED[$1]+set}" ]; then
    sampled "upstream-budget8-probe-$1" "$UP" -m "$M" -ngl 99 -ncmoe "$1" -p 4096 -n 0 "${BATCH[@]}" -ub 512 \
      -t "$T" -r 1 -o json >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
      PROBED[$1]=$PEAK
      echo "upstream -ncmoe $1: peak $PEAK MiB"
    else
      PROBED[$1]=failed
      failed "upstream probe -ncmoe $1" "$log" "$rc"
    fi
  fi
  [ "${PROBED[$1]}" != failed ] && PEAK=${PROBED[$1]}
}

# Sets NCMOE to the smallest -ncmoe whose peak stays within BUDGET_MIB (the layer count when
# none does). Each layer whose experts stay on the card adds the same bytes, so two probes give
# the cost of a layer; a third confirms the prediction, a fourth that one layer less is over.
# UP_NCMOE, when set, is taken as found (one probe still measures its peak).
fit_ncmoe() {
  local L=$N_LAYER half full cost n
  if [ -n "${UP_NCMOE:-}" ]; then
    NCMOE=$UP_NCMOE
    probed "$NCMOE"
    return
  fi
  NCMOE=$L
  probed "$L" || return 1
  full=$PEAK
  if [ "$full" -gt "$BUDGET_MIB" ]; then
    echo "upstream: even -ncmoe $L peaks at $full MiB, over $BUDGET_MIB MiB"
    return 0
  fi
  half=$((L / 2))
  probed "$half" || return 0
  cost=$(((PEAK - full + L - half - 1) / (L - half)))
  [ "$cost" -gt 0 ] || cost=1
  n=$((L - (BUDGET_MIB - full) / cost))
  [ "$n" -ge 0 ] || n=0
  while [ "$n" -lt "$L" ]; do
    probed "$n" || {
      n=$L
      break
    }
    [ "$PEAK" -le "$BUDGET_MIB" ] && break
    n=$((n + 1))
  done
  while [ "$n" -gt 0 ] && probed $((n - 1)) && [ "$PEAK" -le "$BUDGET_MIB" ]; do
    n=$((n - 1))
  done
  NCMOE=$n
}

# SCENARIO NOTE: the scenario's table (also appended to $LOG/summary.txt).
table() {
  local sc=$1
  python3 - "$sc" "$LOG/upstream-$sc.json" "${OURS[$sc.pp512]:-0}" "${OURS[$sc.pp4096]:-0}" \
    "${OURS[$sc.tg128]:-0}" "${OURS_PEAK[$sc]:-0}" "${UP_PEAK[$sc]:-0}" \
    "${OURS_ARGS[$sc]:-}" "${UP_ARGS[$sc]:-not run}" "$2" <<'PY' |
import json, sys
sc, path, *rest = sys.argv[1:]
ours = dict(zip(["pp512", "pp4096", "tg128"], map(float, rest[:3])))
peak_ours, peak_up, args_ours, args_up, note = rest[3:]
up = {}
try:
    for r in json.load(open(path)):
        key = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        up[key] = r["avg_ts"]
except (OSError, ValueError, KeyError, TypeError):
    pass
print(f"\n== {sc}: bloomery {args_ours} | upstream {args_up}")
if note:
    print(f"   {note}")
print(f"{'test':<8} {'bloomery':>10} {'upstream':>10} {'ratio':>7}")
for k, v in ours.items():
    u = up.get(k, 0.0)
    print(f"{k:<8} {v:>10.1f} {u:>10.1f} {v / u if u else float('nan'):>7.2f}")
print(f"peak card MiB above idle: bloomery {peak_ours}, upstream {peak_up}")
PY
    tee -a "$LOG/summary.txt"
}

has() {
  local s
  for s in "${SCENARIOS[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

# The whole-card runs may overlap the upstream build; the others wait for it, since their
# experts run on the host's cores, which the build would take.
has card && ours card
if [ -n "$build" ]; then
  if ! wait "$build"; then
    echo "the upstream build failed; its log ends:"
    tail -n 30 "$LOG/upstream-build.log" | sed 's/^/    /'
  fi
fi
for sc in "${SCENARIOS[@]}"; do
  note=""
  case $sc in
  card)
    upstream card
    ;;
  cpumoe)
    ours cpumoe
    if [ -n "$N_LAYER" ]; then
      upstream cpumoe -ncmoe "$N_LAYER"
    else
      echo "upstream cpumoe: the model's layer count is unknown"
    fi
    ;;
  budget8)
    ours budget8
    if [ -z "$N_LAYER" ]; then
      echo "upstream budget8: the model's layer count is unknown"
    elif [ ! -x "$UP" ]; then
      echo "upstream budget8: no llama-bench (see $LOG/upstream-build.log)"
    elif fit_ncmoe; then
      note="upstream's -ncmoe $NCMOE is the smallest whose peak stays within $BUDGET_MIB MiB at pp4096"
      note+=" (probe peak ${PROBED[$NCMOE]:-?} MiB; probed -ncmoe=MiB:"
      note+=" $(for k in "${!PROBED[@]}"; do echo "$k=${PROBED[$k]}"; done | sort -n | paste -sd ' '))"
      echo "$note"
      upstream budget8 -ncmoe "$NCMOE"
    fi
    ;;
  fixed8 | spread8)
    ours "$sc"
    if [ -f "$LOG/upstream-budget8.json" ]; then
      cp "$LOG/upstream-budget8.json" "$LOG/upstream-$sc.json"
      UP_ARGS[$sc]="${UP_ARGS[budget8]:-} (budget8's run)"
      UP_PEAK[$sc]=${UP_PEAK[budget8]:-0}
    fi
    ;;
  esac
  table "$sc" "$note"
done
