//! Compute backends. `cpu` holds the threaded kernels that run everything on the host; the CUDA
//! backend joins here once the CPU engine serves a real model.

pub mod cpu;
