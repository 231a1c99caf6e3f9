//! The scheduler on the mock engine: continuous batching, prompt cache, cancellation, limits.

use std::sync::Arc;
use std::time::Duration;

use bloomery::sampling::SamplingParams;
use bloomery::server::scheduler::{self, SlotAction, SlotActionResult};
use bloomery::server::task::{ErrorKind, Event, FinalResult, StopType};
use bloomery::server::testing::{mock_greedy, ByteCodec, MockEngine};
use bloomery::server::{
    CacheOptions, SchedulerConfig, SchedulerHandle, TaskParams, TaskRequest, TextCodec,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

fn greedy(n_predict: i32) -> TaskParams {
    TaskParams {
        n_predict,
        sampling: SamplingParams {
            temp: 0.0,
            ..SamplingParams::default()
        },
        ..TaskParams::default()
    }
}

fn start(engine: MockEngine, config: SchedulerConfig) -> SchedulerHandle {
    let (handle, _thread) =
        scheduler::spawn(Box::new(engine), Arc::new(ByteCodec), config).expect("spawn");
    handle
}

fn submit(h: &SchedulerHandle, prompt: &str, params: TaskParams) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    h.submit(TaskRequest {
        tokens: ByteCodec.tokenize(prompt, true, false),
        params: Arc::new(params),
        id_slot: -1,
        index: 0,
        events: tx,
    });
    rx
}

fn finish(mut rx: UnboundedReceiver<Event>) -> (Vec<String>, Result<FinalResult, String>) {
    let mut chunks = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Token { token, .. } => chunks.push(token.text),
            Event::Final(f) => return (chunks, Ok(*f)),
            Event::Error(e) => return (chunks, Err(format!("{:?}: {}", e.kind, e.message))),
            Event::Embd(_) => return (chunks, Err("an embedding result".into())),
        }
    }
    (chunks, Err("channel closed".into()))
}

/// What greedy decoding of the mock gives, computed straight on a fresh engine.
fn reference(prompt: &str, n: usize) -> String {
    mock_greedy(&ByteCodec.tokenize(prompt, true, false), n)
}

#[test]
fn greedy_completion_matches_the_reference() {
    let h = start(MockEngine::new(512), SchedulerConfig::default());
    let (_, result) = finish(submit(&h, "Hello", greedy(12)));
    let result = result.expect("final");
    assert_eq!(result.content, reference("Hello", 12));
    assert_eq!(result.n_decoded, 12);
    assert_eq!(result.stop, StopType::Limit);
    assert_eq!(result.n_prompt_tokens, 6);
}

#[test]
fn sixteen_streams_on_four_slots_equal_their_solo_runs() {
    let mut engine = MockEngine::new(256);
    engine.step_delay = Duration::from_millis(1);
    let config = SchedulerConfig {
        n_slots: 4,
        n_ubatch: 16,
        ..SchedulerConfig::default()
    };
    let h = start(engine, config);
    let prompts: Vec<String> = (0..16)
        .map(|i| format!("prompt number {i} {}", "x".repeat(i * 3)))
        .collect();
    let receivers: Vec<_> = prompts
        .iter()
        .map(|p| {
            submit(
                &h,
                p,
                TaskParams {
                    stream: true,
                    ..greedy(20)
                },
            )
        })
        .collect();
    for (p, rx) in prompts.iter().zip(receivers) {
        let (chunks, result) = finish(rx);
        result.expect("final");
        assert_eq!(chunks.concat(), reference(p, 20), "prompt {p:?}");
    }
}

#[test]
fn a_long_prompt_does_not_freeze_running_streams() {
    let mut engine = MockEngine::new(2048);
    engine.step_delay = Duration::from_millis(2);
    let sizes = engine.step_sizes.clone();
    let config = SchedulerConfig {
        n_slots: 2,
        n_ubatch: 32,
        ..SchedulerConfig::default()
    };
    let h = start(engine, config);
    let mut running = submit(
        &h,
        "short",
        TaskParams {
            stream: true,
            ..greedy(200)
        },
    );
    // Wait for the first stream to be decoding, then send a long prompt.
    assert!(matches!(running.blocking_recv(), Some(Event::Token { .. })));
    let long = submit(&h, &"y".repeat(1000), greedy(1));
    let (_, long_result) = finish(long);
    assert_eq!(long_result.expect("final").n_prompt_tokens, 1001);
    let sizes = sizes.lock().expect("sizes").clone();
    assert!(
        sizes.iter().all(|&n| n <= 32),
        "a step exceeded n_ubatch: {sizes:?}"
    );
    // Every step that processed the long prompt also advanced the running stream.
    let mixed = sizes.iter().filter(|&&n| n > 1).count();
    assert!(mixed >= 1000 / 31, "only {mixed} mixed steps: {sizes:?}");
    let (_, r) = finish(running);
    assert_eq!(r.expect("final").n_decoded, 200);
}

