//! Runs the flag conformance part of the suite (`compat/run.py --part flags`) against the real
//! binary: every option of upstream b11434's `--help`, in every spelling and through its variable,
//! must be accepted or refused as upstream's recorded answers say, and land in `--print-config`,
//! unless compat/flags-known-differences.json explains why not. Needs no model and no upstream.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn every_upstream_option_parses_as_upstream_recorded() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("compat/run.py"))
        .args(["--part", "flags", "--bin"])
        .arg(env!("CARGO_BIN_EXE_bloomery-serve"))
        .arg("--report")
        .arg(std::env::temp_dir().join(format!(
            "bloomery-compat-flags-report-{}.md",
            std::process::id()
        )))
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "unexplained differences from upstream's option parsing:\n{stdout}"
    );
    assert!(
        stdout.contains("flags: 256 passed, 0 failed"),
        "all 256 options of upstream's help were checked:\n{stdout}"
    );
}
