//! The planner against llama.cpp's placement semantics (b11434) and bloomery's own: intents
//! parsed from real command lines, planned over synthetic inventories and devices, and the plan
//! (or refusal) checked term by term.

use bloomery::backend::cuda::ops::{ATTN_PASS_BYTES, W16_PASS_BYTES};
use bloomery::cli::{parse, PlacementIntent};
use bloomery::model::GgufFile;
use bloomery::placement::{
    plan, ContextRequest, CopyPolicy, DeviceInfo, Inventory, LayerKv, Location, Plan, PlanError,
    PlanRequest, TensorEntry, CARD_RUNTIME,
};
use std::collections::HashMap;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A model of `n_layer` layers: 48 MiB of attention per layer, then either a 96 MiB dense FFN or
/// `n_expert` experts of 6 MiB (2 MiB in each of up, gate, down) with a 1 MiB router; 64 MiB
/// token embeddings and output. KV: 512 K and 512 V elements per token per layer (2 KiB in f16).
fn model(n_layer: u32, n_expert: u32) -> Inventory {
    let mut tensors = vec![
        TensorEntry::new("token_embd.weight", 64 * MIB),
        TensorEntry::new("output_norm.weight", 0),
        TensorEntry::new("output.weight", 64 * MIB),
    ];
    for il in 0..n_layer {
        let mut t = |name: &str, bytes: u64| {
            tensors.push(TensorEntry::new(&format!("blk.{il}.{name}.weight"), bytes))
        };
        t("attn_q", 16 * MIB);
        t("attn_k", 8 * MIB);
        t("attn_v", 8 * MIB);
        t("attn_output", 16 * MIB);
        if n_expert == 0 {
            for p in ["ffn_up", "ffn_gate", "ffn_down"] {
                t(p, 32 * MIB);
            }
        } else {
            t("ffn_gate_inp", MIB);
            for p in ["ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"] {
                t(p, n_expert as u64 * 2 * MIB);
            }
        }
    }
    Inventory {
        tensors,
        n_layer,
        n_expert,
        n_ctx_train: 32768,
        kv: vec![
            LayerKv {
                k: 512,
                v: 512,
                window: None
            };
            n_layer as usize
        ],
        tied_output_bytes: 0,
        n_embd: 2048,
        n_vocab: 32000,
        n_ff_active: 1024,
        n_ff_exp: 0,
        n_expert_used: if n_expert > 0 { 8 } else { 0 },
    }
}

/// KV bytes of one layer per token in f16.
const KV_TOKEN: u64 = 2048;

/// The ring a card keeps for layers of `model(_, n_expert)` whose experts stream from the host:
/// two layers' expert tensors.
fn ring(n_expert: u32) -> u64 {
    2 * n_expert as u64 * 6 * MIB
}
/// What the CUDA engine keeps on a card that computes for `model(_, n_expert)` beyond the scratch:
/// its bounded f16-weight and attention-score passes and, with experts, the f16 inputs and
/// outputs of a pass of 4096 padded expert rows (the experts have no width here), all grown by
/// an eighth; and its copy of the 64 MiB token embeddings.
fn buffers(n_expert: u32) -> u64 {
    // the padded rows of a pass of expert products, and a ubatch's expert outputs twice
    let groups = if n_expert > 0 {
        4096 * 6 * 2048 + 2 * 512 * 8 * 2048 * 4
    } else {
        0
    };
    ((W16_PASS_BYTES + ATTN_PASS_BYTES) as u64 + groups) * 9 / 8 + 64 * MIB
}
/// Scratch of a pool for a 512-token ubatch, without and with the logits.
const SCRATCH: u64 = 512 * 4 * (4 * 2048 + 3 * 1024);
const LOGITS: u64 = 512 * 4 * 32000;

fn parsed(args: &[&str], env: &[(&str, &str)]) -> bloomery::cli::Parsed {
    let argv: Vec<String> = ["bloomery-serve", "-m", "x.gguf"]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect();
    let vars: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    parse(&argv, &|k| vars.get(k).cloned()).unwrap_or_else(|e| panic!("{args:?}: {}", e.message))
}

fn cards(sizes: &[u64]) -> Vec<DeviceInfo> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| DeviceInfo {
            name: format!("CUDA{i}"),
            free_bytes: s,
            total_bytes: s,
        })
        .collect()
}

