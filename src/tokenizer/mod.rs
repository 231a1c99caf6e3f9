//! Tokenization identical to llama.cpp: SPM, BPE with its pre-tokenizers, WPM and UGM.
