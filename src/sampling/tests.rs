//! Stage behaviour from upstream's `tests/test-sampling.cpp` cases (inputs and expected
//! probabilities carried over), plus chain-level checks.

use super::stages::{Dist, Dry, Penalties, Stage, Xtc};
use super::*;
use crate::grammar::{GrammarState, TokenTexts};

/// Token `i` is the single letter `'a' + i`.
struct Letters(usize);

impl DryVocab for Letters {
    fn n_tokens(&self) -> usize {
        self.0
    }
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        vec![b'a' + id as u8]
    }
    fn tokenize_plain(&self, text: &str) -> Vec<u32> {
        text.bytes().map(|b| u32::from(b - b'a')).collect()
    }
}

fn from_probs(probs: &[f32]) -> Candidates {
    Candidates {
        data: probs
            .iter()
            .enumerate()
            .map(|(id, &p)| TokenData {
                id: id as u32,
                logit: p.ln(),
                p,
            })
            .collect(),
        sorted: false,
        selected: None,
    }
}

fn run(probs: &[f32], stages: Vec<Stage>, with_dist: bool) -> Vec<f32> {
    let mut cur = from_probs(probs);
    for mut stage in stages {
        stage.apply(&mut cur);
    }
    if with_dist {
        Stage::Dist(Dist::new(0)).apply(&mut cur);
    }
    cur.data.iter().map(|t| t.p).collect()
}

fn assert_probs(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "got {got:?}, want {want:?}");
    }
}

const P4: [f32; 4] = [0.1, 0.2, 0.3, 0.4];

#[test]
fn temperature_one_keeps_and_zero_is_greedy() {
    let temp = |t| Stage::TempExt {
        temp: t,
        delta: 0.0,
        exponent: 1.0,
    };
    assert_probs(&run(&P4, vec![temp(1.0)], true), &P4);
    assert_probs(&run(&P4, vec![temp(0.0)], true), &[0.0, 0.0, 0.0, 1.0]);
    assert_probs(
        &run(&P4, vec![Stage::Temp(0.0)], true),
        &[0.0, 0.0, 0.0, 1.0],
    );
}

#[test]
fn top_k_keeps_the_best_sorted() {
    assert_probs(&run(&P4, vec![Stage::TopK(1)], true), &[1.0]);
    assert_probs(
        &run(&P4, vec![Stage::TopK(3)], true),
        &[0.44444, 0.33333, 0.22222],
    );
    assert_probs(&run(&P4, vec![Stage::TopK(4)], true), &[0.4, 0.3, 0.2, 0.1]);
}

#[test]
fn top_p_keeps_the_smallest_sufficient_prefix() {
    let top_p = |p| Stage::TopP { p, min_keep: 0 };
    assert_probs(&run(&P4, vec![top_p(0.0)], true), &[1.0]);
    assert_probs(&run(&P4, vec![top_p(0.7)], true), &[0.571429, 0.428571]);
    assert_probs(
        &run(&P4, vec![top_p(0.8)], true),
        &[0.44444, 0.33333, 0.22222],
    );
}

#[test]
fn min_p_is_relative_to_the_best() {
    let min_p = |p| Stage::MinP { p, min_keep: 0 };
    assert_probs(&run(&P4, vec![min_p(0.24)], true), &P4);
    assert_probs(
        &run(&P4, vec![min_p(0.26)], true),
        &[0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9],
    );
    assert_probs(&run(&P4, vec![min_p(0.51)], true), &[0.3 / 0.7, 0.4 / 0.7]);
    assert_probs(&run(&P4, vec![min_p(0.76)], true), &[1.0]);
    assert_probs(&run(&P4, vec![min_p(1.05)], true), &[1.0]);
}

