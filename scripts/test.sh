#!/usr/bin/env bash
# Runs every test: format check, clippy with warnings denied, unit and integration tests.
# Installs what the tests need on a fresh machine (test data under ~/.cache/bloomery).
set -euo pipefail
cd "$(dirname "$0")/.."
rustup component add rustfmt clippy >/dev/null 2>&1 || true
export BLOOMERY_CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
scripts/fetch-test-data.sh >/dev/null
# the gguf-py oracle (from the upstream sdist) needs numpy; the FP8 test checks against ml_dtypes
python3 -c "import numpy, ml_dtypes" 2>/dev/null || python3 -m pip install -q numpy ml_dtypes
# NVRTC (no GPU needed) so the CUDA kernels are compiled for every served architecture here too
NVRTC="$BLOOMERY_CACHE/nvrtc"
if [ ! -f "$NVRTC/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$NVRTC/dl" nvidia-cuda-nvrtc==13.5.37
  (cd "$NVRTC" && python3 -m zipfile -e dl/nvidia_cuda_nvrtc-13.5.37-*.whl .)
fi
export LD_LIBRARY_PATH="$NVRTC/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export BLOOMERY_REQUIRE_NVRTC=1
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test --all-targets --no-fail-fast