#[test]
fn a_shared_prefix_is_reused_and_gives_the_same_output() {
    let h = start(MockEngine::new(1024), SchedulerConfig::default());
    let base = "The quick brown fox jumps over the lazy dog. ";
    let (_, first) = finish(submit(&h, &format!("{base}One"), greedy(8)));
    assert_eq!(first.expect("final").n_prompt_cached, 0);
    let (_, second) = finish(submit(&h, &format!("{base}Two"), greedy(8)));
    let second = second.expect("final");
    assert_eq!(second.n_prompt_cached, 1 + base.len(), "BOS + base");
    assert_eq!(second.content, reference(&format!("{base}Two"), 8));
    let (_, third) = finish(submit(
        &h,
        &format!("{base}Two"),
        TaskParams {
            cache_prompt: false,
            ..greedy(8)
        },
    ));
    let third = third.expect("final");
    assert_eq!(third.n_prompt_cached, 0);
    assert_eq!(third.content, second.content);
}

/// `--cache-reuse`: a later run of the cached prompt that the new prompt has right after the
/// shared prefix is shifted into place instead of evaluated again, as llama-server does; runs
/// shorter than `n_cache_reuse` are not, and the output is the fresh evaluation's.
#[test]
fn cache_reuse_shifts_a_later_cached_run_into_place() {
    // no host prompt cache: it would bring back the second prompt for the fourth
    let config = SchedulerConfig {
        cache: CacheOptions {
            cache_ram_mib: 0,
            ..CacheOptions::default()
        },
        ..SchedulerConfig::default()
    };
    let h = start(MockEngine::new(1024), config);
    let head = "System: be brief. ";
    let dropped = "Old turn that the client has since dropped from the chat. ";
    let kept = "A long turn the client sends again, word for word, after the head. ";
    let reuse = |n: i32| TaskParams {
        n_cache_reuse: n,
        ..greedy(8)
    };
    let (_, first) = finish(submit(&h, &format!("{head}{dropped}{kept}Bye."), greedy(1)));
    first.expect("final");
    let prompt = format!("{head}{kept}Next?");
    let (_, second) = finish(submit(&h, &prompt, reuse(16)));
    let second = second.expect("final");
    assert_eq!(
        second.n_prompt_cached,
        1 + head.len() + kept.len(),
        "BOS + head, then the kept turn moved up"
    );
    assert_eq!(second.content, reference(&prompt, 8));
    // the same again with a minimum longer than the kept turn: only the prefix is reused
    let (_, third) = finish(submit(&h, &format!("{head}{dropped}{kept}Bye."), greedy(1)));
    third.expect("final");
    let (_, fourth) = finish(submit(&h, &prompt, reuse(kept.len() as i32 + 1)));
    let fourth = fourth.expect("final");
    assert_eq!(fourth.n_prompt_cached, 1 + head.len());
    assert_eq!(fourth.content, second.content);
}

