# The synthetic models the CUDA checks run (sourced by scripts/gpu-check.sh and
# scripts/gpu-vs-upstream.sh): one per served architecture and several weight types. The caller
# defines `make NAME PRESET [make-synthetic options]`.
check_models() {
  make llama-q4_0 tiny-llama --type q4_0
  make qwen3-q4_K tiny-qwen3 --type q4_K --embd-type q6_K
  make qwen3moe-q4_K tiny-qwen3moe --type q4_K
  make qwen3moe-mixed tiny-qwen3moe --type q8_0 --expert-type q5_K --embd-type q8_0
  make gemma3-q6_K tiny-gemma3 --type q6_K
  make gemma3-270m-shape-q4_K gemma-3-270m --type q4_K
}
