//! Intermediate tensors of the CPU forward pass written to files when `BLOOMERY_DUMP=<dir>` is
//! set, named as ggml's graph names them (`attn_norm-3`, `l_out-17`, `result_output`), so a run
//! can be compared with upstream's `llama-eval-callback` tensor by tensor
//! (`scripts/diff-dumps.py`). Off, it costs one cached lookup per tensor.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

fn dir() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("BLOOMERY_DUMP").map(PathBuf::from))
        .as_ref()
}

/// Writes `data` (rows of `width` values, ggml's `ne0`) as raw little-endian f32 to
/// `<dir>/<seq>-<name>[-<layer>]-<width>x<rows>.f32`.
pub fn put(name: &str, layer: Option<usize>, data: &[f32], width: usize) {
    let Some(dir) = dir() else { return };
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let name = match layer {
        Some(il) => format!("{name}-{il}"),
        None => name.to_string(),
    };
    let rows = data.len() / width.max(1);
    let path = dir.join(format!("{seq:04}-{name}-{width}x{rows}.f32"));
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    if let Err(e) = std::fs::write(&path, bytes) {
        log::warn!("BLOOMERY_DUMP: cannot write {}: {e}", path.display());
    }
}
