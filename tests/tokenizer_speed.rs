//! Tokenization speed, run by scripts/bench-tokenize.sh (ignored in the normal test run):
//! tokenizes the file named by BLOOMERY_BENCH_TEXT with the model BLOOMERY_BENCH_MODEL
//! (add_special and parse_special on, as /tokenize is asked) and prints the best of several runs;
//! with BLOOMERY_BENCH_EXPECT (space-separated ids upstream gave), also whether the ids agree.

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
    if let Some(path) = std::env::var_os("BLOOMERY_BENCH_EXPECT") {
        let want: Vec<u32> = std::fs::read_to_string(path)
            .unwrap()
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        let got = vocab.tokenize(&text, true, true);
        let first_diff = want.iter().zip(&got).position(|(a, b)| a != b);
        let verdict = if want == got {
            "yes".to_string()
        } else {
            format!(
                "NO (lengths {} / {}, first difference at {first_diff:?})",
                want.len(),
                got.len()
            )
        };
        println!("ids identical to upstream: {verdict}");
        assert_eq!(want, got);
    }
}
