//! The planner: placement intent + model inventory + devices -> a `Plan` saying where every
//! tensor, expert and KV cache lives, the context size after `--fit`, and what each memory pool
//! holds; or a refusal naming every term that did not fit. Pure arithmetic over plain data: it
//! allocates no device or host memory and reads no files (`Inventory::from_gguf` reads only the
//! already opened header).
//!
//! llama.cpp's options mean what they mean upstream (b11434): `-dev`, `-sm`, `-mg`, `-ngl` (the
//! output layer counts as the last layer), `-ts`, `-ot` (first match wins), `--cpu-moe`,
//! `-ncmoe`, `-ncffn`, `-nkvo`, and `--fit` with `-fitt` / `-fitc`, which shrinks only what the
//! user left unset: first the context, then the layers on the cards. bloomery's own: with no
//! placement options a model that does not fit keeps its dense weights on the cards and moves
//! experts to the host, then copies as many experts back as the cards hold (whole layers under
//! even routing, the hot experts of every layer when routing counts concentrate); `--place bp`
//! puts attention on the larger of two cards and experts on the other; `--place 0+1` picks
//! cards; `BLOOMERY_CARD_BUDGET` caps a card.
//! A card running layers whose experts live on the host or disk also holds the ring those
//! experts stream through for long prompts (`Pool::stream`), and every fit decision weighs it.

mod budget;
mod copies;
mod fit;
mod host;
mod inventory;
mod layout;
mod plan;

pub use copies::CopyPolicy;
pub use fit::plan;
pub use host::host_memory;
pub use inventory::{Inventory, LayerKv, TensorEntry};
pub use plan::{
    ExpertSet, Group, LayerPlan, Location, NotFit, Plan, PlanError, Pool, TensorPlan, CARD_RUNTIME,
};

use crate::cli::PlacementIntent;

/// One device as its backend reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `CUDA0`: the name `-dev`, `-ot` and `BLOOMERY_CARD_BUDGET` use.
    pub name: String,
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// The device names the intent gives (`-dev`, `-ot` buffer types), checked against `devices` as
/// upstream checks them while parsing its arguments: before a model is fetched or read.
pub fn check_device_names(
    intent: &PlacementIntent,
    devices: &[DeviceInfo],
) -> Result<(), PlanError> {
    layout::select_devices(intent, devices)?;
    layout::user_overrides(intent, devices).map(|_| ())
}

/// The context the KV cache is sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextRequest {
    /// Tokens in total over all slots; 0 takes the training context (and lets `--fit` shrink it).
    pub n_ctx: u32,
    /// Slots (sequences).
    pub n_seq: u32,
    /// One KV pool shared by the slots; otherwise one stream per slot.
    pub kv_unified: bool,
    /// `--swa-full`: sliding-window layers keep the whole context.
    pub swa_full: bool,
    pub n_ubatch: u32,
}

/// Everything the planner reads.
#[derive(Clone, Copy, Debug)]
pub struct PlanRequest<'a> {
    pub intent: &'a PlacementIntent,
    pub inventory: &'a Inventory,
    /// Every device the backends found, in their order (`Location::Card(i)` indexes this).
    pub devices: &'a [DeviceInfo],
    /// Host memory: `free_bytes` is what is available now.
    pub host: &'a DeviceInfo,
    pub context: ContextRequest,
    /// Routing counts per layer and expert; hotter experts get card copies first.
    pub heat: Option<&'a [Vec<u64>]>,
    /// How expert copies weigh a layer's round trip through the host.
    pub copies: CopyPolicy,
}