struct Case {
    args: Vec<&'static str>,
    env: Vec<(&'static str, &'static str)>,
    model: Inventory,
    cards: Vec<DeviceInfo>,
    host: u64,
    heat: Option<Vec<Vec<u64>>>,
    copies: CopyPolicy,
}

impl Case {
    fn new(args: &[&'static str], model: Inventory, cards: Vec<DeviceInfo>) -> Case {
        Case {
            args: args.to_vec(),
            env: Vec::new(),
            model,
            cards,
            host: 256 * GIB,
            heat: None,
            copies: Default::default(),
        }
    }

    fn intent(&self) -> (PlacementIntent, ContextRequest) {
        let p = parsed(&self.args, &self.env);
        let ctx = ContextRequest {
            n_ctx: p.config.context.ctx_size.max(0) as u32,
            n_seq: 4,
            kv_unified: true,
            swa_full: false,
            n_ubatch: p.config.context.ubatch as u32,
        };
        (p.placement, ctx)
    }

    fn run(&self) -> Result<Plan, PlanError> {
        let (intent, context) = self.intent();
        let host = DeviceInfo {
            name: "host".into(),
            free_bytes: self.host,
            total_bytes: self.host,
        };
        plan(&PlanRequest {
            intent: &intent,
            inventory: &self.model,
            devices: &self.cards,
            host: &host,
            context,
            heat: self.heat.as_deref(),
            copies: self.copies,
        })
    }

    fn ok(&self) -> Plan {
        self.run()
            .unwrap_or_else(|e| panic!("{:?} refused: {e}", self.args))
    }

    fn refused(&self) -> String {
        match self.run() {
            Ok(p) => panic!("{:?} was planned:\n{p}", self.args),
            Err(e) => e.to_string(),
        }
    }
}

fn at(p: &Plan, name: &str) -> Location {
    p.tensors
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor {name}"))
        .location
}

/// Each layer's device as `0`, `1` or `h`, then the output's.
fn layer_map(p: &Plan) -> String {
    let code = |l: Location| match l {
        Location::Card(c) => char::from(b'0' + c as u8),
        Location::Host => 'h',
        Location::Disk => 'd',
    };
    p.layers
        .iter()
        .map(|l| code(l.device))
        .chain(std::iter::once(code(p.output)))
        .collect()
}

const C0: Location = Location::Card(0);
const C1: Location = Location::Card(1);
const HOST: Location = Location::Host;

#[test]
fn ngl_auto_all_and_count() {
    let big = || cards(&[80 * GIB]);
    for args in [
        &[][..],
        &["-ngl", "auto"],
        &["-ngl", "all"],
        &["-ngl", "99"],
    ] {
        let p = Case::new(args, model(8, 0), big()).ok();
        assert_eq!(layer_map(&p), "000000000", "{args:?}");
        assert_eq!(
            at(&p, "token_embd.weight"),
            HOST,
            "the input layer stays home"
        );
        assert_eq!(at(&p, "output.weight"), C0);
        assert!(p.notes.is_empty(), "{:?}", p.notes);
    }
    // -ngl N counts the output layer first: the output and the last N-1 repeating layers
    let p = Case::new(&["-ngl", "3"], model(8, 0), big()).ok();
    assert_eq!(layer_map(&p), "hhhhhh000");
    assert_eq!(at(&p, "blk.5.attn_q.weight"), HOST);
    assert_eq!(at(&p, "blk.6.attn_q.weight"), C0);
    assert_eq!(p.layers[5].kv, HOST, "KV follows its layer");
    assert_eq!(p.layers[6].kv, C0);
    let p = Case::new(&["-ngl", "0"], model(8, 0), big()).ok();
    assert_eq!(layer_map(&p), "hhhhhhhhh");
    assert_eq!(
        p.cards[0].used(),
        0,
        "nothing on the card, not even scratch"
    );
    let p = Case::new(&["-ngl", "1"], model(8, 0), big()).ok();
    assert_eq!(layer_map(&p), "hhhhhhhh0", "only the output layer");
}

#[test]
fn tensor_split_over_two_cards() {
    // 8 layers + output = 9, cut at 3/4: layers 0-6 (7/9 >= 0.75 starts card 1)
    let p = Case::new(&["-ts", "3,1"], model(8, 0), cards(&[40 * GIB, 40 * GIB])).ok();
    assert_eq!(layer_map(&p), "000000011");
    let p = Case::new(&["-ts", "0,1"], model(8, 0), cards(&[40 * GIB, 40 * GIB])).ok();
    assert_eq!(layer_map(&p), "111111111");
    // no -ts: by free memory
    let p = Case::new(&[], model(8, 0), cards(&[30 * GIB, 10 * GIB])).ok();
    assert_eq!(layer_map(&p), "000000011");
    // shares past the chosen cards are not read: all zero here, so by free memory
    let p = Case::new(&["-ts", "0,0,5"], model(8, 0), cards(&[30 * GIB, 10 * GIB])).ok();
    assert_eq!(layer_map(&p), "000000011");
    // -ngl with -ts: the offloaded tail is what gets cut
    let p = Case::new(
        &["-ngl", "4", "-ts", "1,1"],
        model(8, 0),
        cards(&[40 * GIB; 2]),
    )
    .ok();
    assert_eq!(layer_map(&p), "hhhhh0011");
}

#[test]
fn split_mode_none_and_main_gpu() {
    let two = || cards(&[40 * GIB, 40 * GIB]);
    let p = Case::new(&["-sm", "none"], model(8, 0), two()).ok();
    assert_eq!(layer_map(&p), "000000000");
    let p = Case::new(&["-sm", "none", "-mg", "1"], model(8, 0), two()).ok();
    assert_eq!(layer_map(&p), "111111111");
    assert_eq!(p.cards[0].used(), 0);
    let p = Case::new(&["-sm", "layer", "-mg", "1"], model(8, 0), two()).ok();
    assert_eq!(layer_map(&p), "000001111", "-mg is ignored by -sm layer");
    assert_eq!(
        Case::new(&["-sm", "none", "-mg", "2"], model(8, 0), two()).refused(),
        "invalid value for main_gpu: 2 (available devices: 2)"
    );
    assert_eq!(
        Case::new(&["-sm", "row"], model(8, 0), two()).refused(),
        "--split-mode row is not built yet; use --split-mode layer or none"
    );
}

#[test]
fn devices_by_name_and_none() {
    let p = Case::new(&["-dev", "none"], model(8, 2), cards(&[80 * GIB])).ok();
    assert_eq!(layer_map(&p), "hhhhhhhhh");
    assert!(p.layers.iter().all(|l| l.kv == HOST));
    assert!(p.tensors.iter().all(|t| t.location == HOST));
    assert_eq!(p.cards[0].used(), 0);
    assert_eq!(p.host.kv, 8 * 32768 * KV_TOKEN);
    let p = Case::new(&["-dev", "CUDA1"], model(8, 0), cards(&[40 * GIB; 2])).ok();
    assert_eq!(layer_map(&p), "111111111");
    assert_eq!(
        Case::new(&["-dev", "Vulkan0"], model(8, 0), cards(&[40 * GIB])).refused(),
        "invalid device: Vulkan0"
    );
    // no devices at all: everything on the host
    let p = Case::new(&[], model(8, 0), Vec::new()).ok();
    assert_eq!(layer_map(&p), "hhhhhhhhh");
}

#[test]
fn cpu_moe_and_n_cpu_moe() {
    let p = Case::new(&["--cpu-moe"], model(8, 16), cards(&[80 * GIB])).ok();
    for il in 0..8 {
        assert_eq!(at(&p, &format!("blk.{il}.ffn_up_exps.weight")), HOST);
        assert_eq!(at(&p, &format!("blk.{il}.ffn_gate_inp.weight")), C0);
        assert_eq!(at(&p, &format!("blk.{il}.attn_q.weight")), C0);
        assert!(p.layers[il].experts.on_card.is_empty());
    }
    assert_eq!(p.host.weights, 64 * MIB + 8 * 16 * 6 * MIB);
    let p = Case::new(&["-ncmoe", "5"], model(8, 16), cards(&[80 * GIB])).ok();
    for il in 0..8 {
        let want = if il < 5 { HOST } else { C0 };
        for part in ["up", "gate", "down"] {
            assert_eq!(at(&p, &format!("blk.{il}.ffn_{part}_exps.weight")), want);
        }
        let on_card = p.layers[il].experts.on_card.len();
        assert_eq!(on_card, if il < 5 { 0 } else { 16 }, "layer {il}");
    }
    // -ncffn moves dense FFNs, not experts
    let p = Case::new(&["-ncffn", "2"], model(8, 0), cards(&[80 * GIB])).ok();
    assert_eq!(at(&p, "blk.1.ffn_down.weight"), HOST);
    assert_eq!(at(&p, "blk.1.attn_q.weight"), C0);
    assert_eq!(at(&p, "blk.2.ffn_down.weight"), C0);
}

#[test]
fn override_tensor_first_match_wins() {
    let p = Case::new(
        &["-ot", r"blk\.1\.ffn_up_exps=CUDA0", "--cpu-moe"],
        model(4, 8),
        cards(&[80 * GIB]),
    )
    .ok();
    assert_eq!(
        at(&p, "blk.1.ffn_up_exps.weight"),
        C0,
        "-ot comes before --cpu-moe"
    );
    assert_eq!(at(&p, "blk.1.ffn_gate_exps.weight"), HOST);
    assert!(
        p.layers[1].experts.on_card.is_empty(),
        "an expert is on the card only with all its weights"
    );
    let p = Case::new(
        &["-ot", r"exps=CPU,blk\.2\.=CUDA1"],
        model(4, 8),
        cards(&[40 * GIB; 2]),
    )
    .ok();
    assert_eq!(at(&p, "blk.2.ffn_up_exps.weight"), HOST);
    assert_eq!(at(&p, "blk.2.attn_q.weight"), C1);
    assert_eq!(at(&p, "blk.0.attn_q.weight"), C0);
    // patterns search, they do not anchor
    let p = Case::new(&["-ot", "attn_(q|k)=CPU"], model(4, 0), cards(&[40 * GIB])).ok();
    assert_eq!(at(&p, "blk.3.attn_k.weight"), HOST);
    assert_eq!(at(&p, "blk.3.attn_v.weight"), C0);
    // pinned host types are not names -ot takes: upstream's CUDA build lists and accepts only
    // CPU and its cards (checked on an H200, session 16)
    let pinned: [(&'static [&'static str], &str); 3] = [
        (&["-ot", "attn_q=CUDA_Host"], "CUDA_Host"),
        (&["-ot", "attn_q=CUDA0_Host"], "CUDA0_Host"),
        (&["-ot", "attn_q=CPU_Host"], "CPU_Host"),
    ];
    for (args, name) in pinned {
        let why = Case::new(args, model(4, 0), cards(&[40 * GIB])).refused();
        assert!(why.contains(name), "{why}");
    }
    // token_embd_norm runs with the first layer; blocks past the layers go with the output
    let mut m = model(4, 8);
    m.tensors
        .push(TensorEntry::new("token_embd_norm.weight", MIB));
    m.tensors
        .push(TensorEntry::new("blk.4.ffn_up_exps.weight", 16 * MIB));
    let p = Case::new(&["-ngl", "1", "-c", "4096"], m.clone(), cards(&[40 * GIB])).ok();
    assert_eq!(layer_map(&p), "hhhh0");
    assert_eq!(at(&p, "token_embd_norm.weight"), HOST);
    assert_eq!(at(&p, "blk.4.ffn_up_exps.weight"), C0);
    let p = Case::new(
        &["-c", "4096"],
        m,
        cards(&[GIB + 450 * MIB + ring(8) + buffers(8)]),
    )
    .ok();
    assert_eq!(layer_map(&p), "00000");
    assert_eq!(at(&p, "token_embd_norm.weight"), C0);
    assert_eq!(
        at(&p, "blk.4.ffn_up_exps.weight"),
        HOST,
        "the head's experts too"
    );
    // an override may name a card -dev left out
    let p = Case::new(
        &["-dev", "CUDA0", "-ot", "output=CUDA1"],
        model(4, 0),
        cards(&[40 * GIB; 2]),
    )
    .ok();
    assert_eq!(at(&p, "output.weight"), C1);
    assert_eq!(at(&p, "output_norm.weight"), C1);
    assert_eq!(
        Case::new(&["-ot", "exps=CUDA3"], model(4, 8), cards(&[40 * GIB])).refused(),
        "--override-tensor exps=CUDA3: unknown buffer type 'CUDA3' (available: CPU, CUDA0)"
    );
    assert!(
        Case::new(&["-ot", "blk\\.(=CPU"], model(4, 8), cards(&[40 * GIB]))
            .refused()
            .starts_with("--override-tensor pattern 'blk\\.(' is not a regular expression")
    );
}