#[test]
fn xtc_removes_the_top_choices_above_threshold() {
    let probs = [0.4, 0.3, 0.2, 0.1];
    let xtc = |t| Stage::Xtc(Xtc::new(0.99, t, 0, 0).expect("enabled"));
    assert_probs(&run(&probs, vec![xtc(0.09)], false), &[0.1]);
    assert_probs(&run(&probs, vec![xtc(0.19)], false), &[0.2, 0.1]);
    assert_probs(&run(&probs, vec![xtc(0.29)], false), &[0.3, 0.2, 0.1]);
    assert_probs(&run(&probs, vec![xtc(0.39)], false), &probs);
}

#[test]
fn typical_keeps_locally_typical_tokens() {
    let typical = |p| Stage::TypicalP { p, min_keep: 0 };
    assert_probs(
        &run(&[0.97, 0.01, 0.01, 0.01], vec![typical(0.5)], false),
        &[0.97],
    );
    assert_probs(
        &run(&[0.4, 0.2, 0.2, 0.2], vec![typical(0.5)], false),
        &[0.2, 0.2, 0.2],
    );
}

fn penalised(last: &[u32], repeat: f32, freq: f32, present: f32) -> Vec<f32> {
    let mut stage = Penalties::new(last.len() as i32, repeat, freq, present).expect("enabled");
    for &t in last {
        stage.accept(t);
    }
    run(&[0.2; 5], vec![Stage::Penalties(stage)], true)
}

#[test]
fn repetition_frequency_and_presence_penalties() {
    assert_probs(
        &penalised(&[0], 50.0, 0.0, 0.0),
        &[0.0, 0.25, 0.25, 0.25, 0.25],
    );
    assert_probs(
        &penalised(&[0, 1, 2], 50.0, 0.0, 0.0),
        &[0.0, 0.0, 0.0, 0.5, 0.5],
    );
    assert_probs(
        &penalised(&[0, 1, 2, 0, 0], 50.0, 0.0, 0.0),
        &[0.0, 0.0, 0.0, 0.5, 0.5],
    );
    assert_probs(
        &penalised(&[0], 1.0, 5.0, 5.0),
        &[0.000011, 0.249997, 0.249997, 0.249997, 0.249997],
    );
    assert_probs(
        &penalised(&[0, 1, 2], 1.0, 5.0, 5.0),
        &[0.000023, 0.000023, 0.000023, 0.499966, 0.499966],
    );
    assert_probs(
        &penalised(&[0, 1, 2, 0, 0], 1.0, 5.0, 5.0),
        &[0.0, 0.000023, 0.000023, 0.499977, 0.499977],
    );
}

#[allow(clippy::too_many_arguments)]
fn dried(
    probs: &[f32],
    last: &[u32],
    multiplier: f32,
    base: f32,
    allowed: i32,
    last_n: i32,
    breakers: &[&str],
) -> Vec<f32> {
    let breakers: Vec<String> = breakers.iter().map(|s| s.to_string()).collect();
    let mut stage = Dry::new(
        &Letters(probs.len()),
        multiplier,
        base,
        allowed,
        last_n,
        &breakers,
    )
    .expect("enabled");
    for &t in last {
        stage.accept(t);
    }
    run(probs, vec![Stage::Dry(stage)], true)
}

#[test]
fn dry_penalises_tokens_that_extend_repeats() {
    let q = [0.25; 4];
    let f = [0.2; 5];
    assert_probs(&dried(&q, &[0, 1], 1.0, 1.1, 2, 4, &[]), &q);
    assert_probs(
        &dried(&q, &[0, 1, 2, 0, 1], 1.0, 1.1, 2, 5, &[]),
        &[0.296923, 0.296923, 0.109232, 0.296923],
    );
    // Token 3 ("d") is a breaker: the repeat cannot reach across it.
    assert_probs(&dried(&f, &[0, 1, 3, 4, 0, 1], 1.0, 1.1, 2, 6, &["d"]), &f);
    assert_probs(
        &dried(&f, &[0, 1, 2, 0, 1], 2.0, 1.1, 2, 5, &[]),
        &[0.241818, 0.241818, 0.032727, 0.241818, 0.241818],
    );
    assert_probs(&dried(&f, &[0, 1, 2, 3, 4, 0, 1], 1.0, 1.1, 4, 7, &[]), &f);
}

