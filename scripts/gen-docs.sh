#!/usr/bin/env bash
# Generates bloomery-serve's documentation from its option table:
#   man/bloomery-serve.1                       the man page (committed)
#   OUT/bloomery-serve.bash, OUT/_bloomery-serve, OUT/bloomery-serve.fish
#                                              clap_complete scripts for bash, zsh and fish
#   OUT/bloomery-serve.completion-bash         upstream-style script (same as --completion-bash)
# OUT is the first argument, target/completions by default. Prints the files written.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-target/completions}"
cargo build --quiet --bin bloomery-serve
BIN=target/debug/bloomery-serve
mkdir -p man "$OUT"
"$BIN" --generate man > man/bloomery-serve.1
"$BIN" --generate complete-bash > "$OUT/bloomery-serve.bash"
"$BIN" --generate complete-zsh > "$OUT/_bloomery-serve"
"$BIN" --generate complete-fish > "$OUT/bloomery-serve.fish"
"$BIN" --completion-bash > "$OUT/bloomery-serve.completion-bash"
printf '%s\n' man/bloomery-serve.1 "$OUT/bloomery-serve.bash" "$OUT/_bloomery-serve" \
  "$OUT/bloomery-serve.fish" "$OUT/bloomery-serve.completion-bash"