#[test]
fn no_kv_offload_keeps_the_cache_home() {
    let p = Case::new(&["-nkvo", "-c", "8192"], model(8, 0), cards(&[80 * GIB])).ok();
    assert_eq!(layer_map(&p), "000000000");
    assert!(p.layers.iter().all(|l| l.kv == HOST));
    assert_eq!(p.host.kv, 8 * 8192 * KV_TOKEN);
    assert_eq!(p.cards[0].kv, 0);
    let p = Case::new(
        &["-c", "8192", "-ctk", "q8_0"],
        model(8, 0),
        cards(&[80 * GIB]),
    )
    .ok();
    // q8_0 K: 16 blocks of 34 bytes; f16 V: 1024 bytes
    assert_eq!(p.cards[0].kv, 8 * 8192 * (16 * 34 + 1024));
}

/// Card bytes of `model(8, 0)` fully offloaded, without KV.
fn dense8() -> u64 {
    8 * 144 * MIB + 64 * MIB + SCRATCH + LOGITS + buffers(0)
}

#[test]
fn fit_shrinks_an_unset_context() {
    // room for 12 000 tokens of KV after the 1 GiB margin
    let card = dense8() + GIB + 8 * 12000 * KV_TOKEN;
    let p = Case::new(&[], model(8, 0), cards(&[card])).ok();
    assert_eq!(p.n_ctx, 11776, "the largest multiple of 256 that fits");
    assert_eq!(layer_map(&p), "000000000");
    assert_eq!(p.notes, ["--fit: context 32768 -> 11776 tokens"]);
    // -fitt: a smaller margin leaves more context
    // (256 MiB more is 16384 tokens more: 28384, rounded down)
    let p = Case::new(&["-fitt", "768"], model(8, 0), cards(&[card])).ok();
    assert_eq!(p.n_ctx, 28160);
    // -fitc above what fits: the context stops there and layers leave the card
    let p = Case::new(&["-fitc", "16384"], model(8, 0), cards(&[card])).ok();
    assert_eq!(p.n_ctx, 16384);
    assert_eq!(layer_map(&p), "h00000000");
    assert_eq!(
        p.notes[1],
        "--fit: 8 of 9 layers (output included) on the cards"
    );
    // the user's context is never changed
    let p = Case::new(&["-c", "32768"], model(8, 0), cards(&[card])).ok();
    assert_eq!(p.n_ctx, 32768);
    // each layer needs 144 MiB + 64 MiB of KV; the card has 1 339.5 MiB for layers
    assert_eq!(layer_map(&p), "hh0000000");
    // -c 0 asks for the whole training context
    let p = Case::new(&["-c", "0"], model(8, 0), cards(&[card])).ok();
    assert_eq!(p.n_ctx, 32768);
    // an explicit -ngl is the user's: only the context is fitted, and what does not fit is refused
    let e = Case::new(
        &["-ngl", "all", "-fitc", "16384"],
        model(8, 0),
        cards(&[card]),
    )
    .refused();
    assert!(e.starts_with("the model does not fit on CUDA0: "), "{e}");
    // --fit off: the training context, the whole model on the card, or a refusal
    let e = Case::new(&["-fit", "off"], model(8, 0), cards(&[card - GIB])).refused();
    assert!(e.contains("(context 32768 tokens, K f16 V f16)"), "{e}");
    assert!(
        e.contains("margin 0.0 MiB"),
        "--fit off keeps no margin: {e}"
    );
}

