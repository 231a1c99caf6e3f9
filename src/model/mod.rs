//! Model files: the GGUF reader, ggml tensor types and architecture hyper-parameters.
