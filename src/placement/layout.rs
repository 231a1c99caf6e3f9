//! llama.cpp's placement rules as data: which devices a model uses (`-dev`, `-sm none -mg`,
//! bloomery's `--place N+M`), which device each layer goes to (`-ngl`, `-ts`), and the tensor
//! overrides (`-ot`, `--cpu-moe`, `-ncmoe`, `-ncffn`, first match wins); then where each tensor
//! lands and what each pool holds for a given layout.

use super::budget::Sizing;
use super::inventory::{Inventory, TensorEntry};
use super::plan::{ExpertSet, Location, PlanError, Pool};
use super::DeviceInfo;
use crate::cli::config::{DeviceChoice, Place, SplitMode, TensorOverride};
use crate::cli::PlacementIntent;
use fancy_regex::Regex;
use std::collections::{BTreeMap, BTreeSet};

/// Upstream's `--cpu-moe` pattern; `-ncmoe N` prefixes it with `blk\.{i}` for the first N layers.
pub const EXPERTS_PATTERN: &str = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps";
/// Upstream's `-ncffn` pattern, after `blk\.{i}`.
const DENSE_FFN_PATTERN: &str = r"\.ffn_(up|down|gate)\.";

/// The devices the model may use, as indices into the devices handed to the planner, in
/// upstream's order: `-dev` (or every device), then `--place N+M` picks among those, then
/// `-sm none` keeps only `-mg`.
pub fn select_devices(
    intent: &PlacementIntent,
    devices: &[DeviceInfo],
) -> Result<Vec<usize>, PlanError> {
    let mut chosen: Vec<usize> = match &intent.devices.value {
        DeviceChoice::NoOffload => Vec::new(),
        DeviceChoice::All => (0..devices.len()).collect(),
        DeviceChoice::Named(names) => names
            .iter()
            .map(|n| {
                devices
                    .iter()
                    .position(|d| &d.name == n)
                    .ok_or_else(|| PlanError::UnknownDevice(n.clone()))
            })
            .collect::<Result<_, _>>()?,
    };
    if let Place::Cards(cards) = &intent.place.value {
        chosen = cards
            .iter()
            .map(|&c| {
                chosen.get(c as usize).copied().ok_or(PlanError::PlaceCard {
                    index: c,
                    available: chosen.len(),
                })
            })
            .collect::<Result<_, _>>()?;
    }
    if chosen.is_empty() {
        return Ok(chosen);
    }
    match intent.split_mode.value {
        SplitMode::Layer => Ok(chosen),
        SplitMode::None => {
            let mg = intent.main_gpu.value;
            if mg < 0 {
                return Ok(Vec::new());
            }
            chosen
                .get(mg as usize)
                .map(|&d| vec![d])
                .ok_or(PlanError::MainGpu {
                    index: mg,
                    available: chosen.len(),
                })
        }
        SplitMode::Row => Err(PlanError::SplitMode("row".into())),
        SplitMode::Tensor => Err(PlanError::SplitMode("tensor".into())),
    }
}

/// Upstream's layer split: the last `ngl` of the `n_layer + 1` layers (the output layer counts as
/// layer `n_layer`) go to the devices, cut in proportion to `shares`; the rest stay on the host.
pub fn layer_devices(n_layer: u32, ngl: u32, chosen: &[usize], shares: &[f64]) -> Vec<Location> {
    let n_all = n_layer + 1;
    let act = if chosen.is_empty() { 0 } else { ngl.min(n_all) };
    let start = n_all.saturating_sub(ngl);
    let total: f64 = shares.iter().sum();
    let bounds: Vec<f64> = shares
        .iter()
        .scan(0.0, |acc, s| {
            *acc += s;
            Some(*acc / total)
        })
        .collect();
    (0..n_all)
        .map(|il| {
            if il < start || il - start >= act {
                return Location::Host;
            }
            let at = (il - start) as f64 / act as f64;
            let k = bounds.iter().take_while(|&&b| b <= at).count();
            Location::Card(chosen[k.min(chosen.len() - 1)])
        })
        .collect()
}

/// One tensor override in upstream's order.
#[derive(Clone, Debug)]
pub struct Override {
    pub pattern: Regex,
    pub location: Location,
}

