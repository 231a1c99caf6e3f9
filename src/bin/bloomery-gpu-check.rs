//! Checks the CUDA backend on the card it runs on: every kernel against the CPU reference on
//! random data, then each model given end to end against the CPU engine (logprobs on a prompt
//! and on a greedy continuation fed to both), and each mixture-of-experts model with experts
//! left on the host (all of them, and every other one) against all of them on the card: a long
//! prompt (streamed), a short one (computed on the host) and a greedy run. Exits non-zero on any
//! failure. Run through scripts/gpu-check.sh.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use bloomery::backend::cuda::{check, device, Cuda};
use bloomery::engine::{self, Batch, EngineParams, Forward};
use bloomery::model::GgufFile;

/// Largest difference of a log-probability in the CPU's top 5 allowed between the engines.
const LOGPROB_TOL: f32 = 0.05;
/// A CPU top-1 ahead of its runner-up by less than this is a near tie the card may break
/// either way.
const TIE_MARGIN: f32 = 0.05;

fn log_softmax(l: &[f32]) -> Vec<f32> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let s: f64 = l.iter().map(|&v| ((v - m) as f64).exp()).sum();
    let ls = s.ln() as f32;
    l.iter().map(|&v| v - m - ls).collect()
}

fn top(l: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..l.len()).collect();
    idx.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

#[derive(Default)]
struct Compare {
    rows: usize,
    max_diff: f32,
    argmax_miss: usize,
    ties: usize,
}

impl Compare {
    fn rows(&mut self, cpu: &[f32], gpu: &[f32], n_vocab: usize) {
        for (c, g) in cpu.chunks_exact(n_vocab).zip(gpu.chunks_exact(n_vocab)) {
            let (lc, lg) = (log_softmax(c), log_softmax(g));
            let t = top(&lc, 5);
            for &i in &t {
                self.max_diff = self.max_diff.max((lc[i] - lg[i]).abs());
            }
            if lc[t[0]] - lc[t[1]] < TIE_MARGIN {
                self.ties += 1;
            } else if top(&lg, 1)[0] != t[0] {
                self.argmax_miss += 1;
            }
            self.rows += 1;
        }
    }

    fn ok(&self) -> bool {
        self.max_diff.is_finite() && self.max_diff <= LOGPROB_TOL && self.argmax_miss == 0
    }
}