#[test]
fn card_budget_caps_a_card() {
    let mut case = Case::new(&["-c", "4096"], model(8, 64), cards(&[80 * GIB]));
    case.env = vec![("BLOOMERY_CARD_BUDGET", "CUDA0=3G")];
    let p = case.ok();
    let card = &p.cards[0];
    assert_eq!(card.budget, Some(3 * GIB));
    // the budget holds the CUDA runtime as well as the plan
    let limit = 3 * GIB - CARD_RUNTIME;
    assert!(card.used() <= limit && card.used() > limit - 6 * MIB, "{p}");
    assert!(p.notes.iter().any(|n| n.contains("experts copied")), "{p}");
    let p2 = Case::new(
        &["-c", "4096", "--card-budget", "CUDA0=3G"],
        model(8, 64),
        cards(&[80 * GIB]),
    )
    .ok();
    assert_eq!(
        p2.cards[0].used(),
        card.used(),
        "the flag and the variable agree"
    );
    let e = Case::new(
        &["-c", "4096", "-fit", "off", "--card-budget", "CUDA0=3G"],
        model(8, 64),
        cards(&[80 * GIB]),
    )
    .refused();
    assert!(
        e.ends_with("and --card-budget allows 3.00 GiB (1.00 GiB of it for the CUDA runtime)"),
        "{e}"
    );
    let mut case = Case::new(&[], model(8, 0), cards(&[80 * GIB]));
    case.env = vec![("BLOOMERY_CARD_BUDGET", "CUDA1=8G")];
    assert_eq!(
        case.refused(),
        "BLOOMERY_CARD_BUDGET names CUDA1, which is not a device (devices: CUDA0)"
    );
}

