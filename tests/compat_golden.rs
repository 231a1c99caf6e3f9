//! Runs the conformance suite (`compat/run.py`) against the real binary: every scenario's answer
//! must equal upstream b11434's recorded golden, or carry a written explanation of the difference.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn http_scenarios_match_upstream_goldens() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cache = std::env::var("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/bloomery"));
    if !cache.join("models/gemma-3-270m-q4_k_m.gguf").exists() {
        eprintln!("skipped: test data missing, run scripts/fetch-test-data.sh");
        return;
    }
    let out = Command::new("python3")
        .arg(root.join("compat/run.py"))
        .args(["--part", "http", "--bin"])
        .arg(env!("CARGO_BIN_EXE_bloomery-serve"))
        .arg("--report")
        .arg(std::env::temp_dir().join("bloomery-compat-report.md"))
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "unexplained differences from upstream:\n{stdout}"
    );
}
