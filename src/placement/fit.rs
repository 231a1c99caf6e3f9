//! The planning steps: the user's layout as upstream reads it, `--fit` (context first, then
//! layers, touching only what the user left unset), bloomery's automatic card + host plan and
//! `--place bp`, expert copies, the disk tier, and the final check of every pool.

use super::budget::Sizing;
use super::copies;
use super::layout::{
    experts_to_host, layer_devices, select_devices, user_overrides, Layout, Placed,
};
use super::plan::{
    ranges, ExpertSet, LayerPlan, Location, NotFit, Plan, PlanError, Pool, TensorPlan,
};
use super::PlanRequest;
use crate::cli::config::{GpuLayers, Place, Source, Sourced};
use crate::model::GgmlType;
use std::collections::BTreeSet;

const MIB: u64 = 1 << 20;
/// `-fitt` for devices past the list.
const DEFAULT_MARGIN_MIB: u64 = 1024;
/// Upstream keeps a fitted context a multiple of this (per stream).
const CTX_ALIGN: u32 = 256;

/// Plans `req`, or says which pool cannot hold what, with every term.
pub fn plan(req: &PlanRequest) -> Result<Plan, PlanError> {
    let p = Planner::new(req)?;
    let intent = req.intent;
    let user_set = p.user_placement();
    let mut notes = Vec::new();
    let bp = intent.place.value == Place::BalancedPipeline;
    let mut layout = if bp {
        if let Some(option) = user_set {
            return Err(PlanError::PlaceConflict(option));
        }
        p.balanced_pipeline()?
    } else {
        p.user_layout()?
    };
    if intent.fit.value && !p.fits(&layout) {
        p.shrink_context(&mut layout, &mut notes);
        // upstream's --fit moves layers only when the user set none of the layer options
        if !p.fits(&layout) && user_set.is_none() && !bp && !p.chosen.is_empty() {
            p.card_and_host(&mut layout, &mut notes);
        }
    }
    if bp {
        let expert_card = layout.experts.iter().find_map(|s| s.card);
        p.copy_experts(&mut layout, &|_| expert_card);
    }
    p.spill_to_disk(&mut layout, &mut notes);
    p.finish(layout, notes)
}

struct Planner<'a> {
    req: &'a PlanRequest<'a>,
    sizing: Sizing<'a>,
    /// The devices the model may use, as indices into `req.devices`.
    chosen: Vec<usize>,
    /// Every device's pool, empty, with its margin and budget.
    cards: Vec<Pool>,
    host: Pool,
    n_streams: u32,
}

fn cache_type(name: &str) -> Result<GgmlType, PlanError> {
    GgmlType::from_name(name).ok_or_else(|| PlanError::CacheType(name.to_string()))
}

/// How the user spelled an option, or `fallback` when it came from nowhere nameable.
fn spelled<T>(s: &Sourced<T>, fallback: &str) -> String {
    match &s.source {
        Source::Flag(n) | Source::Env(n) | Source::File(n) => n.clone(),
        Source::Default => fallback.to_string(),
    }
}