#[test]
fn automatic_card_and_host_plan() {
    // 8 layers of 64 experts: 3 GiB of experts; the card holds the dense part and some experts
    let dense = 8 * 49 * MIB + 64 * MIB + SCRATCH + LOGITS + 8 * 4096 * KV_TOKEN;
    let room = 100 * 6 * MIB + 3 * MIB;
    let card = dense + GIB + ring(64) + room + buffers(64);
    let p = Case::new(&["-c", "4096"], model(8, 64), cards(&[card])).ok();
    assert_eq!(layer_map(&p), "000000000", "dense weights stay on the card");
    assert_eq!(p.cards[0].stream, ring(64));
    // under even routing the copies gather into whole layers, the first first (no round trip
    // through the host there): layer 0 whole, the other 36 in layer 1
    for il in 0..8 {
        assert_eq!(at(&p, &format!("blk.{il}.attn_q.weight")), C0);
        let want = if il == 0 { C0 } else { HOST };
        assert_eq!(at(&p, &format!("blk.{il}.ffn_up_exps.weight")), want);
        let set = &p.layers[il].experts;
        assert_eq!(set.card, Some(0));
        let n = [64, 36, 0, 0, 0, 0, 0, 0][il];
        assert_eq!(set.on_card, (0..n).collect::<Vec<u32>>(), "layer {il}");
        let copy = if il == 0 { 0 } else { n as u64 * 6 * MIB };
        assert_eq!(p.layers[il].copy_bytes, copy);
    }
    assert_eq!(
        p.cards[0].weights,
        dense - SCRATCH - LOGITS - 8 * 4096 * KV_TOKEN + 600 * MIB
    );
    assert!(p
        .notes
        .contains(&"100 of 512 experts copied to the cards".to_string()));
    // BLOOMERY_EXPERT_COPIES=spread: 100 copies over 8 layers, 13 in the first four, 12 in the
    // rest, lowest indices first
    let mut case = Case::new(&["-c", "4096"], model(8, 64), cards(&[card]));
    case.copies = CopyPolicy::SPREAD;
    let p = case.ok();
    for il in 0..8 {
        assert_eq!(at(&p, &format!("blk.{il}.ffn_up_exps.weight")), HOST);
        let n = if il < 4 { 13 } else { 12 };
        assert_eq!(p.layers[il].experts.on_card, (0..n).collect::<Vec<u32>>());
        assert_eq!(p.layers[il].copy_bytes, n as u64 * 6 * MIB);
    }
    assert_eq!(
        p.cards[0].weights,
        dense - SCRATCH - LOGITS - 8 * 4096 * KV_TOKEN + 600 * MIB
    );
    // with routing counts the hot experts get copies first: layer 2 sends every route to its
    // experts 40-63, so those 24 spare it the host entirely; then layer 0 whole, 12 in layer 1
    let mut case = Case::new(&["-c", "4096"], model(8, 64), cards(&[card]));
    case.heat = Some(
        (0..8)
            .map(|il| {
                (0..64)
                    .map(|e| if il == 2 && e >= 40 { 1000 + e } else { 0 })
                    .collect()
            })
            .collect(),
    );
    let p = case.ok();
    assert_eq!(p.layers[2].experts.on_card, (40..64).collect::<Vec<u32>>());
    assert_eq!(p.layers[0].experts.on_card.len(), 64);
    assert_eq!(p.layers[1].experts.on_card, (0..12).collect::<Vec<u32>>());
    let total: usize = p.layers.iter().map(|l| l.experts.on_card.len()).sum();
    assert_eq!(total, 100);
    // when every expert fits, the experts stay whole on the card
    let p = Case::new(&["-c", "4096"], model(8, 64), cards(&[80 * GIB])).ok();
    assert_eq!(p.layers[0].experts.on_card.len(), 64);
    assert_eq!(p.layers[0].copy_bytes, 0);
    assert_eq!(at(&p, "blk.0.ffn_up_exps.weight"), C0);
}

