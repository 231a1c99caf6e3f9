//! Any bytes given to the GGUF reader are either read or refused by name: never a panic, an
//! out-of-bounds read or a stack overflow. Whatever opens is then walked the way the engine
//! walks it: hyper-parameters with overrides, and every tensor dequantized.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

#[path = "../../src/model/mod.rs"]
#[allow(dead_code)]
mod model;

use model::{quants, GgufFile, Hparams, KvOverride, Metadata};

/// Tensors larger than this are not dequantized (the fuzzer's inputs are small anyway).
const MAX_ELEMENTS: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(Path::new("fuzz.gguf"), data.to_vec()) else {
        return;
    };
    let overrides = [KvOverride::parse("llama.block_count=int:2").unwrap()];
    for o in [&[][..], &overrides[..]] {
        let meta = Metadata::new(&f, o);
        let _ = Hparams::read(&meta);
        let _ = model::hparams::served_architecture(&meta);
    }
    for t in &f.tensors {
        let n = t.n_elements();
        if n > MAX_ELEMENTS {
            continue;
        }
        let mut y = vec![0f32; n as usize];
        let _ = quants::dequantize(t.ggml_type, f.tensor_data(t), &mut y);
    }
});
