//! Refusals of model files, each naming the file and what in it is wrong.

use std::fmt;
use std::path::PathBuf;

use super::types::GgmlType;

#[derive(Debug, Clone, PartialEq)]
pub enum ModelError {
    Io {
        path: PathBuf,
        error: String,
    },
    BadMagic {
        path: PathBuf,
        found: [u8; 4],
    },
    UnsupportedVersion {
        path: PathBuf,
        version: u32,
    },
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
    },
    BadMetadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    BadTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    BadSplit {
        path: PathBuf,
        reason: String,
    },
    MissingKey {
        path: PathBuf,
        key: String,
    },
    MissingTensor {
        path: PathBuf,
        tensor: String,
    },
    UnsupportedArchitecture {
        path: PathBuf,
        arch: String,
    },
    /// Tensor data that a ggml type's routines cannot take (wrong length, unsupported operation).
    Quant {
        ggml_type: GgmlType,
        reason: String,
    },
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ModelError::*;
        match self {
            Io { path, error } => write!(f, "{}: {error}", path.display()),
            BadMagic { path, found } => write!(
                f,
                "{}: not a GGUF file (magic {:?}, expected \"GGUF\")",
                path.display(),
                String::from_utf8_lossy(found)
            ),
            UnsupportedVersion { path, version } => {
                write!(f, "{}: unsupported GGUF version {version}", path.display())
            }
            Truncated { path, what, offset } => write!(
                f,
                "{}: file is truncated: {what} at byte {offset} runs past the end",
                path.display()
            ),
            BadMetadata { path, key, reason } => {
                write!(f, "{}: metadata key '{key}': {reason}", path.display())
            }
            BadTensor {
                path,
                tensor,
                reason,
            } => write!(f, "{}: tensor '{tensor}': {reason}", path.display()),
            BadSplit { path, reason } => write!(f, "{}: {reason}", path.display()),
            MissingKey { path, key } => {
                write!(
                    f,
                    "{}: required metadata key '{key}' is missing",
                    path.display()
                )
            }
            MissingTensor { path, tensor } => {
                write!(
                    f,
                    "{}: required tensor '{tensor}' is missing",
                    path.display()
                )
            }
            UnsupportedArchitecture { path, arch } => write!(
                f,
                "{}: architecture '{arch}' is not served by bloomery",
                path.display()
            ),
            Quant { ggml_type, reason } => write!(f, "{ggml_type}: {reason}"),
        }
    }
}

impl std::error::Error for ModelError {}