#[test]
fn top_n_sigma_masks_far_tokens() {
    assert_probs(
        &run(&P4, vec![Stage::TopNSigma(1.0)], true),
        &[0.0, 0.0, 0.428571, 0.571429],
    );
    assert_probs(&run(&P4, vec![Stage::TopNSigma(3.0)], true), &P4);
}

#[test]
fn dist_with_one_candidate_still_draws() {
    let mut single = Stage::Dist(Dist::new(4242));
    let mut control = Stage::Dist(Dist::new(4242));
    single.apply(&mut Candidates::from_logits(&[0.0]));
    control.apply(&mut Candidates::from_logits(&[0.0, 0.0]));
    let logits = vec![0.0f32; 256];
    for _ in 0..4 {
        let mut x = Candidates::from_logits(&logits);
        let mut y = Candidates::from_logits(&logits);
        single.apply(&mut x);
        control.apply(&mut y);
        assert_eq!(x.selected, y.selected);
    }
}

#[test]
fn greedy_chain_picks_the_argmax_whatever_the_seed() {
    let params = SamplingParams {
        temp: 0.0,
        ..SamplingParams::default()
    };
    let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
    let best = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32);
    for seed in [0, 1, 7, DEFAULT_SEED] {
        let mut s = Sampler::new(
            &SamplingParams {
                seed,
                ..params.clone()
            },
            100,
            &Letters(0),
        )
        .expect("valid params");
        assert_eq!(s.sample(&logits).ok(), best);
    }
}

#[test]
fn default_chain_order_and_empty_stages() {
    let s = Sampler::new(&SamplingParams::default(), 10, &Letters(0)).expect("valid");
    assert_eq!(s.describe(), "top-k -> top-p -> min-p -> temp-ext -> dist");
    let s = Sampler::new(
        &SamplingParams {
            mirostat: 2,
            ..SamplingParams::default()
        },
        10,
        &Letters(0),
    )
    .expect("valid");
    assert_eq!(s.describe(), "temp -> mirostat-v2");
}

#[test]
fn seeded_sampling_repeats_and_matches_a_hand_draw() {
    let logits = [1.0f32, 2.0, 3.0, 0.5];
    let params = SamplingParams {
        seed: 1234,
        temp: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplingParams::default()
    };
    let mut a = Sampler::new(&params, 4, &Letters(0)).expect("valid");
    let mut b = Sampler::new(&params, 4, &Letters(0)).expect("valid");
    let mut rng = Mt19937::new(1234);
    for _ in 0..20 {
        let ta = a.sample(&logits).expect("token");
        assert_eq!(ta, b.sample(&logits).expect("token"));
        // The hand draw: softmax in array order, then the first running sum reaching u * total.
        let max = 3.0f32;
        let ps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
        let total: f64 = ps.iter().map(|&p| f64::from(p)).sum();
        let target = total * rng.uniform_f64();
        let mut run = 0.0;
        let want = ps
            .iter()
            .position(|&p| {
                run += f64::from(p);
                run >= target
            })
            .expect("found") as u32;
        assert_eq!(ta, want);
    }
}

#[test]
fn bad_penalties_are_refused_by_name() {
    let err = Sampler::new(
        &SamplingParams {
            penalty_repeat: 0.0,
            ..SamplingParams::default()
        },
        10,
        &Letters(0),
    )
    .err()
    .expect("refused");
    assert!(err.0.contains("penalty_repeat"), "{err}");
}