impl Override {
    fn new(pattern: &str, location: Location) -> Result<Override, PlanError> {
        let regex = Regex::new(pattern).map_err(|e| PlanError::BadPattern {
            pattern: pattern.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Override {
            pattern: regex,
            location,
        })
    }

    fn matches(&self, name: &str) -> bool {
        self.pattern.is_match(name).unwrap_or(false)
    }
}

/// Every expert tensor to the host, as upstream's `--fit` does before it fills a card.
pub fn experts_to_host() -> Override {
    Override::new(EXPERTS_PATTERN, Location::Host).expect("the experts pattern is a valid regex")
}

/// The user's overrides: `-ot` entries in order, then `--cpu-moe`, `-ncmoe`, `-ncffn` (upstream
/// appends each as its option is read; bloomery's intent keeps them apart, so `-ot` comes first).
/// `CPU` means the host and a device name that card; nothing else is a buffer type here, as
/// in upstream's CUDA build (which refuses the pinned `*_Host` names too).
pub fn user_overrides(
    intent: &PlacementIntent,
    devices: &[DeviceInfo],
) -> Result<Vec<Override>, PlanError> {
    let mut all = Vec::new();
    for TensorOverride {
        pattern,
        buffer_type,
    } in &intent.override_tensor.value
    {
        let location = if buffer_type == "CPU" {
            Location::Host
        } else {
            devices
                .iter()
                .position(|d| &d.name == buffer_type)
                .map(Location::Card)
                .ok_or_else(|| PlanError::UnknownBufferType {
                    pattern: pattern.clone(),
                    buffer_type: buffer_type.clone(),
                    known: std::iter::once("CPU".to_string())
                        .chain(devices.iter().map(|d| d.name.clone()))
                        .collect(),
                })?
        };
        all.push(Override::new(pattern, location)?);
    }
    if intent.cpu_moe.value {
        all.push(experts_to_host());
    }
    for (n, tail) in [
        (intent.n_cpu_moe.value, EXPERTS_PATTERN),
        (intent.n_cpu_ffn.value, DENSE_FFN_PATTERN),
    ] {
        for il in 0..n {
            all.push(Override::new(&format!(r"blk\.{il}{tail}"), Location::Host)?);
        }
    }
    Ok(all)
}

/// A complete choice of where things go, before it is checked against the pools.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The device of each repeating layer, then of the output layer.
    pub layer_dev: Vec<Location>,
    pub overrides: Vec<Override>,
    /// Per layer: experts copied to a card beside their home tensors.
    pub experts: Vec<ExpertSet>,
    /// Layers whose host-resident expert tensors are left on disk.
    pub disk_layers: BTreeSet<u32>,
    pub kv_offload: bool,
    pub n_ctx: u32,
}

/// What a layout puts where.
pub struct Placed {
    pub tensors: Vec<Location>,
    pub cards: Vec<Pool>,
    pub host: Pool,
    /// Per layer: where its KV cache lives and its bytes.
    pub kv: Vec<(Location, u64)>,
    /// Per layer: bytes of its expert copies on a card.
    pub copies: Vec<u64>,
}

impl Layout {
    pub fn output_dev(&self) -> Location {
        *self.layer_dev.last().unwrap_or(&Location::Host)
    }

    /// Where block `il` runs; blocks past the model's layers (a head's) go with the output, as
    /// upstream.
    fn block_device(&self, il: u32) -> Location {
        self.layer_dev
            .get(il as usize)
            .copied()
            .unwrap_or(self.output_dev())
    }

    fn rule_location(&self, t: &TensorEntry) -> Location {
        if let Some(o) = self.overrides.iter().find(|o| o.matches(&t.name)) {
            return o.location;
        }
        match t.layer {
            Some(il) => self.block_device(il),
            None if t.is_input() => Location::Host,
            None => self.output_dev(),
        }
    }

    /// A tensor's home: an expert tensor whose every expert has a card copy lives on that card.
    fn tensor_location(&self, t: &TensorEntry, n_expert: u32) -> Location {
        if let (true, Some(il)) = (t.expert, t.layer) {
            if let Some(ExpertSet {
                card: Some(c),
                on_card,
            }) = self.experts.get(il as usize)
            {
                if n_expert > 0 && on_card.len() == n_expert as usize {
                    return Location::Card(*c);
                }
            }
            let at = self.rule_location(t);
            if at == Location::Host && self.disk_layers.contains(&il) {
                return Location::Disk;
            }
            return at;
        }
        self.rule_location(t)
    }

