//! The planner's answer (`Plan`), its one-block summary for the start screen, and its refusals.

use super::inventory::is_input_name;
use std::fmt;

/// Where a tensor, an expert or a KV cache lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Location {
    /// Index into the devices handed to the planner.
    Card(usize),
    Host,
    /// Left in the memory-mapped file and read on demand (experts only).
    Disk,
}

/// One weight tensor and its home.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    pub name: String,
    pub bytes: u64,
    pub layer: Option<u32>,
    pub expert: bool,
    pub location: Location,
}

impl TensorPlan {
    /// Upstream's input layer (token, position, token-type and per-layer embeddings), which
    /// always stays on the host.
    pub fn is_input(&self) -> bool {
        self.layer.is_none() && is_input_name(&self.name)
    }
}

/// Experts of one layer that have a copy on a card, beside their home tensor (host or disk).
/// When every expert is listed, the layer's expert tensors live on that card outright.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertSet {
    pub card: Option<usize>,
    /// Ascending expert indices.
    pub on_card: Vec<u32>,
}

/// One repeating layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerPlan {
    /// Where the layer runs (upstream's layer device), which holds its weights unless an
    /// override moved them.
    pub device: Location,
    /// Where the layer's KV cache lives.
    pub kv: Location,
    pub kv_bytes: u64,
    pub experts: ExpertSet,
    /// Bytes of the per-expert copies on `experts.card`; 0 when the expert tensors are there
    /// whole.
    pub copy_bytes: u64,
}

/// Card memory the process takes besides the plan's pools (CUDA context, kernel images, cuBLAS
/// workspace, allocation rounding): on the H200 with CUDA 13, a plan held to 7.5 GiB peaked at
/// 8543 MiB (docs/GPU-NOTES.md), so 0.84 GiB; kept at 1 GiB.
pub const CARD_RUNTIME: u64 = 1 << 30;

/// One memory pool (a card, or the host) and what the plan puts in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    /// `CUDA0`, `host`.
    pub name: String,
    pub total: u64,
    pub free: u64,
    /// `BLOOMERY_CARD_BUDGET` for this card.
    pub budget: Option<u64>,
    /// Memory `--fit` leaves free (`-fitt`); 0 with `--fit off` and for the host.
    pub margin: u64,
    pub weights: u64,
    pub kv: u64,
    /// Estimated compute buffers (activations, logits) for one ubatch.
    pub scratch: u64,
    /// The ring of two buffers that expert tensors kept off the card stream through for this
    /// card's layers on long prompts (one copy lands while the other computes), each the size of
    /// the largest such layer's expert tensors; 0 when every layer here has its experts here.
    pub stream: u64,
}

impl Pool {
    pub fn used(&self) -> u64 {
        self.weights + self.kv + self.scratch + self.stream
    }

    /// The most this pool may hold: free memory less the margin, capped by the budget less
    /// [`CARD_RUNTIME`] (a budget caps the card memory the whole process takes).
    pub fn limit(&self) -> u64 {
        let room = self.free.saturating_sub(self.margin);
        self.budget
            .map_or(room, |b| b.saturating_sub(CARD_RUNTIME).min(room))
    }

    pub fn fits(&self) -> bool {
        self.used() <= self.limit()
    }
}

/// Where everything goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// One pool per device handed to the planner, in the same order (`Location::Card(i)`).
    pub cards: Vec<Pool>,
    pub host: Pool,
    pub tensors: Vec<TensorPlan>,
    pub layers: Vec<LayerPlan>,
    /// Upstream's output layer (`output`, `output_norm`, and the tied copy of `token_embd`).
    pub output: Location,
    /// The output layer's copy of a tied `token_embd` on the output's card; 0 when the output
    /// runs on the host, which reads the same mapped bytes as the input layer.
    pub tied_output_bytes: u64,
    /// Context tokens in total, after `--fit`.
    pub n_ctx: u32,
    pub cache_types: (String, String),
    /// What `--fit` and the automatic plan changed, and why, one line each.
    pub notes: Vec<String>,
}

/// One line of the summary: a group of weights or caches and where it sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub what: String,
    pub location: String,
    pub bytes: u64,
}

impl Plan {
    pub fn location_name(&self, at: Location) -> String {
        match at {
            Location::Card(i) => self
                .cards
                .get(i)
                .map_or_else(|| format!("card {i}"), |p| p.name.clone()),
            Location::Host => "host".into(),
            Location::Disk => "disk (mmap)".into(),
        }
    }

    /// The pools that hold anything, cards first.
    pub fn pools(&self) -> Vec<&Pool> {
        self.cards
            .iter()
            .chain(std::iter::once(&self.host))
            .filter(|p| p.used() > 0)
            .collect()
    }

