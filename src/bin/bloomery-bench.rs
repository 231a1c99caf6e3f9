//! `bloomery-bench`: prompt-processing and generation speed of the engine (CPU, or a CUDA card
//! with `--gpu N`), reported like llama.cpp's `llama-bench` (pp: one prompt of N tokens in
//! batches of `-b`; tg: M tokens decoded one at a time). With a card the model is placed as
//! `bloomery-serve` places it: llama-server placement flags after `--` (`-- --cpu-moe`,
//! `-- -ncmoe 30`) and `BLOOMERY_CARD_BUDGET` mean what they mean there.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use bloomery::engine::{self, Batch, CardExperts, EngineParams};
use bloomery::launch;
use bloomery::model::{GgmlType, GgufFile};
use bloomery::placement::Inventory;
use clap::{Arg, ArgAction, Command};

fn cli() -> Command {
    let num = |name: &'static str, short: char, help: &'static str, default: &'static str| {
        Arg::new(name)
            .short(short)
            .long(name)
            .help(help)
            .default_value(default)
            .value_parser(clap::value_parser!(usize))
    };
    Command::new("bloomery-bench")
        .about("Measures prompt (pp) and generation (tg) speed of bloomery's engine")
        .arg(
            Arg::new("gpu")
                .long("gpu")
                .help("CUDA card that serves the model, placed as bloomery-serve would (default: the CPU)")
                .value_parser(clap::value_parser!(usize)),
        )
        .arg(
            Arg::new("model")
                .short('m')
                .long("model")
                .required(true)
                .help("GGUF model file"),
        )
        .arg(num("n-prompt", 'p', "prompt tokens (0: skip pp)", "512"))
        .arg(num("n-gen", 'n', "generated tokens (0: skip tg)", "128"))
        .arg(num("threads", 't', "threads", "2"))
        .arg(num("batch-size", 'b', "prompt tokens per engine call", "2048"))
        .arg(num("ubatch-size", 'u', "tokens per forward pass", "512"))
        .arg(num("repetitions", 'r', "repetitions of each test", "1"))
        .arg(
            Arg::new("no-warmup")
                .long("no-warmup")
                .help("skip the untimed warmup runs before the tests (as llama-bench's --no-warmup)")
                .action(ArgAction::SetTrue),
        )
        .arg(
            Arg::new("greedy")
                .long("greedy")
                .help(
                    "comma-separated prompt token ids: print the greedy continuation of -n tokens",
                )
                .action(ArgAction::Set),
        )
        .arg(
            Arg::new("placement")
                .help("llama-server placement flags for the card (after --)")
                .num_args(0..)
                .last(true)
                .allow_hyphen_values(true),
        )
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let m = cli().get_matches();
    let get = |k: &str| *m.get_one::<usize>(k).expect("has a default");
    let path = PathBuf::from(m.get_one::<String>("model").expect("required"));
    match run(&path, &m, get) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bloomery-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &Path, m: &clap::ArgMatches, get: impl Fn(&str) -> usize) -> Result<(), String> {
    let gguf = GgufFile::open(path).map_err(|e| e.to_string())?;
    let (n_prompt, n_gen) = (get("n-prompt"), get("n-gen"));
    let n_ctx = (n_prompt + n_gen).max(1);
    let mut params = EngineParams {
        n_ctx_seq: n_ctx,
        n_seq_max: 1,
        n_threads: get("threads"),
        n_threads_batch: get("threads"),
        n_ubatch: get("ubatch-size"),
        type_k: GgmlType::F16,
        type_v: GgmlType::F16,
        kv_unified: false,
        swa_full: false,
        gpu: None,
        card_experts: None,
        ..EngineParams::default()
    };
    if let Some(&ordinal) = m.get_one::<usize>("gpu") {
        let extra: Vec<String> = m
            .get_many::<String>("placement")
            .map(|v| v.cloned().collect())
            .unwrap_or_default();
        let (card, experts) = card_placement(path, &gguf, ordinal, n_ctx, &extra)?;
        (params.gpu, params.card_experts) = (Some(card), experts);
    }
    let mut eng = engine::load(&gguf, &params).map_err(|e| e.to_string())?;
    let n_vocab = eng.n_vocab() as u32;
    let mut logits = Vec::new();
    if let Some(ids) = m.get_one::<String>("greedy") {
        let ids: Vec<u32> = ids
            .split(',')
            .map(|s| s.trim().parse().map_err(|e| format!("token id {s:?}: {e}")))
            .collect::<Result<_, _>>()?;
        let mut b = Batch::default();
        for (i, &t) in ids.iter().enumerate() {
            b.push(t, i as u32, 0, i + 1 == ids.len());
        }
        let mut out = Vec::new();
        for pos in (ids.len() as u32..).take(n_gen) {
            logits.clear();
            eng.decode(&b, &mut logits).map_err(|e| e.to_string())?;
            let next = argmax(&logits);
            out.push(next);
            b = Batch::default();
            b.push(next, pos, 0, true);
        }
        println!(
            "{}",
            out.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        );
        return Ok(());
    }
    println!("| model | threads | test | t/s |");
    println!("| --- | ---: | ---: | ---: |");
    let name = path
        .file_name()
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    let reps = get("repetitions").max(1);
    let pseudo = |i: usize| (i as u32).wrapping_mul(2_654_435_761) % n_vocab;
    let batch = get("batch-size").max(1);
    let prompt: Vec<Batch> = (0..n_prompt)
        .step_by(batch)
        .map(|start| {
            let mut b = Batch::default();
            for i in start..(start + batch).min(n_prompt) {
                b.push(pseudo(i), i as u32, 0, i + 1 == n_prompt);
            }
            b
        })
        .collect();
    // llama-bench's warmup: the whole prompt test once, and one generated token, untimed (so
    // first-use costs such as repacking weights, compiling kernels or faulting pages in stay out
    // of the first repetition, on both sides of a comparison)
    if !m.get_flag("no-warmup") {
        for b in &prompt {
            eng.decode(b, &mut logits).map_err(|e| e.to_string())?;
        }
        if n_gen > 0 {
            eng.seq_rm(0, 0, None);
            let mut b = Batch::default();
            b.push(pseudo(0), 0, 0, true);
            eng.decode(&b, &mut logits).map_err(|e| e.to_string())?;
        }
        logits.clear();
    }
    if n_prompt > 0 {
        let mut speeds = Vec::new();
        for _ in 0..reps {
            eng.seq_rm(0, 0, None);
            logits.clear();
            let t0 = Instant::now();
            for b in &prompt {
                eng.decode(b, &mut logits).map_err(|e| e.to_string())?;
            }
            speeds.push(n_prompt as f64 / t0.elapsed().as_secs_f64());
        }
        println!(
            "| {name} | {} | pp{n_prompt} | {} |",
            get("threads"),
            summary(&speeds)
        );
    }
    if n_gen > 0 {
        let mut speeds = Vec::new();
        for _ in 0..reps {
            eng.seq_rm(0, 0, None);
            let t0 = Instant::now();
            for i in 0..n_gen {
                let mut b = Batch::default();
                b.push(pseudo(i), i as u32, 0, true);
                logits.clear();
                eng.decode(&b, &mut logits).map_err(|e| e.to_string())?;
            }
            speeds.push(n_gen as f64 / t0.elapsed().as_secs_f64());
        }
        println!(
            "| {name} | {} | tg{n_gen} | {} |",
            get("threads"),
            summary(&speeds)
        );
    }
    Ok(())
}

