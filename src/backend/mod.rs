//! Compute backends. `cpu` holds the threaded kernels that run everything on the host; `cuda`
//! runs the whole model on a card through the driver loaded at run time.

pub mod cpu;
pub mod cuda;