    /// Weights grouped by kind and location, then the KV cache by location.
    pub fn groups(&self) -> Vec<Group> {
        let mut groups = Vec::new();
        let mut push = |what: String, at: Location, bytes: u64| {
            if bytes > 0 {
                groups.push(Group {
                    what,
                    location: self.location_name(at),
                    bytes,
                });
            }
        };
        let input: Vec<&TensorPlan> = self.tensors.iter().filter(|t| t.is_input()).collect();
        for at in locations(input.iter().map(|t| t.location)) {
            push(
                "token embeddings".into(),
                at,
                sum(input.iter().filter(|t| t.location == at)),
            );
        }
        for expert in [false, true] {
            let layer_tensors: Vec<&TensorPlan> = self
                .tensors
                .iter()
                .filter(|t| t.layer.is_some() && t.expert == expert)
                .collect();
            for at in locations(layer_tensors.iter().map(|t| t.location)) {
                let here = || layer_tensors.iter().filter(|t| t.location == at);
                let layers = ranges(here().filter_map(|t| t.layer));
                let kind = if expert { "experts" } else { "dense" };
                push(format!("layers {layers} {kind}"), at, sum(here()));
            }
        }
        for c in 0..self.cards.len() {
            let copies = self.layers.iter().filter(|l| l.experts.card == Some(c));
            let (count, bytes) = copies
                .filter(|l| l.copy_bytes > 0)
                .fold((0, 0), |(n, b), l| {
                    (n + l.experts.on_card.len(), b + l.copy_bytes)
                });
            push(format!("{count} expert copies"), Location::Card(c), bytes);
            push(
                "expert stream ring (2 layer buffers)".into(),
                Location::Card(c),
                self.cards[c].stream,
            );
        }
        let output: Vec<&TensorPlan> = self.tensors.iter().filter(|t| is_output(t)).collect();
        for at in locations(output.iter().map(|t| t.location).chain([self.output])) {
            let tied = if at == self.output {
                self.tied_output_bytes
            } else {
                0
            };
            push(
                "output".into(),
                at,
                sum(output.iter().filter(|t| t.location == at)) + tied,
            );
        }
        for at in locations(self.layers.iter().map(|l| l.kv)) {
            let layers = ranges(
                self.layers
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.kv == at && l.kv_bytes > 0)
                    .map(|(il, _)| il as u32),
            );
            let bytes = self
                .layers
                .iter()
                .filter(|l| l.kv == at)
                .map(|l| l.kv_bytes)
                .sum();
            push(format!("KV cache, layers {layers}"), at, bytes);
        }
        groups
    }
}

fn is_output(t: &TensorPlan) -> bool {
    t.layer.is_none() && !t.is_input()
}

fn sum<'a>(ts: impl Iterator<Item = &'a &'a TensorPlan>) -> u64 {
    ts.map(|t| t.bytes).sum()
}

fn locations(all: impl Iterator<Item = Location>) -> Vec<Location> {
    let mut v: Vec<Location> = all.collect();
    v.sort();
    v.dedup();
    v
}

/// `0-9,20,22-23`.
pub(super) fn ranges(indices: impl Iterator<Item = u32>) -> String {
    let mut v: Vec<u32> = indices.collect();
    v.sort_unstable();
    v.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// `1.50 GiB`, `12.0 MiB`.
fn size(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else {
        format!("{:.1} MiB", b / MIB)
    }
}

/// The stream ring as a term after `sep` (`expert ring 2 x 384.0 MiB`); nothing for a pool
/// without one, so plans with every expert at home read as before.
fn ring(pool: &Pool, sep: &str) -> String {
    if pool.stream == 0 {
        String::new()
    } else {
        format!("{sep}expert ring 2 x {}", size(pool.stream / 2))
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        writeln!(
            f,
            "placement: context {} tokens, KV cache K {} V {}",
            self.n_ctx, self.cache_types.0, self.cache_types.1
        )?;
        for p in self.pools() {
            writeln!(
                f,
                "  {:<6} {:>10} used of {:>10} (weights {}, KV {}, scratch {}{}; free {}, margin {}{})",
                p.name,
                size(p.used()),
                size(p.limit()),
                size(p.weights),
                size(p.kv),
                size(p.scratch),
                ring(p, ", "),
                size(p.free),
                size(p.margin),
                p.budget
                    .map_or_else(String::new, |b| format!(", budget {}", size(b)))
            )?;
        }
        let groups = self.groups();
        let what_w = groups.iter().map(|g| g.what.len()).max().unwrap_or(0);
        let where_w = groups.iter().map(|g| g.location.len()).max().unwrap_or(0);
        for g in &groups {
            writeln!(
                f,
                "  {:what_w$} -> {:where_w$} {:>10}",
                g.what,
                g.location,
                size(g.bytes)
            )?;
        }
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        Ok(())
    }
}

/// Why no plan could be made.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanError {
    /// `-dev NAME` that is not a device.
    UnknownDevice(String),
    /// `-sm none -mg N` past the devices.
    MainGpu { index: i32, available: usize },
    /// `--place N+M` naming a card that is not there.
    PlaceCard { index: u32, available: usize },
    /// `--place bp` without exactly two cards.
    BalancedPipelineCards(usize),
    /// `--place bp` together with a llama.cpp placement option.
    PlaceConflict(String),
    /// `-ot PATTERN=BUFT` naming a buffer type that is not there.
    UnknownBufferType {
        pattern: String,
        buffer_type: String,
        known: Vec<String>,
    },
    /// `-ot PATTERN=...` whose pattern is not a regular expression.
    BadPattern { pattern: String, reason: String },
    /// `BLOOMERY_CARD_BUDGET` naming a device that is not there.
    BudgetDevice {
        option: String,
        device: String,
        known: Vec<String>,
    },
    /// `-sm row` / `-sm tensor`.
    SplitMode(String),
    /// `-ctk` / `-ctv` naming no ggml type.
    CacheType(String),
    /// A pool that cannot hold what the plan puts in it.
    DoesNotFit(Box<NotFit>),
}