/// The card and its experts as `bloomery-serve -m PATH -c N_CTX -np 1 -dev CUDA<ordinal>
/// EXTRA...` would place the model; an error when that plan is not served by the card.
fn card_placement(
    path: &Path,
    gguf: &GgufFile,
    ordinal: usize,
    n_ctx: usize,
    extra: &[String],
) -> Result<(usize, Option<CardExperts>), String> {
    let mut argv: Vec<String> = ["bloomery-serve", "-m"].map(String::from).to_vec();
    argv.push(path.display().to_string());
    for a in [
        "-c",
        &n_ctx.to_string(),
        "-np",
        "1",
        "-dev",
        &format!("CUDA{ordinal}"),
    ] {
        argv.push(a.to_string());
    }
    argv.extend(extra.iter().cloned());
    let parsed = bloomery::cli::parse(&argv, &|k: &str| std::env::var(k).ok())
        .map_err(|e| format!("placement flags {extra:?}: {}", e.message))?;
    let inventory = Inventory::from_gguf(gguf, &[]).map_err(|e| e.to_string())?;
    let cards = bloomery::backend::cuda::device::list().map_err(|e| e.to_string())?;
    let host = launch::host_memory().map_err(|e| e.to_string())?;
    let plan = launch::plan_placement(&parsed.config, &parsed.placement, &inventory, &cards, &host)
        .map_err(|e| e.to_string())?;
    eprintln!("{}", plan.to_string().trim_end());
    launch::execution(&plan, &cards, inventory.n_expert as usize).ok_or_else(|| {
        "that plan keeps layers off the card, which only the CPU engine serves".into()
    })
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// `mean ± stddev`, as llama-bench prints.
fn summary(v: &[f64]) -> String {
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
    format!("{mean:.2} ± {:.2}", var.sqrt())
}