fn model_check(path: &Path) -> Result<bool, String> {
    let gguf = GgufFile::open(path).map_err(|e| e.to_string())?;
    let (n_prompt, n_gen) = (48usize, 32usize);
    let params = EngineParams {
        n_ctx_seq: 256,
        n_seq_max: 2,
        n_threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
        n_threads_batch: std::thread::available_parallelism().map_or(4, |n| n.get()),
        ..EngineParams::default()
    };
    let mut cpu = engine::load(&gguf, &params).map_err(|e| e.to_string())?;
    let mut gpu = engine::load(
        &gguf,
        &EngineParams {
            gpu: Some(0),
            ..params.clone()
        },
    )
    .map_err(|e| e.to_string())?;
    let nv = cpu.n_vocab();
    let prompt: Vec<u32> = (0..n_prompt)
        .map(|i| ((i * 7919 + 13) % nv) as u32)
        .collect();
    let mut b = Batch::default();
    for (i, &t) in prompt.iter().enumerate() {
        b.push(t, i as u32, 0, true);
    }
    let (mut prompt_cmp, mut cmp) = (Compare::default(), Compare::default());
    let (mut lc, mut lg) = (Vec::new(), Vec::new());
    cpu.decode(&b, &mut lc).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    gpu.decode(&b, &mut lg).map_err(|e| e.to_string())?;
    let pp = t0.elapsed();
    prompt_cmp.rows(&lc, &lg, nv);
    // greedy continuation chosen by the CPU, fed to both
    let mut next = top(&lc[(n_prompt - 1) * nv..], 1)[0] as u32;
    let mut gpu_time = std::time::Duration::ZERO;
    for step in 0..n_gen {
        let mut b = Batch::default();
        b.push(next, (n_prompt + step) as u32, 0, true);
        let (mut c, mut g) = (Vec::new(), Vec::new());
        cpu.decode(&b, &mut c).map_err(|e| e.to_string())?;
        let t = Instant::now();
        gpu.decode(&b, &mut g).map_err(|e| e.to_string())?;
        gpu_time += t.elapsed();
        cmp.rows(&c, &g, nv);
        next = top(&c, 1)[0] as u32;
    }
    // the card's own greedy run on a second sequence, from a prompt copy
    gpu.seq_cp(0, 1, n_prompt as u32);
    let mut own = 0;
    let mut cpu_tokens = Vec::new();
    {
        let mut n = top(&lc[(n_prompt - 1) * nv..], 1)[0] as u32;
        cpu.seq_rm(0, n_prompt as u32, None);
        for step in 0..n_gen {
            cpu_tokens.push(n);
            let mut b = Batch::default();
            b.push(n, (n_prompt + step) as u32, 0, true);
            let mut c = Vec::new();
            cpu.decode(&b, &mut c).map_err(|e| e.to_string())?;
            n = top(&c, 1)[0] as u32;
        }
        let mut n = top(&lg[(n_prompt - 1) * nv..], 1)[0] as u32;
        for (step, &want) in cpu_tokens.iter().enumerate() {
            if n != want {
                break;
            }
            own += 1;
            let mut b = Batch::default();
            b.push(n, (n_prompt + step) as u32, 1, true);
            let mut g = Vec::new();
            gpu.decode(&b, &mut g).map_err(|e| e.to_string())?;
            n = top(&g, 1)[0] as u32;
        }
    }
    // the host prompt cache: sequence 1 saved, overwritten, restored, then continued; the
    // continuation must equal the one from before it was overwritten
    let saved_ok = {
        let at = (n_prompt + own) as u32;
        let state = gpu.seq_save(1).ok_or("the card saved no sequence")?;
        let t = prompt[0];
        let mut b = Batch::default();
        b.push(t, at, 1, true);
        let mut before = Vec::new();
        gpu.decode(&b, &mut before).map_err(|e| e.to_string())?;
        gpu.seq_rm(1, 0, None);
        let mut other = Batch::default();
        for i in 0..at {
            other.push(prompt[(i as usize * 5 + 3) % n_prompt], i, 1, false);
        }
        gpu.decode(&other, &mut Vec::new())
            .map_err(|e| e.to_string())?;
        let loaded = gpu.seq_load(1, &state);
        let mut after = Vec::new();
        gpu.decode(&b, &mut after).map_err(|e| e.to_string())?;
        let diff = before
            .iter()
            .zip(&after)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        println!(
            "prompt cache on the card: {} positions saved ({} bytes), restored over others: {loaded}, next logits max |diff| {diff:.2e} -> {}",
            at,
            state.bytes,
            if loaded && diff <= 1e-3 { "ok" } else { "FAIL" }
        );
        loaded && diff <= 1e-3
    };
    let spread = {
        let l = &lc[(n_prompt - 1) * nv..n_prompt * nv];
        let mean = l.iter().sum::<f32>() / nv as f32;
        (l.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / nv as f32).sqrt()
    };
    let ok = prompt_cmp.ok() && cmp.ok() && saved_ok;
    println!(
        "model {} (logit std {spread:.2}): prompt rows {}: max |dlogprob| top-5 {:.4}, argmax misses {} (near ties {}); decode rows {}: max |dlogprob| {:.4}, argmax misses {} (near ties {}); tol {LOGPROB_TOL}; the card's own greedy run equals the CPU's for {own}/{n_gen} tokens; card prompt {n_prompt} tok {:.1} ms, decode {:.2} ms/token -> {}",
        path.display(),
        prompt_cmp.rows,
        prompt_cmp.max_diff,
        prompt_cmp.argmax_miss,
        prompt_cmp.ties,
        cmp.rows,
        cmp.max_diff,
        cmp.argmax_miss,
        cmp.ties,
        pp.as_secs_f64() * 1e3,
        gpu_time.as_secs_f64() * 1e3 / n_gen as f64,
        if ok { "ok" } else { "FAIL" }
    );
    Ok(ok)
}