/// The terms of a refusal: what the pool would hold and what it has.
#[derive(Clone, Debug, PartialEq)]
pub struct NotFit {
    pub pool: Pool,
    pub n_ctx: u32,
    pub cache_types: (String, String),
    /// The option that set the budget, when one did.
    pub budget_source: Option<String>,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            PlanError::UnknownDevice(name) => write!(f, "invalid device: {name}"),
            PlanError::MainGpu { index, available } => write!(
                f,
                "invalid value for main_gpu: {index} (available devices: {available})"
            ),
            PlanError::PlaceCard { index, available } => write!(
                f,
                "--place names card {index}, but there are {available} cards"
            ),
            PlanError::BalancedPipelineCards(n) => write!(
                f,
                "--place bp needs two cards (attention on the larger, experts on the other); found {n}"
            ),
            PlanError::PlaceConflict(option) => write!(
                f,
                "--place bp decides where layers and experts go; it cannot be combined with {option}"
            ),
            PlanError::UnknownBufferType {
                pattern,
                buffer_type,
                known,
            } => write!(
                f,
                "--override-tensor {pattern}={buffer_type}: unknown buffer type '{buffer_type}' (available: {})",
                known.join(", ")
            ),
            PlanError::BadPattern { pattern, reason } => write!(
                f,
                "--override-tensor pattern '{pattern}' is not a regular expression: {reason}"
            ),
            PlanError::BudgetDevice {
                option,
                device,
                known,
            } => write!(
                f,
                "{option} names {device}, which is not a device (devices: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ),
            PlanError::SplitMode(mode) => write!(
                f,
                "--split-mode {mode} is not built yet; use --split-mode layer or none"
            ),
            PlanError::CacheType(name) => write!(f, "unknown KV cache type '{name}'"),
            PlanError::DoesNotFit(not_fit) => {
                let NotFit {
                    pool,
                    n_ctx,
                    cache_types,
                    budget_source,
                } = not_fit.as_ref();
                write!(
                    f,
                    "the model does not fit on {}: weights {} + KV {} (context {n_ctx} tokens, K {} V {}) + scratch {}{} = {}, ",
                    pool.name,
                    size(pool.weights),
                    size(pool.kv),
                    cache_types.0,
                    cache_types.1,
                    size(pool.scratch),
                    ring(pool, " + "),
                    size(pool.used()),
                )?;
                write!(
                    f,
                    "but free {} less margin {} leaves {}",
                    size(pool.free),
                    size(pool.margin),
                    size(pool.free.saturating_sub(pool.margin))
                )?;
                if let Some(b) = pool.budget {
                    write!(
                        f,
                        " and {} allows {} ({} of it for the CUDA runtime)",
                        budget_source.as_deref().unwrap_or("the card budget"),
                        size(b),
                        size(CARD_RUNTIME)
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for PlanError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_join_runs() {
        assert_eq!(ranges([3, 0, 1, 2, 7, 9, 10].into_iter()), "0-3,7,9-10");
        assert_eq!(ranges(std::iter::empty()), "");
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(size(3 << 29), "1.50 GiB");
        assert_eq!(size(12 << 20), "12.0 MiB");
    }

    #[test]
    fn pool_limit_takes_margin_and_budget() {
        let mut p = Pool {
            name: "CUDA0".into(),
            total: 16 << 30,
            free: 15 << 30,
            budget: None,
            margin: 1 << 30,
            weights: 0,
            kv: 0,
            scratch: 0,
            stream: 0,
        };
        assert_eq!(p.limit(), 14 << 30);
        p.budget = Some(8 << 30);
        assert_eq!(p.limit(), (8 << 30) - CARD_RUNTIME);
    }
}