#[test]
fn automatic_plan_with_dense_weights_too_big() {
    // the card holds 4 layers' dense weights plus output and the ring, no experts
    let card = 4 * 49 * MIB
        + 64 * MIB
        + SCRATCH
        + LOGITS
        + 4 * 4096 * KV_TOKEN
        + ring(64)
        + GIB
        + MIB
        + buffers(64);
    let p = Case::new(&["-c", "4096"], model(8, 64), cards(&[card])).ok();
    assert_eq!(layer_map(&p), "hhhh00000");
    assert!(p.layers.iter().all(|l| l.experts.on_card.is_empty()));
    assert_eq!(at(&p, "blk.7.ffn_up_exps.weight"), HOST);
    // a dense model over two cards: the last card takes the output and the last layers, then
    // the card before it the layers before those
    let layer = 144 * MIB + 4096 * KV_TOKEN;
    let last = GIB + SCRATCH + LOGITS + 64 * MIB + 3 * layer + MIB + buffers(0);
    let first = GIB + SCRATCH + 3 * layer + MIB + buffers(0);
    let p = Case::new(&["-c", "4096"], model(8, 0), cards(&[first, last])).ok();
    assert_eq!(layer_map(&p), "hh0001111");
    assert_eq!(
        p.notes,
        ["--fit: 7 of 9 layers (output included) on the cards"]
    );
}

