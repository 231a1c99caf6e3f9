//! Model files: the GGUF reader, ggml tensor types and architecture hyper-parameters. Knows
//! nothing about HTTP or devices.

pub mod error;
pub mod ftype;
pub mod gguf;
pub mod quants;
pub mod types;

pub use error::ModelError;
pub use ftype::file_type_name;
pub use gguf::{GgufFile, MetaValue, TensorInfo};
pub use types::GgmlType;
