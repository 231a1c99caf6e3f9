//! Tokenization speed, run by scripts/bench-tokenize.sh (ignored in the normal test run):
//! tokenizes the file named by BLOOMERY_BENCH_TEXT with the model BLOOMERY_BENCH_MODEL
//! (add_special and parse_special on, as /tokenize is asked) and prints the best of several runs.

use std::path::PathBuf;
use std::time::Instant;

use bloomery::model::gguf::GgufFile;
use bloomery::tokenizer::Vocab;

#[test]
#[ignore = "benchmark: run through scripts/bench-tokenize.sh"]
fn tokenize_speed() {
    let var = |k: &str| {
        std::env::var_os(k)
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("{k} unset"))
    };
    let text = std::fs::read_to_string(var("BLOOMERY_BENCH_TEXT")).unwrap();
    let file = GgufFile::open(&var("BLOOMERY_BENCH_MODEL")).unwrap();
    let t0 = Instant::now();
    let vocab = Vocab::from_gguf(&file).unwrap();
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut best = f64::MAX;
    let mut n = 0;
    for _ in 0..std::env::var("BLOOMERY_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
    {
        let t = Instant::now();
        n = vocab.tokenize(&text, true, true).len();
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "bloomery: {} bytes -> {n} tokens, best of 5: {best:.2} ms (vocab load {load_ms:.0} ms)",
        text.len()
    );
}