#[test]
fn sampler_names_letters_and_aliases() {
    assert_eq!(
        SamplerType::parse_names(&["Top-K", "minp", "nucleus", "temp", "bogus", "typ_p"]),
        vec![
            SamplerType::TopK,
            SamplerType::MinP,
            SamplerType::TopP,
            SamplerType::Temperature,
            SamplerType::TypicalP
        ]
    );
    assert_eq!(
        SamplerType::parse_letters("kpt?"),
        vec![
            SamplerType::TopK,
            SamplerType::TopP,
            SamplerType::Temperature
        ]
    );
}

#[test]
fn token_probabilities_put_the_best_first() {
    let probs = token_probabilities(&[0.0, 2.0, 1.0], 2);
    assert_eq!(probs[0].id, 1);
    assert_eq!(probs[1].id, 2);
    let total: f32 = probs.iter().map(|t| t.p).sum();
    assert!((total - 1.0).abs() < 1e-6);
}

/// Tokens 0..4 are the letters `a`..`d`; token 4 ends generation.
fn letter_texts() -> Arc<TokenTexts> {
    Arc::new(TokenTexts::new(5, |t| vec![b'a' + t as u8], |t| t == 4))
}

fn greedy_with_grammar(src: &str) -> Sampler {
    let params = SamplingParams {
        temp: 0.0,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(&params, 5, &Letters(5)).unwrap();
    let g = crate::grammar::Grammar::new(src, "root", None).unwrap();
    s.set_grammar(GrammarState::new(g), letter_texts());
    s
}

#[test]
fn a_grammar_overrides_the_chains_pick_and_then_allows_the_end() {
    let mut s = greedy_with_grammar("root ::= [bc] \"d\"\n");
    // `a` is likeliest but the grammar wants `b` or `c`: the masked rerun picks `c`.
    let logits = [5.0, 1.0, 2.0, 0.0, 9.0];
    assert_eq!(s.sample(&logits).unwrap(), 2);
    s.accept_generated(2).unwrap();
    assert_eq!(s.sample(&logits).unwrap(), 3);
    s.accept_generated(3).unwrap();
    // Complete: only the end token is left.
    assert_eq!(s.sample(&[9.0, 9.0, 9.0, 9.0, 0.0]).unwrap(), 4);
    s.accept_generated(4).unwrap();
}

#[test]
fn a_token_the_grammar_refuses_is_an_error_not_a_panic() {
    let mut s = greedy_with_grammar("root ::= \"a\"\n");
    assert!(s.accept_generated(1).is_err());
    assert!(s.accept_generated(4).is_err(), "the grammar cannot end yet");
}

#[test]
fn the_generation_prompt_is_fed_through_the_grammar() {
    let mut s = greedy_with_grammar("root ::= \"ab\" [cd]\n");
    s.prefill_grammar(&[0, 1]).unwrap();
    assert_eq!(s.sample(&[9.0, 9.0, 1.0, 2.0, 0.0]).unwrap(), 3);
}

#[test]
fn partial_sort_leaves_every_element_where_libstdcxx_does() {
    // 40 logits with ties, partially sorted for the best 5; the order recorded from g++ 12's
    // `std::partial_sort` with `a.logit > b.logit` (the rest's order decides upstream's f32
    // normalizing sum in `get_token_probabilities`)
    let mut s = 12345u32;
    let mut v: Vec<(u32, f32)> = (0..40)
        .map(|i| {
            s = s.wrapping_mul(1103515245).wrapping_add(12345);
            (i, ((s >> 16) % 17) as f32 - 8.0)
        })
        .collect();
    super::partial_sort_libstdcxx(&mut v, 5, |a, b| a.1 > b.1);
    let ids: Vec<u32> = v.iter().map(|t| t.0).collect();
    assert_eq!(
        ids,
        [
            26, 18, 5, 6, 3, 1, 4, 0, 2, 7, 10, 11, 12, 13, 14, 15, 16, 17, 8, 19, 20, 21, 22, 23,
            24, 25, 9, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39
        ]
    );
}
