//! What the engine golden tests share: the CPU features a golden was recorded on, and one greedy
//! case run the way upstream's server ran it, compared step by step.

#![allow(dead_code)]

use bloomery::engine::{Batch, Forward};
use bloomery::sampling::token_probabilities;
use bloomery::server::checkpoints::{CheckpointPolicy, Checkpoints, UserStarts};
use serde_json::Value;

/// The CPU features that decide ggml's float steps (and ours): `compat/run.py`'s list (AMX is not
/// among them: `scripts/upstream.sh` builds upstream without its AMX kernels).
const NUMERICS_FLAGS: [&str; 11] = [
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
];

pub fn cpu_flags() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.split_whitespace().collect())
        .unwrap_or_default();
    NUMERICS_FLAGS
        .iter()
        .filter(|f| flags.contains(f))
        .map(|f| f.to_string())
        .collect()
}

/// Whether this CPU has the features the golden was recorded on; says why not when it does not
/// (ggml takes other float steps on other features).
pub fn same_machine(golden: &Value) -> bool {
    let recorded: Vec<String> = golden["machine"]["flags"]
        .as_array()
        .expect("the golden names its machine")
        .iter()
        .map(|f| f.as_str().expect("flag").to_string())
        .collect();
    if recorded != cpu_flags() {
        eprintln!(
            "skipping: the golden was recorded on a CPU with features {recorded:?}, this one has \
             {:?}; ggml's float steps differ between them (re-record with \
             scripts/record-engine-goldens.py)",
            cpu_flags()
        );
        return false;
    }
    true
}

pub fn read_golden(name: &str) -> Value {
    let path = format!(
        "{}/compat/golden/b11434/engine/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).expect("golden file")).expect("json")
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Each token's log-probability as the server reports it for `n_probs` (the softmax of the raw
/// logits in upstream's order and f32 steps, then `logf`).
pub fn logprobs(v: &[f32]) -> Vec<f64> {
    let mut lp = vec![0.0; v.len()];
    for t in token_probabilities(v, 5) {
        lp[t.id as usize] = f64::from(t.p.ln());
    }
    lp
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// What one case gave.
#[derive(Default)]
pub struct CaseResult {
    /// The largest difference of a top-5 log-probability from upstream's.
    pub worst: f64,
    /// Steps where our greedy token differs from upstream's, described.
    pub mismatches: Vec<String>,
    /// Of those, the steps where upstream's two best log-probabilities were within `tie` of
    /// each other, so that a difference within the tolerance can swap them.
    pub ties: usize,
    /// Steps whose probabilities upstream did not report (only the token is compared).
    pub unreported: usize,
}

/// Runs one golden case (`prompt_ids`, `tokens`, `top_logprobs`) on sequence 0 of `eng`: the
/// prompt split as upstream's server split it (`policy`, from a fresh cache), then one step per
/// upstream token, upstream's token fed back so that one early difference does not hide later
/// ones. `label` names the case in messages; `tie` is the log-probability gap under which a
/// swapped token counts as a tie.
pub fn run_case(
    eng: &mut dyn Forward,
    policy: &CheckpointPolicy,
    case: &Value,
    label: &str,
    tie: f64,
    verbose: bool,
) -> CaseResult {
    let prompt = ids(&case["prompt_ids"]);
    let want = ids(&case["tokens"]);
    let probs = case["top_logprobs"].as_array().expect("top_logprobs");
    let mut out = CaseResult::default();
    eng.seq_rm(0, 0, None);
    // every batch but the last, as the server would split a fresh prompt
    let none = UserStarts::default();
    let cp = Checkpoints::default();
    let mut start = 0;
    let mut batch = Batch::default();
    while start < prompt.len() {
        let end = (start + policy.n_ubatch).min(prompt.len());
        let len = cp.batch_len(policy, true, &none, prompt.len(), start, end);
        batch = Batch::default();
        for (i, &t) in prompt.iter().enumerate().skip(start).take(len) {
            batch.push(t, i as u32, 0, i + 1 == prompt.len());
        }
        start += len;
        if start < prompt.len() {
            let mut sink = Vec::new();
            eng.decode(&batch, &mut sink).expect("decode");
        }
    }
    for (pos, (step, &expected)) in (prompt.len() as u32..).zip(want.iter().enumerate()) {
        let mut logits = Vec::new();
        eng.decode(&batch, &mut logits).expect("decode");
        let got = argmax(&logits);
        let lp = logprobs(&logits);
        let mut pairs = Vec::new();
        let mut step_worst = 0.0f64;
        // null: the server left this byte token's probabilities out (see the recording script)
        let top = match probs[step].as_array() {
            Some(top) => top.as_slice(),
            None => {
                out.unreported += 1;
                &[]
            }
        };
        for pair in top {
            let id = pair[0].as_u64().expect("id") as usize;
            let theirs = pair[1].as_f64().expect("logprob");
            step_worst = step_worst.max((lp[id] - theirs).abs());
            pairs.push(format!("{id}: {:.4} vs {theirs:.4}", lp[id]));
        }
        out.worst = out.worst.max(step_worst);
        if verbose {
            eprintln!("{label} step {step}: worst top-5 difference {step_worst:.2e}");
        }
        if got != expected {
            let gap = match (top.first(), top.get(1)) {
                (Some(a), Some(b)) => a[1].as_f64().unwrap_or(0.0) - b[1].as_f64().unwrap_or(0.0),
                _ => f64::INFINITY,
            };
            if gap <= tie {
                out.ties += 1;
            }
            out.mismatches.push(format!(
                "{label} step {step}: ours {got} ({:.4}), upstream {expected} (its top-2 gap \
                 {gap:.2e}); ours vs upstream: {}",
                lp[got as usize],
                pairs.join(", ")
            ));
        }
        batch = Batch::default();
        batch.push(expected, pos, 0, true);
    }
    out
}