    /// Puts every tensor, cache and scratch buffer in its pool. `cards` and `host` come with
    /// their limits and nothing used.
    pub fn place(&self, inv: &Inventory, sizing: &Sizing, cards: &[Pool], host: &Pool) -> Placed {
        let mut cards = cards.to_vec();
        let mut host = host.clone();
        let mut computes: BTreeSet<Location> = BTreeSet::new();
        let tensors: Vec<Location> = inv
            .tensors
            .iter()
            .map(|t| self.tensor_location(t, inv.n_expert))
            .collect();
        for (t, &at) in inv.tensors.iter().zip(&tensors) {
            if let Some(pool) = pool_mut(&mut cards, &mut host, at) {
                pool.weights += t.bytes;
            }
            if !t.is_input() {
                computes.insert(at);
            }
        }
        let output = self.output_dev();
        if let Location::Card(c) = output {
            cards[c].weights += inv.tied_output_bytes;
        }
        computes.extend(self.layer_dev.iter().copied());
        let mut copies = vec![0; inv.n_layer as usize];
        for (il, set) in self.experts.iter().enumerate() {
            let Some(c) = set.card else { continue };
            computes.insert(Location::Card(c));
            if set.on_card.len() < inv.n_expert as usize {
                copies[il] = sizing.expert_copy_bytes(il as u32, set.on_card.len());
                cards[c].weights += copies[il];
            }
        }
        let kv: Vec<(Location, u64)> = (0..inv.n_layer)
            .map(|il| {
                let at = if self.kv_offload {
                    self.layer_dev[il as usize]
                } else {
                    Location::Host
                };
                (at, sizing.kv_bytes(il, self.n_ctx))
            })
            .collect();
        for &(at, bytes) in &kv {
            if let Some(pool) = pool_mut(&mut cards, &mut host, at) {
                pool.kv += bytes;
            }
        }
        for at in computes {
            if let Some(pool) = pool_mut(&mut cards, &mut host, at) {
                pool.scratch = sizing.scratch(at == output);
                if matches!(at, Location::Card(_)) {
                    pool.scratch += sizing.card_buffers();
                }
            }
        }
        self.reserve_stream_rings(inv, &tensors, &mut cards);
        Placed {
            tensors,
            cards,
            host,
            kv,
            copies,
        }
    }

    /// A card whose layers have expert tensors on the host or disk streams them through a ring
    /// of two buffers for long prompts, each holding one whole layer's expert tensors (every
    /// expert, copies or not), so the next layer's copy overlaps this layer's products.
    fn reserve_stream_rings(&self, inv: &Inventory, tensors: &[Location], cards: &mut [Pool]) {
        // per layer: its expert bytes, and whether any of them stays off the cards
        let mut layers: BTreeMap<u32, (u64, bool)> = BTreeMap::new();
        for (t, &at) in inv.tensors.iter().zip(tensors) {
            let (true, Some(il)) = (t.expert, t.layer) else {
                continue;
            };
            let (bytes, streamed) = layers.entry(il).or_default();
            *bytes += t.bytes;
            *streamed |= !matches!(at, Location::Card(_));
        }
        for (il, (bytes, streamed)) in layers {
            if let (true, Location::Card(c)) = (streamed, self.block_device(il)) {
                if let Some(pool) = cards.get_mut(c) {
                    pool.stream = pool.stream.max(2 * bytes);
                }
            }
        }
    }
}

fn pool_mut<'a>(cards: &'a mut [Pool], host: &'a mut Pool, at: Location) -> Option<&'a mut Pool> {
    match at {
        Location::Card(c) => cards.get_mut(c),
        Location::Host => Some(host),
        Location::Disk => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cards(locs: &[Location]) -> Vec<String> {
        locs.iter()
            .map(|l| match l {
                Location::Card(c) => c.to_string(),
                _ => "h".into(),
            })
            .collect()
    }

    #[test]
    fn ngl_counts_the_output_layer_first() {
        // 4 repeating layers + output; -ngl 2 offloads the output and the last repeating layer
        let l = layer_devices(4, 2, &[0], &[1.0]);
        assert_eq!(cards(&l), ["h", "h", "h", "0", "0"]);
        assert_eq!(cards(&layer_devices(4, 9, &[0], &[1.0])), ["0"; 5]);
        assert_eq!(cards(&layer_devices(4, 0, &[0], &[1.0])), ["h"; 5]);
        assert_eq!(cards(&layer_devices(4, 5, &[], &[])), ["h"; 5]);
    }

    #[test]
    fn shares_cut_layers_in_proportion() {
        // 7 repeating layers + output over two cards 3:1
        let l = layer_devices(7, 8, &[0, 1], &[3.0, 1.0]);
        assert_eq!(cards(&l), ["0", "0", "0", "0", "0", "0", "1", "1"]);
        let l = layer_devices(7, 8, &[1, 0], &[1.0, 1.0]);
        assert_eq!(cards(&l), ["1", "1", "1", "1", "0", "0", "0", "0"]);
    }

    #[test]
    fn experts_pattern_is_upstreams() {
        let o = experts_to_host();
        assert!(o.matches("blk.3.ffn_up_exps.weight"));
        assert!(o.matches("blk.3.ffn_gate_up_exps.weight"));
        assert!(o.matches("blk.3.ffn_down_chexps.weight"));
        assert!(!o.matches("blk.3.ffn_up_shexp.weight"));
        assert!(!o.matches("blk.3.ffn_gate_inp.weight"));
    }
}
