//! llama.cpp's sampler chain and its parameters.