#[test]
fn balanced_pipeline_over_two_cards() {
    let p = Case::new(
        &["--place", "bp", "-c", "4096"],
        model(8, 64),
        cards(&[2 * GIB, 20 * GIB]),
    )
    .ok();
    assert_eq!(layer_map(&p), "111111111", "attention on the larger card");
    assert!(p.layers.iter().all(|l| l.kv == C1));
    for il in 0..8 {
        assert_eq!(p.layers[il].experts.card, Some(0));
        // whole layers of experts live on card 0 outright, the others at home on the host
        let whole = p.layers[il].experts.on_card.len() == 64;
        let want = if whole { C0 } else { HOST };
        assert_eq!(at(&p, &format!("blk.{il}.ffn_up_exps.weight")), want);
    }
    assert_eq!(
        p.layers[0].experts.on_card.len(),
        64,
        "the first layers whole"
    );
    // card 0 holds expert copies up to its limit (2 GiB less the 1 GiB margin, less scratch
    // and the engine's buffers)
    let copies: usize = p.layers.iter().map(|l| l.experts.on_card.len()).sum();
    assert_eq!(copies as u64, (GIB - SCRATCH - buffers(64)) / (6 * MIB));
    assert_eq!(p.cards[0].scratch, SCRATCH + buffers(64));
    assert_eq!(
        Case::new(&["--place", "bp"], model(8, 64), cards(&[20 * GIB])).refused(),
        "--place bp needs two cards (attention on the larger, experts on the other); found 1"
    );
    assert_eq!(
        Case::new(
            &["--place", "bp", "-ngl", "4"],
            model(8, 64),
            cards(&[20 * GIB; 2])
        )
        .refused(),
        "--place bp decides where layers and experts go; it cannot be combined with -ngl"
    );
    let mut case = Case::new(&["--place", "bp"], model(8, 64), cards(&[20 * GIB; 2]));
    case.env = vec![("LLAMA_ARG_CPU_MOE", "1")];
    assert!(case
        .refused()
        .ends_with("cannot be combined with LLAMA_ARG_CPU_MOE"));
    let p = Case::new(&["--place", "1"], model(8, 0), cards(&[20 * GIB; 2])).ok();
    assert_eq!(layer_map(&p), "111111111");
    assert_eq!(
        Case::new(&["--place", "0+2"], model(8, 0), cards(&[20 * GIB; 2])).refused(),
        "--place names card 2, but there are 2 cards"
    );
}

