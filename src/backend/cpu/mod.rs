//! CPU kernels: threaded matrix-vector and matrix-matrix products on quantized weights, with a
//! scalar reference path and AVX2 and AVX-512 VNNI kernels chosen at run time. Knows nothing about models or HTTP.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod dot;
pub mod fa;
pub mod matmul;
pub mod packed;
pub mod pool;
pub mod quant;
pub mod vec;

pub use matmul::{matmul, matmul_pairs, QMat};
pub use pool::ThreadPool;