impl<'a> Planner<'a> {
    fn new(req: &'a PlanRequest<'a>) -> Result<Planner<'a>, PlanError> {
        let intent = req.intent;
        let chosen = select_devices(intent, req.devices)?;
        if let Some(b) = intent
            .card_budget
            .value
            .iter()
            .find(|b| !req.devices.iter().any(|d| d.name == b.device))
        {
            return Err(PlanError::BudgetDevice {
                option: spelled(&intent.card_budget, "BLOOMERY_CARD_BUDGET"),
                device: b.device.clone(),
                known: req.devices.iter().map(|d| d.name.clone()).collect(),
            });
        }
        let fit = intent.fit.value;
        let targets = &intent.fit_target_mib.value;
        let margin = |k: usize| {
            let mib = match targets.as_slice() {
                [one] => *one,
                many => many.get(k).copied().unwrap_or(DEFAULT_MARGIN_MIB),
            };
            if fit {
                mib * MIB
            } else {
                0
            }
        };
        let empty = |name: &str, free: u64, total: u64, budget: Option<u64>, margin: u64| Pool {
            name: name.to_string(),
            total,
            free,
            budget,
            margin,
            weights: 0,
            kv: 0,
            scratch: 0,
            stream: 0,
        };
        let cards = req
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let k = chosen.iter().position(|&c| c == i).unwrap_or(i);
                let budget = intent
                    .card_budget
                    .value
                    .iter()
                    .find(|b| b.device == d.name)
                    .map(|b| b.bytes);
                empty(&d.name, d.free_bytes, d.total_bytes, budget, margin(k))
            })
            .collect();
        // upstream weighs host memory only when no device is used
        let host_margin = if chosen.is_empty() { margin(0) } else { 0 };
        let h = req.host;
        let host = empty("host", h.free_bytes, h.total_bytes, None, host_margin);
        let ctx = req.context;
        Ok(Planner {
            req,
            sizing: Sizing {
                inv: req.inventory,
                type_k: cache_type(&intent.cache_type_k.value)?,
                type_v: cache_type(&intent.cache_type_v.value)?,
                ctx,
            },
            chosen,
            cards,
            host,
            n_streams: if ctx.kv_unified { 1 } else { ctx.n_seq.max(1) },
        })
    }

    /// `-ts` for each chosen card (0 past the list), as upstream reads it.
    fn tensor_split(&self) -> Vec<f64> {
        let split = &self.req.intent.tensor_split.value;
        (0..self.chosen.len())
            .map(|k| split.get(k).copied().unwrap_or(0.0) as f64)
            .collect()
    }

    /// The first llama.cpp layer option the user set, by its spelling: upstream's `--fit` leaves
    /// the layers alone once any of them is set.
    fn user_placement(&self) -> Option<String> {
        let i = self.req.intent;
        if i.n_gpu_layers.value != GpuLayers::Auto {
            Some(spelled(&i.n_gpu_layers, "-ngl"))
        } else if self.tensor_split().iter().any(|&s| s != 0.0) {
            Some(spelled(&i.tensor_split, "-ts"))
        } else if !i.override_tensor.value.is_empty() {
            Some(spelled(&i.override_tensor, "-ot"))
        } else if i.cpu_moe.value {
            Some(spelled(&i.cpu_moe, "--cpu-moe"))
        } else if i.n_cpu_moe.value > 0 {
            Some(spelled(&i.n_cpu_moe, "-ncmoe"))
        } else if i.n_cpu_ffn.value > 0 {
            Some(spelled(&i.n_cpu_ffn, "-ncffn"))
        } else {
            None
        }
    }

    fn n_layer(&self) -> u32 {
        self.req.inventory.n_layer
    }

    /// The starting context: the user's, else the training context (times the streams, as
    /// upstream's `--fit` counts it).
    fn initial_ctx(&self) -> u32 {
        let c = self.req.context.n_ctx;
        let train = self.req.inventory.n_ctx_train;
        match (c, self.req.intent.fit.value) {
            (0, true) => train.saturating_mul(self.n_streams),
            (0, false) => train,
            (c, _) => c,
        }
    }

    fn empty_experts(&self) -> Vec<ExpertSet> {
        vec![ExpertSet::default(); self.n_layer() as usize]
    }

    /// The layout llama.cpp's options give.
    fn user_layout(&self) -> Result<Layout, PlanError> {
        let intent = self.req.intent;
        let n_all = self.n_layer() + 1;
        let ngl = match intent.n_gpu_layers.value {
            GpuLayers::Auto | GpuLayers::All => n_all,
            GpuLayers::Count(n) => n,
        };
        let given = self.tensor_split();
        let shares: Vec<f64> = if given.iter().all(|&s| s == 0.0) {
            // by free memory, as upstream; a card budget caps what counts as free
            self.chosen
                .iter()
                .map(|&c| {
                    let card = &self.cards[c];
                    card.budget.map_or(card.free, |b| b.min(card.free)) as f64
                })
                .collect()
        } else {
            given
        };
        Ok(Layout {
            layer_dev: layer_devices(self.n_layer(), ngl, &self.chosen, &shares),
            overrides: user_overrides(intent, self.req.devices)?,
            experts: self.empty_experts(),
            disk_layers: BTreeSet::new(),
            kv_offload: intent.kv_offload.value,
            n_ctx: self.initial_ctx(),
        })
    }

    /// `--place bp`: every layer, the output and the KV cache on the larger card; the experts'
    /// home on the host with copies on the other card.
    fn balanced_pipeline(&self) -> Result<Layout, PlanError> {
        let [first, second] = self.chosen[..] else {
            return Err(PlanError::BalancedPipelineCards(self.chosen.len()));
        };
        let (attention, experts) = if self.cards[second].limit() > self.cards[first].limit() {
            (second, first)
        } else {
            (first, second)
        };
        let inv = self.req.inventory;
        let expert_set = |il: u32| ExpertSet {
            card: (inv.layer_expert_bytes(il) > 0).then_some(experts),
            on_card: Vec::new(),
        };
        Ok(Layout {
            layer_dev: vec![Location::Card(attention); self.n_layer() as usize + 1],
            overrides: vec![experts_to_host()],
            experts: (0..self.n_layer()).map(expert_set).collect(),
            disk_layers: BTreeSet::new(),
            kv_offload: self.req.intent.kv_offload.value,
            n_ctx: self.initial_ctx(),
        })
    }

    fn placed(&self, layout: &Layout) -> Placed {
        layout.place(self.req.inventory, &self.sizing, &self.cards, &self.host)
    }

    /// Whether the pools `--fit` weighs hold the layout: the chosen cards, or the host when no
    /// card is used.
    fn fits(&self, layout: &Layout) -> bool {
        let placed = self.placed(layout);
        if self.chosen.is_empty() {
            placed.host.fits()
        } else {
            self.chosen.iter().all(|&c| placed.cards[c].fits())
        }
    }

    /// `--fit`'s first change: when the user left the context unset, the largest context (a multiple of
    /// 256 per stream, at least `-fitc`) that fits; `-fitc` itself when none does.
    fn shrink_context(&self, layout: &mut Layout, notes: &mut Vec<String>) {
        let from = layout.n_ctx;
        let min = self.req.intent.fit_ctx.value.saturating_mul(self.n_streams);
        if self.req.context.n_ctx != 0 || from <= min {
            return;
        }
        let align = CTX_ALIGN * self.n_streams;
        let fits_at = |n_ctx: u32| {
            let mut l = layout.clone();
            l.n_ctx = n_ctx;
            self.fits(&l)
        };
        let (lo, hi) = (min.div_ceil(align).max(1), from / align);
        let mut best = min;
        if lo <= hi && fits_at(lo * align) {
            // fits at `good`, not at `bad` (past the range counts as not fitting)
            let (mut good, mut bad) = (lo, hi + 1);
            while bad - good > 1 {
                let mid = good + (bad - good) / 2;
                if fits_at(mid * align) {
                    good = mid;
                } else {
                    bad = mid;
                }
            }
            best = good * align;
        }
        layout.n_ctx = best;
        notes.push(format!("--fit: context {from} -> {best} tokens"));
    }

    /// bloomery's plan when nothing was set and the model does not fit: experts to the host
    /// (dense weights stay on the cards); if the dense weights still do not fit, fewer layers on
    /// the cards, filled back to front as upstream's `--fit` does; then expert copies into what
    /// is left of each card.
    fn card_and_host(&self, layout: &mut Layout, notes: &mut Vec<String>) {
        let inv = self.req.inventory;
        if inv.n_expert > 0 {
            layout.overrides = vec![experts_to_host()];
            notes.push("experts live on the host; dense weights on the cards".into());
        }
        if !self.fits(layout) {
            self.fill_layers_back_to_front(layout);
            let on_cards = layout
                .layer_dev
                .iter()
                .filter(|l| matches!(l, Location::Card(_)))
                .count();
            notes.push(format!(
                "--fit: {on_cards} of {} layers (output included) on the cards",
                self.n_layer() + 1
            ));
        }
        if inv.n_expert > 0 {
            let layer_dev = layout.layer_dev.clone();
            self.copy_experts(layout, &|il| match layer_dev[il as usize] {
                Location::Card(c) => Some(c),
                _ => None,
            });
            let copies: usize = layout.experts.iter().map(|s| s.on_card.len()).sum();
            let n_moe = (0..self.n_layer())
                .filter(|&il| inv.layer_expert_bytes(il) > 0)
                .count();
            notes.push(format!(
                "{copies} of {} experts copied to the cards",
                n_moe * inv.n_expert as usize
            ));
        }
    }

    /// Gives the last chosen card as many of the last layers as it holds, then the card before
    /// it as many of the layers before those, and so on.
    fn fill_layers_back_to_front(&self, layout: &mut Layout) {
        let n_all = self.n_layer() + 1;
        let mut counts = vec![0u32; self.chosen.len()];
        for k in (0..self.chosen.len()).rev() {
            let unassigned = n_all - counts[k + 1..].iter().sum::<u32>();
            for n in 1..=unassigned {
                counts[k] = n;
                self.set_layer_counts(layout, &counts);
                if !self.placed(layout).cards[self.chosen[k]].fits() {
                    counts[k] = n - 1;
                    break;
                }
            }
        }
        self.set_layer_counts(layout, &counts);
    }

    fn set_layer_counts(&self, layout: &mut Layout, counts: &[u32]) {
        let shares: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
        layout.layer_dev =
            layer_devices(self.n_layer(), counts.iter().sum(), &self.chosen, &shares);
    }

    /// Copies experts to the card `card_of(layer)` names while it has room, weighing what each
    /// copy saves decode (`copies`): under even routing whole layers, the first layers first;
    /// with routing counts that concentrate on few experts, those experts of every layer.
    fn copy_experts(&self, layout: &mut Layout, card_of: &dyn Fn(u32) -> Option<usize>) {
        let inv = self.req.inventory;
        for il in 0..self.n_layer() {
            if inv.layer_expert_bytes(il) > 0 {
                if let Some(c) = card_of(il) {
                    layout.experts[il as usize].card = Some(c);
                }
            }
        }
        let placed = self.placed(layout);
        let mut room: Vec<u64> = placed
            .cards
            .iter()
            .map(|p| p.limit().saturating_sub(p.used()))
            .collect();
        // the card of each layer with expert tensors that are not on a card already
        let mut card: Vec<Option<usize>> = vec![None; self.n_layer() as usize];
        for (t, at) in inv.tensors.iter().zip(&placed.tensors) {
            if let (true, Some(il), false) = (t.expert, t.layer, matches!(at, Location::Card(_))) {
                if let (Some(c), Some(set)) =
                    (card.get_mut(il as usize), layout.experts.get(il as usize))
                {
                    *c = set.card;
                }
            }
        }
        let chosen = copies::choose(
            &card,
            inv.n_expert,
            inv.n_expert_used,
            self.req.heat,
            &|il, count| self.sizing.expert_copy_bytes(il, count),
            &mut room,
            self.req.copies,
        );
        for ((set, experts), c) in layout.experts.iter_mut().zip(chosen).zip(&card) {
            if c.is_some() {
                set.on_card = experts;
            }
        }
    }

    /// Experts the host cannot hold stay in the mapped file, last layers first.
    fn spill_to_disk(&self, layout: &mut Layout, notes: &mut Vec<String>) {
        let inv = self.req.inventory;
        let mut spilled = Vec::new();
        for il in (0..self.n_layer()).rev() {
            let placed = self.placed(layout);
            if placed.host.fits() {
                break;
            }
            let on_host = inv
                .tensors
                .iter()
                .zip(&placed.tensors)
                .any(|(t, &at)| t.expert && t.layer == Some(il) && at == Location::Host);
            if on_host {
                layout.disk_layers.insert(il);
                spilled.push(il);
            }
        }
        if !spilled.is_empty() {
            notes.push(format!(
                "experts of layers {} are read from disk as needed",
                ranges(spilled.into_iter())
            ));
        }
    }

    /// Checks every pool and writes the plan.
    fn finish(&self, layout: Layout, notes: Vec<String>) -> Result<Plan, PlanError> {
        let inv = self.req.inventory;
        let intent = self.req.intent;
        let placed = self.placed(&layout);
        let cache_types = (
            intent.cache_type_k.value.clone(),
            intent.cache_type_v.value.clone(),
        );
        let budget_source = Some(spelled(&intent.card_budget, "BLOOMERY_CARD_BUDGET"));
        let over = placed
            .cards
            .iter()
            .chain(std::iter::once(&placed.host))
            .find(|p| !p.fits());
        if let Some(pool) = over {
            return Err(PlanError::DoesNotFit(Box::new(NotFit {
                pool: pool.clone(),
                n_ctx: layout.n_ctx,
                cache_types,
                budget_source: pool.budget.and(budget_source),
            })));
        }
        let tensors: Vec<TensorPlan> = inv
            .tensors
            .iter()
            .zip(&placed.tensors)
            .map(|(t, &location)| TensorPlan {
                name: t.name.clone(),
                bytes: t.bytes,
                layer: t.layer,
                expert: t.expert,
                location,
            })
            .collect();
        let layers = (0..self.n_layer() as usize)
            .map(|il| {
                let (kv, kv_bytes) = placed.kv[il];
                LayerPlan {
                    device: layout.layer_dev[il],
                    kv,
                    kv_bytes,
                    experts: whole_experts_on_card(&tensors, il as u32, inv.n_expert)
                        .unwrap_or_else(|| layout.experts[il].clone()),
                    copy_bytes: placed.copies[il],
                }
            })
            .collect();
        Ok(Plan {
            cards: placed.cards,
            host: placed.host,
            tensors,
            layers,
            output: layout.output_dev(),
            tied_output_bytes: match layout.output_dev() {
                Location::Card(_) => inv.tied_output_bytes,
                _ => 0,
            },
            n_ctx: layout.n_ctx,
            cache_types,
            notes,
        })
    }
}

