//! The CUDA backend: the card through cudarc with dynamic loading (`device`), the kernels in
//! `kernels/` compiled by NVRTC and cached (`compile`), and typed launches of each kernel
//! (`ops`). Knows nothing about models or HTTP; with no driver every entry point says so.

pub mod check;
pub mod compile;
pub mod device;
pub mod ops;

pub use device::{page_spans, CudaError, DevBuf, DeviceInfo, Event, Gemm, Gpu, Graph, Pinned};
pub use ops::{Buf, Cuda, DevMatrix, RowMove};