#[test]
fn host_overflow_goes_to_disk() {
    let mut case = Case::new(
        &["--cpu-moe", "-c", "4096"],
        model(8, 64),
        cards(&[80 * GIB]),
    );
    // the host holds token_embd, scratch and 5 layers of experts
    case.host = 64 * MIB + SCRATCH + 5 * 384 * MIB + MIB;
    let p = case.ok();
    for il in 0..8 {
        let want = if il < 5 { HOST } else { Location::Disk };
        assert_eq!(
            at(&p, &format!("blk.{il}.ffn_down_exps.weight")),
            want,
            "layer {il}"
        );
    }
    assert!(p
        .notes
        .contains(&"experts of layers 5-7 are read from disk as needed".to_string()));
}

#[test]
fn refusal_names_every_term() {
    let e = Case::new(&["-fit", "off", "-c", "4096"], model(8, 0), cards(&[GIB])).refused();
    assert_eq!(
        e,
        "the model does not fit on CUDA0: weights 1.19 GiB + KV 64.0 MiB (context 4096 tokens, \
         K f16 V f16) + scratch 364.5 MiB = 1.61 GiB, but free 1.00 GiB less margin 0.0 MiB leaves 1.00 GiB"
    );
    let e = Case::new(
        &["-ngl", "all", "-c", "4096"],
        model(8, 0),
        cards(&[2 * GIB]),
    )
    .refused();
    assert!(
        e.contains("but free 2.00 GiB less margin 1.00 GiB leaves 1.00 GiB"),
        "{e}"
    );
    let mut case = Case::new(&["-dev", "none", "-c", "4096"], model(8, 0), Vec::new());
    case.host = GIB;
    let e = case.refused();
    assert!(
        e.starts_with("the model does not fit on host: weights 1.25 GiB"),
        "{e}"
    );
}

#[test]
fn the_plan_prints_in_one_block() {
    let p = Case::new(
        &["-ngl", "5", "-c", "4096"],
        model(8, 0),
        cards(&[80 * GIB]),
    )
    .ok();
    let text = p.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "placement: context 4096 tokens, KV cache K f16 V f16"
    );
    assert!(lines[1].starts_with("  CUDA0 "), "{text}");
    assert!(lines[2].starts_with("  host "), "{text}");
    for (what, location) in [
        ("token embeddings", "host"),
        ("layers 0-3 dense", "host"),
        ("layers 4-7 dense", "CUDA0"),
        ("output", "CUDA0"),
        ("KV cache, layers 0-3", "host"),
        ("KV cache, layers 4-7", "CUDA0"),
    ] {
        let line = lines.iter().find(|l| l.trim_start().starts_with(what));
        let line = line.unwrap_or_else(|| panic!("no '{what}' in\n{text}"));
        assert!(line.contains(&format!("-> {location}")), "{line}");
    }
}

#[test]
fn the_real_model_plans_onto_a_small_card() {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/bloomery"))
        });
    let Some(path) = cache
        .map(|c| c.join("models/gemma-3-270m-q4_k_m.gguf"))
        .filter(|p| p.is_file())
    else {
        println!("skipped: the Gemma 3 270M model is absent (run scripts/fetch-test-data.sh)");
        return;
    };
    let file = GgufFile::open(&path).expect("the test model opens");
    let inv = Inventory::from_gguf(&file, &[]).expect("its inventory reads");
    assert_eq!((inv.n_layer, inv.n_expert, inv.n_ctx_train), (18, 0, 32768));
    assert_eq!(inv.tensors.len(), file.tensors.len());
    let embd = file.tensor("token_embd.weight").expect("token_embd").size;
    assert_eq!(
        inv.tied_output_bytes, embd,
        "gemma ties its output to token_embd"
    );
    // 1 K head of 256 and 1 V head of 256 per layer
    assert_eq!(
        inv.kv[0],
        LayerKv {
            k: 256,
            v: 256,
            window: None
        }
    );
    let case = Case::new(&[], inv.clone(), cards(&[3 * GIB]));
    let p = case.ok();
    assert_eq!(layer_map(&p), "0".repeat(19));
    let weights: u64 = file.tensors.iter().map(|t| t.size).sum();
    assert_eq!(p.cards[0].weights + p.host.weights, weights + embd);
    assert_eq!(
        p.host.weights, embd,
        "token_embd stays home, its tied copy goes with the output"
    );
    let p = Case::new(&["-ngl", "0"], inv, cards(&[3 * GIB])).ok();
    assert_eq!(
        p.host.weights, weights,
        "with the output on the host the tied copy reads the same mapped bytes"
    );
}