/// Every expert of layer `il`, when all its expert tensors sit on one card.
fn whole_experts_on_card(tensors: &[TensorPlan], il: u32, n_expert: u32) -> Option<ExpertSet> {
    let mut homes = tensors
        .iter()
        .filter(|t| t.expert && t.layer == Some(il))
        .map(|t| t.location);
    let first = homes.next()?;
    match first {
        Location::Card(c) if homes.all(|h| h == first) => Some(ExpertSet {
            card: Some(c),
            on_card: (0..n_expert).collect(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::PlacementIntent;
    use crate::placement::{
        ContextRequest, DeviceInfo, Inventory, LayerKv, TensorEntry, CARD_RUNTIME,
    };

    /// One layer of 1 MiB with 1 KiB of f16 KV per token; no scratch (ubatch 0).
    fn inventory() -> Inventory {
        Inventory {
            tensors: vec![TensorEntry::new("blk.0.attn_q.weight", MIB)],
            n_layer: 1,
            n_expert: 0,
            n_ctx_train: 32768,
            kv: vec![LayerKv {
                k: 256,
                v: 256,
                window: None,
            }],
            tied_output_bytes: 0,
            n_embd: 0,
            n_vocab: 0,
            n_ff_active: 0,
            n_ff_exp: 0,
            n_expert_used: 0,
        }
    }

    /// A device with `bytes` free of `bytes`.
    fn device(name: &str, bytes: u64) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            free_bytes: bytes,
            total_bytes: bytes,
        }
    }

    fn fitted(kv_unified: bool, card: u64) -> Plan {
        let intent = PlacementIntent::default();
        let inv = inventory();
        let devices = [device("CUDA0", card)];
        let host = device("host", 1 << 40);
        let req = PlanRequest {
            intent: &intent,
            inventory: &inv,
            devices: &devices,
            host: &host,
            context: ContextRequest {
                n_ctx: 0,
                n_seq: 2,
                kv_unified,
                swa_full: false,
                n_ubatch: 0,
            },
            heat: None,
            copies: Default::default(),
        };
        plan(&req).expect("plans")
    }

    #[test]
    fn context_shrinks_in_steps_of_256_per_stream() {
        // the margin, the weights, and the CUDA engine's bounded buffers
        let fixed = DEFAULT_MARGIN_MIB * MIB
            + MIB
            + Sizing {
                inv: &inventory(),
                type_k: GgmlType::F16,
                type_v: GgmlType::F16,
                ctx: ContextRequest {
                    n_ctx: 0,
                    n_seq: 1,
                    kv_unified: true,
                    swa_full: false,
                    n_ubatch: 0,
                },
            }
            .card_buffers();
        // room for 20 000 tokens: one stream steps by 256, two streams by 512
        let card = fixed + 20_000 * 1024;
        assert_eq!(fitted(true, card).n_ctx, 19968);
        assert_eq!(fitted(false, card).n_ctx, 19968 / 512 * 512);
        // the training context counts once per stream: 65 536 tokens fit with two streams
        assert_eq!(fitted(false, fixed + 65536 * 1024).n_ctx, 65536);
        // below -fitc (4096 per stream) the context stops at -fitc and the layer leaves the card
        let p = fitted(false, fixed + 1000 * 1024);
        assert_eq!(p.n_ctx, 8192);
        assert_eq!(p.layers[0].device, Location::Host);
    }

    const GIB: u64 = 1 << 30;

    /// Bytes of `n` weights in Q4_K (144 bytes per 256) and Q6_K (210 per 256).
    fn q4_k(n: u64) -> u64 {
        n / 256 * 144
    }
    fn q6_k(n: u64) -> u64 {
        n / 256 * 210
    }

    /// Qwen3-30B-A3B's shape in Q4_K_M-like sizes: 48 layers of 128 experts (2048 wide, 768 per
    /// expert, 8 used), 32 query and 4 KV heads of 128, 151 936 tokens; 373.5 MiB of experts
    /// and 11.4 MiB of attention, norms and router per layer.
    fn qwen3moe() -> Inventory {
        let (embd, vocab, ff_exp, experts) = (2048u64, 151_936u64, 768u64, 128u64);
        let mut tensors = vec![
            TensorEntry::new("token_embd.weight", q4_k(vocab * embd)),
            TensorEntry::new("output_norm.weight", embd * 4),
            TensorEntry::new("output.weight", q6_k(vocab * embd)),
        ];
        for il in 0..48 {
            let mut t = |name: &str, bytes: u64| {
                tensors.push(TensorEntry::new(&format!("blk.{il}.{name}.weight"), bytes))
            };
            t("attn_norm", embd * 4);
            t("attn_q", q4_k(embd * 4096));
            t("attn_k", q4_k(embd * 512));
            t("attn_v", q6_k(embd * 512));
            t("attn_output", q4_k(4096 * embd));
            t("attn_q_norm", 128 * 4);
            t("attn_k_norm", 128 * 4);
            t("ffn_norm", embd * 4);
            t("ffn_gate_inp", embd * experts * 4);
            t("ffn_gate_exps", q4_k(embd * ff_exp * experts));
            t("ffn_up_exps", q4_k(embd * ff_exp * experts));
            t("ffn_down_exps", q6_k(ff_exp * embd * experts));
        }
        Inventory {
            tensors,
            n_layer: 48,
            n_expert: experts as u32,
            n_ctx_train: 40960,
            kv: vec![
                LayerKv {
                    k: 512,
                    v: 512,
                    window: None,
                };
                48
            ],
            tied_output_bytes: 0,
            n_embd: embd as u32,
            n_vocab: vocab as u32,
            n_ff_active: 6144,
            n_ff_exp: 768,
            n_expert_used: 8,
        }
    }

    /// Plans `inv` from a command line and environment onto one card of `card` bytes.
    fn planned(
        args: &[&str],
        env: &[(&str, &str)],
        inv: &Inventory,
        card: u64,
    ) -> Result<Plan, PlanError> {
        let argv: Vec<String> = ["bloomery-serve", "-m", "x.gguf"]
            .iter()
            .chain(args)
            .map(|s| s.to_string())
            .collect();
        let lookup = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        let parsed =
            crate::cli::parse(&argv, &lookup).unwrap_or_else(|e| panic!("{args:?}: {}", e.message));
        let devices = [device("CUDA0", card)];
        let host = device("host", 256 * GIB);
        plan(&PlanRequest {
            intent: &parsed.placement,
            inventory: inv,
            devices: &devices,
            host: &host,
            context: ContextRequest {
                n_ctx: parsed.config.context.ctx_size.max(0) as u32,
                n_seq: 4,
                kv_unified: true,
                swa_full: false,
                n_ubatch: parsed.config.context.ubatch as u32,
            },
            heat: None,
            copies: Default::default(),
        })
    }

    #[test]
    fn a_card_reserves_two_layers_of_streamed_experts() {
        let inv = qwen3moe();
        let layer = inv.layer_expert_bytes(0);
        assert_eq!(layer, 373 * MIB + MIB / 2);
        // (options, the ring on the card): experts off the card for any layer the card runs
        // need the ring; experts all on the card, or no layer on the card, need none
        let table: [(&[&str], u64); 8] = [
            (&["--cpu-moe"], 2 * layer),
            (&["-ncmoe", "10"], 2 * layer),
            (&["-ot", "exps=CPU"], 2 * layer),
            (&["-ot", r"blk\.3\.ffn_down_exps=CPU"], 2 * layer),
            (&["-ngl", "5", "--cpu-moe"], 2 * layer),
            (&[], 0),
            (&["-ngl", "all"], 0),
            (&["-ngl", "0", "--cpu-moe"], 0),
        ];
        for (args, ring) in table {
            let args: Vec<&str> = args.iter().copied().chain(["-c", "4096"]).collect();
            let p = planned(&args, &[], &inv, 140 * GIB).unwrap_or_else(|e| panic!("{e}"));
            let card = &p.cards[0];
            assert_eq!(card.stream, ring, "{args:?}\n{p}");
            assert_eq!(p.host.stream, 0, "{args:?}");
            assert_eq!(
                card.used(),
                card.weights + card.kv + card.scratch + ring,
                "{args:?}"
            );
            let text = p.to_string();
            let group = p
                .groups()
                .into_iter()
                .find(|g| g.what == "expert stream ring (2 layer buffers)");
            if ring > 0 {
                assert!(
                    text.contains("expert ring 2 x 373.5 MiB"),
                    "{args:?}\n{text}"
                );
                assert_eq!(
                    group.map(|g| (g.location, g.bytes)),
                    Some(("CUDA0".into(), ring))
                );
            } else {
                assert!(!text.contains("ring"), "{args:?}\n{text}");
                assert_eq!(group, None, "{args:?}");
            }
        }
    }

    #[test]
    fn the_ring_holds_the_largest_streamed_layer() {
        let mut inv = qwen3moe();
        let layer = inv.layer_expert_bytes(0);
        let last = inv
            .tensors
            .iter_mut()
            .find(|t| t.name == "blk.47.ffn_down_exps.weight")
            .expect("layer 47 has experts");
        last.bytes *= 2;
        let big = inv.layer_expert_bytes(47);
        assert!(big > layer);
        for (args, ring) in [
            (&["--cpu-moe", "-c", "4096"][..], 2 * big),
            // layers 0-9 stream; layer 47 is whole on the card
            (&["-ncmoe", "10", "-c", "4096"], 2 * layer),
        ] {
            let p = planned(args, &[], &inv, 140 * GIB).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(p.cards[0].stream, ring, "{args:?}");
        }
    }

    #[test]
    fn an_8_gib_budget_holds_weights_kv_scratch_and_ring() {
        let inv = qwen3moe();
        let layer = inv.layer_expert_bytes(0);
        let one_expert = layer / 128;
        let budget = [("BLOOMERY_CARD_BUDGET", "CUDA0=8G")];
        for args in [&[][..], &["-c", "32768"], &["-c", "4096", "-ub", "2048"]] {
            let p = planned(args, &budget, &inv, 140 * GIB).unwrap_or_else(|e| panic!("{e}"));
            let card = &p.cards[0];
            assert_eq!(card.budget, Some(8 * GIB));
            // the process's whole card memory, the CUDA runtime's included, within the budget
            assert!(card.used() + CARD_RUNTIME <= 8 * GIB, "{args:?}\n{p}");
            assert_eq!(card.stream, 2 * layer, "{args:?}\n{p}");
            assert_eq!(
                p.layers
                    .iter()
                    .filter(|l| l.device == Location::Card(0))
                    .count(),
                48,
                "dense weights stay on the card: {args:?}\n{p}"
            );
            // the copies fill what the ring leaves, to within one expert
            let copies: usize = p.layers.iter().map(|l| l.experts.on_card.len()).sum();
            assert!(copies > 0 && copies < 48 * 128, "{args:?}\n{p}");
            assert!(
                8 * GIB - CARD_RUNTIME - card.used() < one_expert,
                "{args:?}\n{p}"
            );
        }
    }

    #[test]
    fn a_refusal_names_the_ring() {
        let inv = qwen3moe();
        let e = planned(&["--cpu-moe", "-fit", "off", "-c", "4096"], &[], &inv, GIB)
            .expect_err("1 GiB holds no 48 layers");
        assert_eq!(
            e.to_string(),
            "the model does not fit on CUDA0: weights 790.6 MiB + KV 384.0 MiB (context 4096 tokens, \
             K f16 V f16) + scratch 884.7 MiB + expert ring 2 x 373.5 MiB = 2.74 GiB, but free 1.00 GiB \
             less margin 0.0 MiB leaves 1.00 GiB"
        );
        let e = planned(
            &["--cpu-moe", "-c", "4096"],
            &[("BLOOMERY_CARD_BUDGET", "CUDA0=2G")],
            &inv,
            140 * GIB,
        )
        .expect_err("--cpu-moe keeps every layer on the card, so --fit cannot move one");
        let e = e.to_string();
        assert!(e.contains(" + expert ring 2 x 373.5 MiB = "), "{e}");
        assert!(
            e.ends_with(
                "and BLOOMERY_CARD_BUDGET allows 2.00 GiB (1.00 GiB of it for the CUDA runtime)"
            ),
            "{e}"
        );
    }
}