/// Logits of `tokens` as one batch of sequence `seq` from position `p0`, every row wanted.
fn run_prompt(
    eng: &mut dyn Forward,
    tokens: &[u32],
    seq: u32,
    p0: usize,
) -> Result<Vec<f32>, String> {
    let mut b = Batch::default();
    for (i, &t) in tokens.iter().enumerate() {
        b.push(t, (p0 + i) as u32, seq, true);
    }
    let mut out = Vec::new();
    eng.decode(&b, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// `n` greedy tokens of sequence `seq` after `last` logits, from position `p0`.
fn greedy(
    eng: &mut dyn Forward,
    last: &[f32],
    seq: u32,
    p0: usize,
    n: usize,
) -> Result<(Vec<u32>, Vec<f32>), String> {
    let mut next = top(last, 1)[0] as u32;
    let (mut tokens, mut rows) = (Vec::new(), Vec::new());
    for step in 0..n {
        tokens.push(next);
        let mut b = Batch::default();
        b.push(next, (p0 + step) as u32, seq, true);
        let mut g = Vec::new();
        eng.decode(&b, &mut g).map_err(|e| e.to_string())?;
        next = top(&g, 1)[0] as u32;
        rows.extend(g);
    }
    Ok((tokens, rows))
}

/// A mixture-of-experts model with experts on the host against all of them on the card.
fn placement_check(path: &Path) -> Result<bool, String> {
    let gguf = GgufFile::open(path).map_err(|e| e.to_string())?;
    let arch = gguf.architecture().unwrap_or_default().to_string();
    let int = |k: &str| {
        gguf.get(&format!("{arch}.{k}"))
            .and_then(|v| v.as_i64())
            .unwrap_or(0) as usize
    };
    let (n_layer, n_expert) = (int("block_count"), int("expert_count"));
    if n_expert == 0 {
        return Ok(true);
    }
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let params = EngineParams {
        n_ctx_seq: 256,
        n_seq_max: 2,
        n_threads: threads,
        n_threads_batch: threads,
        n_ubatch: 32,
        gpu: Some(0),
        ..EngineParams::default()
    };
    let mut whole = engine::load(&gguf, &params).map_err(|e| e.to_string())?;
    let nv = whole.n_vocab();
    let long: Vec<u32> = (0..80).map(|i| ((i * 7919 + 13) % nv) as u32).collect();
    let short: Vec<u32> = (0..12).map(|i| ((i * 104_729 + 7) % nv) as u32).collect();
    let n_gen = 24;
    let ref_long = run_prompt(whole.as_mut(), &long, 0, 0)?;
    let (ref_tokens, ref_rows) = greedy(
        whole.as_mut(),
        &ref_long[(long.len() - 1) * nv..],
        0,
        long.len(),
        n_gen,
    )?;
    let ref_short = run_prompt(whole.as_mut(), &short, 1, 0)?;
    let mut ok = true;
    let variants: [(&str, Vec<Vec<u32>>); 2] = [
        ("every expert on the host", vec![Vec::new(); n_layer]),
        (
            "every other expert on the host, layer 0 all on the card",
            (0..n_layer)
                .map(|il| {
                    (0..n_expert as u32)
                        .filter(|x| il == 0 || x % 2 == 0)
                        .collect()
                })
                .collect(),
        ),
    ];
    for (what, experts) in variants {
        let mut eng = engine::load(
            &gguf,
            &EngineParams {
                card_experts: Some(experts),
                ..params.clone()
            },
        )
        .map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        let l = run_prompt(eng.as_mut(), &long, 0, 0)?;
        let pp = t0.elapsed();
        let t1 = Instant::now();
        let (tokens, rows) = greedy(
            eng.as_mut(),
            &l[(long.len() - 1) * nv..],
            0,
            long.len(),
            n_gen,
        )?;
        let tg = t1.elapsed();
        let s = run_prompt(eng.as_mut(), &short, 1, 0)?;
        let (mut c_long, mut c_gen, mut c_short) =
            (Compare::default(), Compare::default(), Compare::default());
        c_long.rows(&ref_long, &l, nv);
        c_short.rows(&ref_short, &s, nv);
        let same = tokens
            .iter()
            .zip(&ref_tokens)
            .take_while(|(a, b)| a == b)
            .count();
        let upto = same.min(n_gen) * nv;
        c_gen.rows(&ref_rows[..upto], &rows[..upto], nv);
        let good = c_long.ok() && c_short.ok() && c_gen.ok() && same == n_gen;
        ok &= good;
        println!(
            "model {} with {what}: streamed prompt of {} rows max |dlogprob| {:.4} (argmax misses {}), host-computed prompt of {} rows {:.4} (misses {}), greedy tokens equal to all-on-card for {same}/{n_gen} (decode rows {:.4}); prompt {:.1} ms, decode {:.2} ms/token -> {}",
            path.display(),
            c_long.rows,
            c_long.max_diff,
            c_long.argmax_miss,
            c_short.rows,
            c_short.max_diff,
            c_short.argmax_miss,
            c_gen.max_diff,
            pp.as_secs_f64() * 1e3,
            tg.as_secs_f64() * 1e3 / n_gen as f64,
            if good { "ok" } else { "FAIL" }
        );
    }
    Ok(ok)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cards = match device::list() {
        Ok(c) if !c.is_empty() => c,
        Ok(_) => {
            eprintln!(
                "bloomery-gpu-check: no CUDA card (driver present: {})",
                device::driver_present()
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("bloomery-gpu-check: {e}");
            return ExitCode::FAILURE;
        }
    };
    for c in &cards {
        println!(
            "{}: {} sm_{}{}, {} MiB free of {} MiB",
            c.name,
            c.description,
            c.compute_capability.0,
            c.compute_capability.1,
            c.free_bytes >> 20,
            c.total_bytes >> 20
        );
    }
    let mut ok = true;
    let t = Instant::now();
    let mut cuda = match Cuda::open(0) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bloomery-gpu-check: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("kernels ready in {:.2} s", t.elapsed().as_secs_f64());
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    println!("kernel checks, seed {seed}:");
    match check::run(&mut cuda, seed) {
        Ok(outcomes) => {
            for o in &outcomes {
                println!(
                    "  {:<32} rel err {:>10.3e}  limit {:.0e}  {}",
                    o.name,
                    o.rel_err,
                    o.limit,
                    if o.ok() { "ok" } else { "FAIL" }
                );
                ok &= o.ok();
            }
        }
        Err(e) => {
            println!("kernel checks stopped: {e}");
            ok = false;
        }
    }
    drop(cuda);
    for a in &args {
        for check in [model_check, placement_check] {
            match check(&PathBuf::from(a)) {
                Ok(good) => ok &= good,
                Err(e) => {
                    println!("model {a}: {e} -> FAIL");
                    ok = false;
                }
            }
        }
    }
    println!("gpu-check: {}", if ok { "passed" } else { "FAILED" });
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
