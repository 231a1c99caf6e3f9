#!/usr/bin/env bash
# Expert popularity of a MoE GGUF over real text, per layer and overall (CPU engine):
# scripts/expert-skew.sh MODEL.gguf [TOKENS] [more expert-skew options: --text FILE, -t N]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
    echo "usage: $0 MODEL.gguf [TOKENS (default 512)] [--text FILE] [-t THREADS]" >&2
    exit 2
fi
model=$1
shift
tokens=512
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then
    tokens=$1
    shift
fi
exec cargo run -q --release --example expert-skew -- -m "$model" -n "$tokens" "$@"
