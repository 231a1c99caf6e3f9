//! Model files: the GGUF reader and writer, checkpoint folders (safetensors), ggml tensor types
//! with their dequantization and reference dot products (`quants`), metadata with
//! `--override-kv` and architecture hyper-parameters, and synthetic models for tests. Knows
//! nothing about HTTP or devices.

pub mod error;
pub mod ftype;
pub mod gguf;
pub mod hparams;
pub mod quants;
pub mod safetensors;
pub mod synthetic;
pub mod types;
pub mod writer;

pub use error::ModelError;
pub use ftype::file_type_name;
pub use gguf::{GgufFile, MetaType, MetaValue, TensorInfo};
pub use hparams::{apply_overrides, Hparams, KvOverride, Metadata, OverrideValue};
pub use types::GgmlType;
