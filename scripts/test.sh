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
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo test --all-targets --no-fail-fast
