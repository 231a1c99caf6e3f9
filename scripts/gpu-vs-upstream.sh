#!/usr/bin/env bash
# Compares greedy tokens and top logprobs of bloomery-serve (on the card, and on the CPU) with
# upstream's CUDA llama-server (built here from the packed sources, without its web UI, which an
# offline machine cannot fetch), on the synthetic models scripts/gpu-check.sh uses. Each server
# answers the same /completion requests (temperature 0, n_probs 5); scripts/compare-completions.py
# prints, per model and engine, how many tokens equal upstream's and the largest logprob gap.
# Needs .device/ from scripts/device-pack.sh. Results go to $OUT (or ./gpu-vs-upstream).
# MODELS="llama-q4_0 ..." runs only those models; DETAIL=1 prints where each prompt first differs;
# UPCPU=1 also runs upstream on its CPU backend, measuring upstream's own CPU-to-card gap.
set -uo pipefail
cd "$(dirname "$0")/.."
D="${BLOOMERY_BIN:-.device}"
W="${WORK:-/tmp/gpu-vs-upstream}"
R="${OUT:-gpu-vs-upstream}"
mkdir -p "$W/up" "$W/models" "$R"

UP="$W/up/b/bin/llama-server"
build=""
if [ ! -x "$UP" ]; then
  (tar xf "$D/llama-src.tar.xz" -C "$W/up" &&
    UPSTREAM_SRC="$W/up" UPSTREAM_CUDA_PREFIX="$W/up/b" scripts/upstream.sh --cuda) \
    >"$R/upstream-build.log" 2>&1 &
  build=$!
fi

models=()
make() { # name preset [make-synthetic options]; MODELS="a b" keeps only those
  local name=$1 preset=$2
  shift 2
  [ -z "${MODELS:-}" ] || [[ " $MODELS " == *" $name "* ]] || return 0
  [ -f "$W/models/$name.gguf" ] ||
    "$D/make-synthetic" --preset "$preset" --vocab "$D/vocab.gguf" --out "$W/models/$name.gguf" "$@" >/dev/null
  models+=("$name")
}
. scripts/check-models.sh
check_models

if [ -n "$build" ] && ! wait "$build"; then
  echo "upstream llama-server did not build; see $R/upstream-build.log" >&2
  tail -20 "$R/upstream-build.log" >&2
  exit 1
fi

PORT=18400
ask() { # engine model server-binary [args]
  local engine=$1 model=$2 bin=$3
  shift 3
  local log="$R/$model.$engine.log" out="$R/$model.$engine.json"
  "$bin" -m "$W/models/$model.gguf" --host 127.0.0.1 --port "$PORT" -c 1024 --parallel 1 "$@" >"$log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    curl -sf "127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.2
  done
  echo "[" >"$out"
  local first=1
  for prompt in "The quick brown fox" "Once upon a time, in a land far away," "1, 2, 3, 4,"; do
    [ $first = 1 ] || echo "," >>"$out"
    first=0
    curl -s "127.0.0.1:$PORT/completion" -H 'Content-Type: application/json' \
      -d "{\"prompt\": \"$prompt\", \"n_predict\": 24, \"temperature\": 0, \"n_probs\": 5, \"cache_prompt\": false}" >>"$out"
  done
  echo "]" >>"$out"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

for m in "${models[@]}"; do
  ask upstream "$m" "$UP" -ngl 99 -fa on
  ask card "$m" "$D/bloomery-serve" -ngl 99
  ask cpu "$m" "$D/bloomery-serve" -ngl 0 -t "$(nproc)"
  # upstream against itself: its CPU backend only (`-dev none`), for the size of its own gap
  [ -z "${UPCPU:-}" ] || ask upcpu "$m" "$UP" -dev none -t "$(nproc)"
done
python3 scripts/compare-completions.py ${DETAIL:+--detail} "$R" "${models[@]}"
