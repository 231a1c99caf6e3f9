//! The inference engine: forward passes per architecture family over the CPU backend, the KV cache
//! and batches of sequences.