#[test]
fn a_dropped_receiver_frees_the_slot() {
    let mut engine = MockEngine::new(4096);
    engine.step_delay = Duration::from_millis(5);
    let h = start(engine, SchedulerConfig::default());
    let mut rx = submit(
        &h,
        "go",
        TaskParams {
            stream: true,
            ..greedy(-1)
        },
    );
    assert!(matches!(rx.blocking_recv(), Some(Event::Token { .. })));
    drop(rx);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let freed = rt.block_on(async {
        for _ in 0..100 {
            if h.slots().await.iter().all(|s| !s.is_processing) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    });
    assert!(freed, "slot still busy after the client left");
    let (_, r) = finish(submit(&h, "next", greedy(3)));
    assert_eq!(r.expect("final").content, reference("next", 3));
}

#[test]
fn limits_stop_words_and_end_of_generation() {
    let mut engine = MockEngine::new(64);
    engine.eos_after = 20;
    let h = start(engine, SchedulerConfig::default());
    // EOS after 20 cells: prompt of 11 tokens -> 9 generated then EOS.
    let (_, r) = finish(submit(&h, "0123456789", greedy(-1)));
    let r = r.expect("final");
    assert_eq!(r.stop, StopType::Eos);
    assert_eq!(r.n_decoded, 10);

    // A stop word taken from the reference output cuts the text before it.
    let text = reference("abc", 6);
    let word: String = text.chars().skip(3).take(2).collect();
    let (_, r) = finish(submit(
        &h,
        "abc",
        TaskParams {
            stop: vec![word.clone()],
            ..greedy(6)
        },
    ));
    let r = r.expect("final");
    assert_eq!(r.stop, StopType::Word);
    assert_eq!(r.stopping_word, word);
    assert_eq!(r.content, text[..text.find(&word).expect("word")]);

    // A prompt as long as the context is refused with the sizes.
    let (_, r) = finish(submit(&h, &"z".repeat(63), greedy(1)));
    let err = r.expect_err("refused");
    assert!(
        err.contains("ExceedContextSize { n_prompt_tokens: 64, n_ctx: 64 }"),
        "{err}"
    );

    // Generation stops when the context is full.
    let mut engine = MockEngine::new(16);
    engine.eos_after = usize::MAX;
    let h = start(engine, SchedulerConfig::default());
    let (_, r) = finish(submit(&h, "0123456789", greedy(-1)));
    let r = r.expect("final");
    assert!(r.truncated);
    assert_eq!(r.stop, StopType::Limit);
}

#[test]
fn streamed_stop_words_are_held_back_until_resolved() {
    let h = start(MockEngine::new(512), SchedulerConfig::default());
    let text = reference("stream", 10);
    let word: String = text.chars().skip(4).take(3).collect();
    let (chunks, r) = finish(submit(
        &h,
        "stream",
        TaskParams {
            stream: true,
            stop: vec![word.clone()],
            ..greedy(10)
        },
    ));
    r.expect("final");
    let streamed = chunks.concat();
    assert_eq!(streamed, text[..text.find(&word).expect("word")]);
}

#[test]
fn slot_save_restore_and_erase() {
    let dir = std::env::temp_dir().join(format!("bloomery-slots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = SchedulerConfig {
        slot_save_path: Some(dir.clone()),
        n_slots: 2,
        ..SchedulerConfig::default()
    };
    let h = start(MockEngine::new(512), config);
    let (_, r) = finish(submit(&h, "remember me", greedy(4)));
    let r = r.expect("final");
    let id = r.id_slot as i64;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let saved = rt
        .block_on(h.slot_action(id, SlotAction::Save("a.bin".into())))
        .expect("saved");
    let SlotActionResult::Saved { n_saved, .. } = saved else {
        panic!("unexpected {saved:?}");
    };
    assert_eq!(n_saved, r.n_tokens_cached);
    let erased = rt
        .block_on(h.slot_action(id, SlotAction::Erase))
        .expect("erased");
    assert!(matches!(erased, SlotActionResult::Erased { n_erased, .. } if n_erased == n_saved));
    let restored = rt
        .block_on(h.slot_action(id, SlotAction::Restore("a.bin".into())))
        .expect("restored");
    assert!(
        matches!(restored, SlotActionResult::Restored { n_restored, .. } if n_restored == n_saved)
    );
    // The restored cache serves the next request.
    let (_, again) = finish(submit(&h, "remember me", greedy(4)));
    let again = again.expect("final");
    assert_eq!(again.n_prompt_cached, 11);
    assert_eq!(again.content, r.content);
    let missing = rt
        .block_on(h.slot_action(id, SlotAction::Restore("nope.bin".into())))
        .expect_err("missing file");
    assert_eq!(missing.kind, ErrorKind::InvalidRequest);
    // Upstream's slot ids wrap modulo the slot count; only a negative remainder is refused.
    let bad = rt
        .block_on(h.slot_action(-3, SlotAction::Erase))
        .expect_err("bad slot");
    assert_eq!(bad.message, "Invalid slot ID");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn seeded_sampling_repeats() {
    let h = start(MockEngine::new(512), SchedulerConfig::default());
    let seeded = || TaskParams {
        n_predict: 16,
        sampling: SamplingParams {
            seed: 42,
            temp: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplingParams::default()
        },
        ..TaskParams::default()
    };
    let (_, a) = finish(submit(&h, "seed", seeded()));
    let (_, b) = finish(submit(&h, "seed", seeded()));
    let a = a.expect("final");
    assert_eq!(a.content, b.expect("final").content);
    assert_ne!(
        a.content,
        reference("seed", 16),
        "sampling at temp 1.5 should differ from greedy"
    );
}

#[test]
fn context_shift_keeps_generating_past_the_context() {
    let config = SchedulerConfig {
        ctx_shift: true,
        ..SchedulerConfig::default()
    };
    let h = start(MockEngine::new(32), config);
    let params = TaskParams {
        n_keep: 4,
        ..greedy(60)
    };
    let (_, r) = finish(submit(&h, "0123456789", params));
    let r = r.expect("final");
    assert_eq!(r.n_decoded, 60, "generation went past the 32-cell context");
    assert!(r.truncated);
    assert!(r.n_tokens_cached < 32);
}

#[test]
fn requested_slots_wrap_and_negative_ids_take_any_slot() {
    let config = SchedulerConfig {
        n_slots: 2,
        ..SchedulerConfig::default()
    };
    let h = start(MockEngine::new(256), config);
    for (id_slot, want) in [
        (0, Some(0)),
        (1, Some(1)),
        (3, Some(1)),
        (4, Some(0)),
        (-3, None),
    ] {
        let (tx, rx) = unbounded_channel();
        h.submit(TaskRequest {
            tokens: ByteCodec.tokenize("x", true, false),
            params: Arc::new(greedy(1)),
            id_slot,
            index: 0,
            events: tx,
        });
        let (_, r) = finish(rx);
        let r = r.expect("final");
        if let Some(w) = want {
            assert_eq!(r.id_slot, w, "id_slot {id_slot}");
        }
    }
}

/// `--cache-ram`: a prompt the slot gave up for another comes back from the host prompt cache
/// (as upstream's does), so a third request repeating the first resumes from all of it; without
/// the cache only the shared BOS is reused. Either way the text is the same.
#[test]
fn the_host_prompt_cache_brings_back_an_earlier_prompt() {
    let first = "the quick brown fox jumps over";
    let run = |cache_ram_mib| {
        let config = SchedulerConfig {
            cache: CacheOptions {
                cache_ram_mib,
                ..CacheOptions::default()
            },
            ..SchedulerConfig::default()
        };
        let h = start(MockEngine::new(512), config);
        let mut cached = Vec::new();
        for prompt in [first, "zzzz yyyy xxxx", first] {
            let (_, r) = finish(submit(&h, prompt, greedy(4)));
            let r = r.expect("final");
            assert_eq!(r.content, reference(prompt, 4));
            cached.push(r.n_prompt_cached);
        }
        cached
    };
    // the third prompt equals the first: all but its last token come back (one is evaluated
    // for logits)
    assert_eq!(run(8192), [0, 1, first.len()]);
    assert_eq!(run(0), [0, 1, 1]);
}

/// `--cache-idle-slots` with one unified KV pool: an idle slot's prompt moves to the host prompt
/// cache when another task starts, and comes back from there; with an engine that cannot save
/// it, it stays in the slot instead of being lost.
#[test]
fn idle_slots_move_to_the_prompt_cache_only_when_it_can_hold_them() {
    let first = "one two three four five six";
    for saves in [true, false] {
        let mut engine = MockEngine::new(512);
        engine.saves = saves;
        let config = SchedulerConfig {
            n_slots: 2,
            cache: CacheOptions {
                kv_unified: true,
                ..CacheOptions::default()
            },
            ..SchedulerConfig::default()
        };
        let h = start(engine, config);
        let (_, a) = finish(submit(&h, first, greedy(4)));
        let (_, b) = finish(submit(&h, "seven eight nine", greedy(4)));
        assert_ne!(a.expect("final").id_slot, b.expect("final").id_slot);
        let (_, again) = finish(submit(&h, first, greedy(4)));
        let again = again.expect("final");
        assert_eq!(again.content, reference(first, 4));
        assert_eq!(again.n_prompt_cached, first.len(), "saves = {saves}");
    }
}
