//! The forward pass on one CUDA card: the same blocks as `model.rs` (it loads the same
//! [`Weights`]), each one a kernel launch on the card's stream. The KV cache is f16 on the card,
//! one row per (sequence, position); the host keeps only each sequence's length.
//!
//! Mixture-of-experts layers run the chosen experts' rows directly for decode and group tokens by
//! expert for prompts. Experts need not all be on the card: each layer keeps card copies of the
//! experts the plan gave it (`EngineParams::card_experts`) and the rest stay in the mapped file.
//! Small batches compute those host experts on the CPU, beside the card's work on its own
//! experts; a pass of at least [`STREAM_MIN_TOKENS`] tokens instead streams each layer's host
//! experts onto the card through a ring of two layer-sized buffers (the copy of the next layer
//! overlapping the products of this one), running every ubatch of the pass through a layer
//! before the next, so host experts cross the bus once per pass rather than once per ubatch.
//!
//! Which experts fill a layer's card slots follows decode's routing (`tier::live`): after each
//! small step the hottest host experts are copied into the slots of colder ones on the side
//! stream, and served from the card once the copy has landed (`BLOOMERY_RESIDENCY=off` keeps the
//! plan's experts).

use super::arch::{Act, ArchSpec, Hparams, RopeKind};
use super::model::{Attn, Ffn, Weights};
use super::moe::{expert_pairs, PairBufs};
use super::tier::live::{Live, LiveParams};
use super::tier::ring::{Ring, RingError, Stage};
use super::tier::split::{by_use, Split};
use super::weights::Tensor;
use super::{Batch, EngineError, EngineParams, Forward, SeqId, SeqState};
use crate::backend::cpu::ThreadPool;
use crate::backend::cuda::ops::{self, Input, MAX_EXPERTS, MAX_HEAD_DIM, MMV_MAX};
use crate::backend::cuda::{
    page_spans, Buf, Cuda, CudaError, DevBuf, DevMatrix, Event, Gpu, Graph, Pinned, RowMove,
};
use crate::model::GgmlType;

impl From<CudaError> for EngineError {
    fn from(e: CudaError) -> Self {
        EngineError::Load(format!("CUDA: {e}"))
    }
}

enum GpuFfn {
    Dense {
        gate: DevMatrix,
        up: DevMatrix,
        down: DevMatrix,
    },
    Moe {
        router: DevMatrix,
        experts: Box<Experts>,
    },
}

/// The experts of one layer: card copies of some (or all) of them, in slot order, and the whole
/// expert tensors in the mapped file when some have no copy.
struct Experts {
    /// gate, up and down of the experts with a card slot.
    card: [DevMatrix; 3],
    /// The card slot of each expert, -1 for one that lives on the host only.
    slot: Vec<i32>,
    host: Option<[Tensor; 3]>,
}

impl Experts {
    fn all_on_card(&self) -> bool {
        self.host.is_none()
    }
}

/// The CPU side of a card that computes host experts: its threads, buffers, and the step's
/// routing and activations brought over from the card.
struct HostSide {
    pool: ThreadPool,
    bufs: PairBufs,
    ids: Vec<i32>,
    x: Vec<f32>,
    y: Vec<f32>,
    /// Time spent waiting for the card's routing and activations, computing on the host, and
    /// sending the results back, over `layers` layer steps (logged when the model drops).
    waits: [std::time::Duration; 3],
    layers: u64,
}

impl Drop for HostSide {
    fn drop(&mut self) {
        if self.layers > 0 {
            let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / self.layers as f64;
            log::info!(
                "host experts over {} layer steps, per step: {:.1} us waiting for the card, {:.1} us computing, {:.1} us sending back",
                self.layers,
                us(self.waits[0]),
                us(self.waits[1]),
                us(self.waits[2])
            );
        }
    }
}

/// Copies into card slots started after one step: the event that marks them landed, and each
/// copy's `(layer, slot, expert)`.
type Copies = (Event, Vec<(usize, usize, u32)>);

/// Residency while serving: the policy, and the copies into card slots still in flight.
struct Swaps {
    live: Live,
    in_flight: Vec<Copies>,
}

impl Drop for Swaps {
    fn drop(&mut self) {
        let st = self.live.stats();
        if st.routes > 0 {
            log::info!(
                "expert residency: card slots served {} of {} routes in split layers ({:.1}%), {} copies",
                st.hits,
                st.routes,
                100.0 * st.hit_rate(),
                st.swaps
            );
        }
    }
}

/// Card buffers that host experts stream through during a long prompt pass, each the size of a
/// layer's expert tensors, with the events that order their copies (side stream) against the
/// products that read them (main stream).
struct Stream {
    ring: Ring<usize>,
    bufs: Vec<[DevMatrix; 3]>,
    copied: Vec<Option<Event>>,
    released: Vec<Option<Event>>,
    /// The host expert tensors, page-locked so their copies run on the copy engine.
    _pinned: Vec<Pinned>,
    /// The card's share of small steps' host experts (only with the tensors page-locked).
    share: Option<CardShare>,
}

/// Card buffers that some of a small step's host experts are copied into and multiplied from,
/// on the copy engine and the card, while the CPU computes the others (`tier::split`).
struct CardShare {
    mats: [DevMatrix; 3],
    /// Experts the buffers hold.
    cap: usize,
    split: Split,
    /// The products that last read the buffers: the next copies into them wait for these.
    read: Option<Event>,
    /// The last share's copies started, its products ended, and how many experts it sent (its
    /// time is read once it has finished).
    timing: Option<(Event, Event, usize)>,
    /// Layer steps that shared, and experts sent to the card over them (logged on drop).
    steps: u64,
    sent: u64,
}

impl Drop for CardShare {
    fn drop(&mut self) {
        if self.steps > 0 {
            let (cpu, card) = self.split.costs();
            log::info!(
                "card share of host experts: {:.2} of them per layer step over {} steps; per expert {:.1} us on the CPU, {:.1} us on the card",
                self.sent as f64 / self.steps as f64,
                self.steps,
                cpu.unwrap_or(f64::NAN),
                card.unwrap_or(f64::NAN)
            );
        }
    }
}

/// Whether decode steps with host experts replay the card's work between round trips as graphs
/// (`BLOOMERY_HOST_GRAPHS=off` launches it kernel by kernel, for measuring).
fn host_graphs() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("BLOOMERY_HOST_GRAPHS").is_ok_and(|v| matches!(v.as_str(), "off" | "0"))
    })
}

/// `BLOOMERY_CARD_SHARE`: `off` keeps every small step's host experts on the CPU, a number sends
/// that many per layer step to the card; unset, the share adapts (`Some(None)`).
fn card_share_setting() -> Option<Option<usize>> {
    match std::env::var("BLOOMERY_CARD_SHARE") {
        Ok(v) if matches!(v.as_str(), "off" | "no") => None,
        Ok(v) => match v.parse::<usize>() {
            Ok(n) => Some(Some(n)),
            Err(_) => {
                log::warn!("BLOOMERY_CARD_SHARE={v} is neither off nor a count: adapting");
                Some(None)
            }
        },
        Err(_) => Some(None),
    }
}

/// The model's stream ring (present whenever some layer has host experts).
fn ring(stream: &mut Option<Stream>) -> Result<&mut Stream, CudaError> {
    stream
        .as_mut()
        .ok_or_else(|| CudaError("no stream ring".into()))
}

impl From<RingError> for CudaError {
    fn from(e: RingError) -> Self {
        CudaError(format!("stream ring: {}", e.0))
    }
}

impl Stream {
    /// Queues the copy of layer `il`'s experts `x` into the next buffer (side stream, after the
    /// products that last read that buffer): host experts from the mapped file, the rest from
    /// their card slots, in runs of consecutive experts.
    fn fill(&mut self, gpu: &Gpu, il: usize, x: &Experts) -> Result<(), CudaError> {
        let Some(host) = &x.host else {
            return Err(CudaError(format!("layer {il} has no host experts")));
        };
        let b = self
            .ring
            .acquire(il)
            .ok_or_else(|| CudaError(format!("stream ring: no free buffer for layer {il}")))?;
        if let Some(ev) = &self.released[b] {
            gpu.side_waits(ev)?;
        }
        let ne = x.slot.len();
        for ((t, card), m) in host.iter().zip(&x.card).zip(&mut self.bufs[b]) {
            let data = t.data();
            let eb = shape_for(m, t, ne, ne, ne)?;
            let mut x0 = 0;
            while x0 < ne {
                // a run of host experts, or of card experts in consecutive slots
                let s0 = x.slot[x0];
                let mut x1 = x0 + 1;
                while x1 < ne
                    && ((s0 < 0 && x.slot[x1] < 0)
                        || (s0 >= 0 && x.slot[x1] == s0 + (x1 - x0) as i32))
                {
                    x1 += 1;
                }
                let dst = m.buf.at(x0 * eb);
                if s0 < 0 {
                    gpu.upload_side(dst, &data[x0 * eb..x1 * eb])?;
                } else {
                    gpu.copy_side(dst, card.buf.at(s0 as usize * eb), (x1 - x0) * eb)?;
                }
                x0 = x1;
            }
        }
        self.copied[b] = Some(gpu.side_event()?);
        self.ring.filled(b)?;
        Ok(self.ring.copied(b)?)
    }

    /// The buffer holding layer `il`, with the main stream made to wait for its copy.
    fn take(&mut self, gpu: &Gpu, il: usize) -> Result<usize, CudaError> {
        let b = (0..RING_BUFFERS)
            .find(|&b| self.ring.stage(b) == Some(Stage::Ready(il)))
            .ok_or_else(|| CudaError(format!("stream ring: layer {il} was not copied")))?;
        if let Some(ev) = &self.copied[b] {
            gpu.main_waits(ev)?;
        }
        self.ring.start(b)?;
        Ok(b)
    }

    /// Buffer `b`'s products are queued: its next copy waits for them.
    fn release(&mut self, gpu: &Gpu, b: usize) -> Result<(), CudaError> {
        self.released[b] = Some(gpu.main_event()?);
        Ok(self.ring.release(b)?)
    }
}

/// A pass of at least this many tokens streams host experts through the card; a smaller one
/// computes them on the CPU (upstream moves work to the card from 32 tokens on as well).
const STREAM_MIN_TOKENS: usize = 32;
/// Ring buffers: two let the next layer's copy overlap this layer's products.
const RING_BUFFERS: usize = 2;

struct GpuLayer {
    attn_norm: DevBuf,
    wq: DevMatrix,
    wk: DevMatrix,
    wv: DevMatrix,
    wo: DevMatrix,
    bq: Option<DevBuf>,
    bk: Option<DevBuf>,
    bv: Option<DevBuf>,
    bo: Option<DevBuf>,
    q_norm: Option<DevBuf>,
    k_norm: Option<DevBuf>,
    post_attn_norm: Option<DevBuf>,
    ffn_norm: DevBuf,
    ffn: GpuFfn,
    post_ffn_norm: Option<DevBuf>,
    swa: bool,
    rope_base: f32,
    rope_scale: f32,
    k_cache: DevBuf,
    v_cache: DevBuf,
}

/// Activations and index buffers for one ubatch, sized once at load.
struct Scratch {
    x: DevBuf,
    cur: DevBuf,
    /// `cur` quantized for the decode products, made by the norm that writes `cur` (see
    /// [`cur_input`])
    cur_q: DevBuf,
    q: DevBuf,
    k: DevBuf,
    v: DevBuf,
    attn: DevBuf,
    o: DevBuf,
    gate: DevBuf,
    up: DevBuf,
    ffn: DevBuf,
    router: DevBuf,
    moe_ids: DevBuf,
    moe_w: DevBuf,
    moe_y: DevBuf,
    /// card slot of each (token, expert) pair (-1: computed on the host), and the pairs the host
    /// computed
    slot_ids: DevBuf,
    host_rows: DevBuf,
    /// the share buffer's index of each pair the card computes from it (-1: not shared)
    share_ids: DevBuf,
    /// tokens, positions, sequence bases, cells and wanted rows of the ubatch
    ints: DevBuf,
    /// per-expert token and pair lists of a prompt pass, padded to the largest group
    moe_lists: DevBuf,
    logits: DevBuf,
}

/// Rows of logits computed per head product (bounds the logits scratch for large vocabularies).
const LOGIT_ROWS: usize = 64;
/// Runs of at least this many consecutive tokens of one sequence attend through cuBLAS products;
/// shorter ones (decode) through the attention kernel.
const PROMPT_ATTN_MIN: usize = 16;

/// How a stretch of a ubatch attends: a long run of one sequence's consecutive positions through
/// cuBLAS products, or any mix of tokens through the attention kernel (which reads each token's
/// position and sequence from the card, so a decode step's launches do not depend on which
/// sequences it holds and can be replayed as a graph).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Span {
    Prompt {
        start: usize,
        len: usize,
        seq: usize,
        p0: usize,
    },
    Kernel {
        start: usize,
        len: usize,
    },
}

fn spans(seq: &[SeqId], pos: &[u32]) -> Vec<Span> {
    // maximal runs of one sequence at consecutive positions
    let mut runs: Vec<(usize, usize, usize, usize)> = Vec::new();
    for (i, (&s, &p)) in seq.iter().zip(pos).enumerate() {
        match runs.last_mut() {
            Some(r) if r.2 == s as usize && r.3 + r.1 == p as usize => r.1 += 1,
            _ => runs.push((i, 1, s as usize, p as usize)),
        }
    }
    let mut out: Vec<Span> = Vec::new();
    for (start, len, seq, p0) in runs {
        if len >= PROMPT_ATTN_MIN {
            out.push(Span::Prompt {
                start,
                len,
                seq,
                p0,
            });
        } else if let Some(Span::Kernel { len: l, .. }) = out.last_mut() {
            *l += len;
        } else {
            out.push(Span::Kernel { start, len });
        }
    }
    out
}

pub struct GpuModel {
    spec: &'static ArchSpec,
    hp: Hparams,
    n_vocab: usize,
    /// The step returns hidden states after the output norm instead of logits
    /// ([`Forward::decode_embd`]).
    embd_out: bool,
    cuda: Cuda,
    tok_embd: DevMatrix,
    output: Option<DevMatrix>,
    output_norm: DevBuf,
    layers: Vec<GpuLayer>,
    n_ctx_seq: usize,
    seq_len: Vec<u32>,
    n_ubatch: usize,
    s: Scratch,
    host_ints: Vec<i32>,
    /// The layers of a decode step of `n` tokens (index `n - 1`), captured once and replayed
    /// (only when every expert is on the card: host experts need a round trip inside the step,
    /// see `segments`).
    graphs: Vec<Option<Graph>>,
    /// With host experts: the card's work between two round trips of a decode step of `n`
    /// tokens (index `n - 1`), segment by segment, captured once and replayed.
    segments: Vec<Vec<Option<Graph>>>,
    /// Present when some experts live on the host.
    host: Option<HostSide>,
    stream: Option<Stream>,
    /// Present when some layer splits its experts between card slots and the host.
    tier: Option<Swaps>,
    /// The residual stream and the index lists of every ubatch of a streamed pass.
    pass_x: DevBuf,
    pass_ints: DevBuf,
}

/// Where one ubatch's residual stream and index lists are on the card.
#[derive(Clone, Copy)]
struct Io {
    x: u64,
    ints: u64,
}

fn matrix(cuda: &Cuda, t: &Tensor, n_expert: usize) -> Result<DevMatrix, EngineError> {
    let rows: usize = t.shape[1..].iter().product::<usize>() / n_expert;
    cuda.upload_matrix(t.data(), t.ty, t.shape[0], rows, n_expert)
        .map_err(|e| EngineError::Load(format!("{}: {e}", t.name)))
}

fn opt_f32(cuda: &Cuda, v: &Option<Vec<f32>>) -> Result<Option<DevBuf>, EngineError> {
    Ok(match v {
        Some(v) => Some(cuda.upload_f32(v)?),
        None => None,
    })
}

/// A layer's experts on the card: all of them (`chosen` is `None`), or card copies of the
/// ascending expert indices in `chosen` with the tensors kept in the mapped file for the rest.
fn experts(
    cuda: &Cuda,
    tensors: [&Tensor; 3],
    n_expert: usize,
    chosen: Option<&[u32]>,
) -> Result<Experts, EngineError> {
    let all: Vec<u32>;
    let chosen = match chosen {
        Some(c) => c,
        None => {
            all = (0..n_expert as u32).collect();
            &all
        }
    };
    let mut slot = vec![-1i32; n_expert];
    for (i, &x) in chosen.iter().enumerate() {
        let s = slot.get_mut(x as usize).ok_or_else(|| {
            EngineError::Load(format!(
                "the plan puts expert {x} of {} on the card: the layer has {n_expert}",
                tensors[0].name
            ))
        })?;
        *s = i as i32;
    }
    let whole = chosen.len() == n_expert;
    let mut card = Vec::with_capacity(3);
    for t in tensors {
        if whole {
            card.push(matrix(cuda, t, n_expert)?);
            continue;
        }
        let eb = t.data().len() / n_expert;
        let mut bytes = Vec::with_capacity(chosen.len() * eb);
        for &x in chosen {
            bytes.extend_from_slice(&t.data()[x as usize * eb..(x as usize + 1) * eb]);
        }
        let rows = t.shape[1..].iter().product::<usize>() / n_expert;
        let m = cuda
            .upload_matrix(&bytes, t.ty, t.shape[0], rows, chosen.len())
            .map_err(|e| EngineError::Load(format!("{}: {e}", t.name)))?;
        card.push(m);
    }
    let [gate, up, down]: [DevMatrix; 3] = card
        .try_into()
        .map_err(|_| EngineError::Load("three expert tensors".into()))?;
    Ok(Experts {
        card: [gate, up, down],
        host: (!whole).then(|| tensors.map(Tensor::clone)),
        slot,
    })
}

/// Shapes card buffer `m` for experts of the host tensor `t` (which stacks `ne` of them), the
/// buffer holding `held` experts; returns one expert's bytes. Refuses `count` experts that do not
/// fit the buffer.
fn shape_for(
    m: &mut DevMatrix,
    t: &Tensor,
    ne: usize,
    held: usize,
    count: usize,
) -> Result<usize, CudaError> {
    let eb = t.data().len() / ne;
    let rows = t.shape[1..].iter().product::<usize>() / ne;
    if eb * count > m.buf.bytes() || rows == 0 {
        return Err(CudaError(format!(
            "{}: {count} experts do not fit a card buffer of {} bytes",
            t.name,
            m.buf.bytes()
        )));
    }
    (m.ty, m.k, m.rows, m.n_expert, m.row_bytes) = (t.ty, t.shape[0], rows, held, eb / rows);
    Ok(eb)
}

/// Card buffers of `bytes` for gate, up and down, shaped by whatever is copied into them.
fn unshaped(cuda: &Cuda, bytes: [usize; 3]) -> Result<[DevMatrix; 3], EngineError> {
    let m = |b: usize| -> Result<DevMatrix, EngineError> {
        Ok(DevMatrix {
            buf: cuda.gpu.alloc(b)?,
            ty: GgmlType::F32,
            k: 0,
            rows: 0,
            n_expert: 0,
            row_bytes: 0,
        })
    };
    Ok([m(bytes[0])?, m(bytes[1])?, m(bytes[2])?])
}

/// The streaming ring, sized for the largest host layer, with the host expert tensors
/// page-locked (the copies still run, through the driver's staging, if locking is refused).
fn stream_ring(
    cuda: &Cuda,
    host_layers: &[&Experts],
    k_used: usize,
) -> Result<Stream, EngineError> {
    let mut max = [0usize; 3];
    let mut max_expert = [0usize; 3];
    let mut ranges = Vec::new();
    for x in host_layers {
        for (i, t) in x.host.iter().flatten().enumerate() {
            let d = t.data();
            max[i] = max[i].max(d.len());
            max_expert[i] = max_expert[i].max(d.len() / x.slot.len().max(1));
            ranges.push((d.as_ptr() as usize, d.as_ptr() as usize + d.len()));
        }
    }
    let mut bufs = Vec::new();
    for _ in 0..RING_BUFFERS {
        bufs.push(unshaped(cuda, max)?);
    }
    let mut pinned = Vec::new();
    for (a, b) in page_spans(&ranges, 4096) {
        // SAFETY: whole pages of the mapped model file around the expert tensors (a mapping
        // covers whole pages), alive as long as the tensors that `Experts` holds.
        let range = unsafe { std::slice::from_raw_parts(a as *const u8, b - a) };
        match cuda.gpu.pin(range) {
            Ok(p) => pinned.push(p),
            Err(e) => {
                log::warn!("streaming host experts without page-locked memory (slower): {e}");
                pinned.clear();
                break;
            }
        }
    }
    let total: usize = max.iter().sum::<usize>() * RING_BUFFERS;
    log::info!(
        "expert streaming ring: {RING_BUFFERS} x {} MiB on the card, {} MiB of host experts page-locked",
        (total / RING_BUFFERS) >> 20,
        ranges.iter().map(|r| r.1 - r.0).sum::<usize>() >> 20
    );
    let share = match card_share_setting() {
        Some(fixed) if !pinned.is_empty() => {
            let cap = k_used.max(1);
            let mats = unshaped(cuda, max_expert.map(|b| b * cap))?;
            log::info!(
                "small steps share their host experts with the card ({}, up to {cap} a layer step)",
                match fixed {
                    Some(n) => format!("{n} a layer step, BLOOMERY_CARD_SHARE"),
                    None => "adapting to both sides' speed".into(),
                }
            );
            Some(CardShare {
                mats,
                cap,
                split: Split::new((cap / 3).max(1), cap, fixed),
                read: None,
                timing: None,
                steps: 0,
                sent: 0,
            })
        }
        _ => None,
    };
    Ok(Stream {
        ring: Ring::new(RING_BUFFERS),
        bufs,
        copied: (0..RING_BUFFERS).map(|_| None).collect(),
        released: (0..RING_BUFFERS).map(|_| None).collect(),
        _pinned: pinned,
        share,
    })
}

/// The residency of the layers that split their experts (slot `i` holds the expert whose
/// `slot` entry is `i`); `None` when no layer does. `BLOOMERY_RESIDENCY=off` keeps the plan's
/// experts in the slots (routes and hits are still counted).
fn residency(layers: &[GpuLayer], n_expert: usize) -> Option<Swaps> {
    let seeds: Vec<Option<Vec<u32>>> = layers
        .iter()
        .map(|l| match &l.ffn {
            GpuFfn::Moe { experts, .. } if !experts.all_on_card() => {
                let mut held = vec![0u32; experts.slot.iter().filter(|&&s| s >= 0).count()];
                for (e, &s) in experts.slot.iter().enumerate() {
                    if s >= 0 {
                        held[s as usize] = e as u32;
                    }
                }
                Some(held)
            }
            _ => None,
        })
        .collect();
    let mut params = LiveParams::default();
    let off = std::env::var("BLOOMERY_RESIDENCY").is_ok_and(|v| matches!(v.as_str(), "off" | "0"));
    if off {
        params.max_swaps = 0;
    }
    let live = Live::new(&seeds, n_expert, params);
    if !live.active() {
        return None;
    }
    log::info!(
        "expert residency: {}",
        if off {
            "off (BLOOMERY_RESIDENCY), card slots keep the plan's experts"
        } else {
            "card slots follow decode's routing"
        }
    );
    Some(Swaps {
        live,
        in_flight: Vec::new(),
    })
}

/// Why the card cannot serve these weights with these parameters, if it cannot (checked before
/// any upload).
pub fn unsupported(w: &Weights, hp: &Hparams, params: &EngineParams) -> Option<String> {
    if params.type_k != GgmlType::F16 || params.type_v != GgmlType::F16 {
        return Some(format!(
            "the CUDA engine keeps its KV cache in f16; -ctk {} -ctv {} are not built for it yet",
            params.type_k.name(),
            params.type_v.name()
        ));
    }
    let mut types: Vec<(String, GgmlType)> = vec![("token_embd.weight".into(), w.tok_embd.ty)];
    if let Some(o) = &w.output {
        types.push((o.name.clone(), o.ty));
    }
    for l in &w.layers {
        let Attn::Gqa(a) = &l.attn else {
            return Some("latent attention has no CUDA kernels yet".into());
        };
        for t in [&a.wq, &a.wk, &a.wv, &l.wo] {
            types.push((t.name.clone(), t.ty));
        }
        let ffn = match &l.ffn {
            Ffn::Dense { gate, up, down } => [None, Some(gate), Some(up), Some(down)],
            Ffn::Moe {
                router,
                gate,
                up,
                down,
                ..
            } => [Some(router), Some(gate), Some(up), Some(down)],
        };
        types.extend(ffn.into_iter().flatten().map(|t| (t.name.clone(), t.ty)));
    }
    if let Some((name, ty)) = types.iter().find(|(_, ty)| !ops::supports(*ty)) {
        return Some(format!(
            "{name} is {}, which has no CUDA kernel yet",
            ty.name()
        ));
    }
    if hp.head_dim_k > MAX_HEAD_DIM || hp.head_dim_v > MAX_HEAD_DIM {
        return Some(format!(
            "head width {} is above the attention kernel's {MAX_HEAD_DIM}",
            hp.head_dim_k.max(hp.head_dim_v)
        ));
    }
    if hp.n_expert > MAX_EXPERTS {
        return Some(format!(
            "{} experts is above the router kernel's {MAX_EXPERTS}",
            hp.n_expert
        ));
    }
    None
}

impl GpuModel {
    pub fn load(
        spec: &'static ArchSpec,
        hp: Hparams,
        w: &Weights,
        params: &EngineParams,
        mut cuda: Cuda,
    ) -> Result<GpuModel, EngineError> {
        let (hk, hv) = (hp.head_dim_k, hp.head_dim_v);
        let (nkv, nv) = (hp.n_head_kv * hk, hp.n_head_kv * hv);
        let cells = params.n_ctx_seq * params.n_seq_max;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let ffn = match &l.ffn {
                Ffn::Dense { gate, up, down } => GpuFfn::Dense {
                    gate: matrix(&cuda, gate, 1)?,
                    up: matrix(&cuda, up, 1)?,
                    down: matrix(&cuda, down, 1)?,
                },
                Ffn::Moe {
                    router,
                    gate,
                    up,
                    down,
                    ..
                } => {
                    let chosen = params
                        .card_experts
                        .as_ref()
                        .map(|c| c.get(layers.len()).map_or(&[][..], Vec::as_slice));
                    GpuFfn::Moe {
                        router: matrix(&cuda, router, 1)?,
                        experts: Box::new(experts(&cuda, [gate, up, down], hp.n_expert, chosen)?),
                    }
                }
            };
            let Attn::Gqa(a) = &l.attn else {
                return Err(EngineError::Load(
                    "latent attention has no CUDA kernels yet".into(),
                ));
            };
            layers.push(GpuLayer {
                attn_norm: cuda.upload_f32(&l.attn_norm)?,
                wq: matrix(&cuda, &a.wq, 1)?,
                wk: matrix(&cuda, &a.wk, 1)?,
                wv: matrix(&cuda, &a.wv, 1)?,
                wo: matrix(&cuda, &l.wo, 1)?,
                bq: opt_f32(&cuda, &a.bq)?,
                bk: opt_f32(&cuda, &a.bk)?,
                bv: opt_f32(&cuda, &a.bv)?,
                bo: opt_f32(&cuda, &l.bo)?,
                q_norm: opt_f32(&cuda, &a.q_norm)?,
                k_norm: opt_f32(&cuda, &a.k_norm)?,
                post_attn_norm: opt_f32(&cuda, &l.post_attn_norm)?,
                ffn_norm: cuda.upload_f32(&l.ffn_norm)?,
                ffn,
                post_ffn_norm: opt_f32(&cuda, &l.post_ffn_norm)?,
                swa: l.swa,
                rope_base: l.rope_base,
                rope_scale: l.rope_scale,
                k_cache: cuda.gpu.alloc(cells * nkv * 2)?,
                v_cache: cuda.gpu.alloc(cells * nv * 2)?,
            });
        }
        let nub = params.n_ubatch.max(1);
        let e = hp.n_embd;
        let (nq, na) = (hp.n_head * hk, hp.n_head * hv);
        let k_used = hp.n_expert_used.max(1);
        let ff = (nub * hp.n_ff)
            .max(nub * hp.n_ff_exp)
            .max(MMV_MAX * k_used * hp.n_ff_exp);
        // the decode products' quantized input, sized now: graphs are captured with it
        let xq = Cuda::quantized_x_bytes(MMV_MAX, e.max(na).max(hp.n_ff))
            .max(Cuda::quantized_x_bytes(MMV_MAX * k_used, hp.n_ff_exp));
        cuda.buf(Buf::Xq, xq)?;
        let f = |n: usize| cuda.gpu.alloc(n * 4);
        let s = Scratch {
            x: f(nub * e)?,
            cur: f(nub * e)?,
            cur_q: cuda.gpu.alloc(Cuda::quantized_x_bytes(MMV_MAX, e))?,
            q: f(nub * nq)?,
            k: f(nub * nkv)?,
            v: f(nub * nv)?,
            attn: f(nub * na)?,
            o: f(nub * e)?,
            gate: f(ff)?,
            up: f(ff)?,
            ffn: f(nub * e)?,
            router: f(nub * hp.n_expert)?,
            moe_ids: f(nub * k_used)?,
            moe_w: f(nub * k_used)?,
            moe_y: f(nub * k_used * e)?,
            slot_ids: f(nub * k_used)?,
            host_rows: f(nub * k_used)?,
            share_ids: f(nub * k_used)?,
            ints: f(5 * nub)?,
            moe_lists: f(2 * hp.n_expert * nub)?,
            logits: f(LOGIT_ROWS * w.n_vocab)?,
        };
        let host_layers: Vec<&Experts> = layers
            .iter()
            .filter_map(|l| match &l.ffn {
                GpuFfn::Moe { experts, .. } if !experts.all_on_card() => Some(experts.as_ref()),
                _ => None,
            })
            .collect();
        let (host, stream) = if host_layers.is_empty() {
            (None, None)
        } else {
            let on_card: usize = host_layers
                .iter()
                .map(|x| x.slot.iter().filter(|&&s| s >= 0).count())
                .sum();
            log::info!(
                "{} of {} layers keep experts on the host ({} card copies among them); {} CPU threads compute them for small batches, prompts of {STREAM_MIN_TOKENS}+ tokens stream them",
                host_layers.len(),
                w.layers.len(),
                on_card,
                params.n_threads
            );
            let host = HostSide {
                pool: ThreadPool::new(params.n_threads),
                bufs: PairBufs::default(),
                ids: Vec::new(),
                x: Vec::new(),
                y: Vec::new(),
                waits: Default::default(),
                layers: 0,
            };
            (Some(host), Some(stream_ring(&cuda, &host_layers, k_used)?))
        };
        let tier = residency(&layers, hp.n_expert);
        let model = GpuModel {
            host,
            stream,
            tier,
            pass_x: cuda.gpu.alloc(0)?,
            pass_ints: cuda.gpu.alloc(0)?,
            spec,
            n_vocab: w.n_vocab,
            embd_out: false,
            tok_embd: matrix(&cuda, &w.tok_embd, 1)?,
            output: match &w.output {
                Some(t) => Some(matrix(&cuda, t, 1)?),
                None => None,
            },
            output_norm: cuda.upload_f32(&w.output_norm)?,
            layers,
            n_ctx_seq: params.n_ctx_seq,
            seq_len: vec![0; params.n_seq_max],
            n_ubatch: nub,
            s,
            host_ints: Vec::new(),
            graphs: (0..MMV_MAX).map(|_| None).collect(),
            segments: (0..MMV_MAX).map(|_| Vec::new()).collect(),
            hp,
            cuda,
        };
        model.cuda.gpu.sync()?;
        Ok(model)
    }

    /// Refuses a batch before anything runs: its shape, and positions that must continue each
    /// sequence without a gap inside its context.
    fn check(&self, batch: &Batch) -> Result<(), EngineError> {
        batch.check_shape(self.n_vocab, self.seq_len.len())?;
        let mut len = self.seq_len.clone();
        for i in 0..batch.len() {
            let (s, p) = (batch.seq[i] as usize, batch.pos[i]);
            if p as usize >= self.n_ctx_seq {
                return Err(EngineError::NoSpace {
                    seq: s as SeqId,
                    needed: p as usize + 1,
                    capacity: self.n_ctx_seq,
                });
            }
            if p > len[s] {
                return Err(EngineError::BadBatch(format!(
                    "position {p} of sequence {s} at entry {i} leaves a gap after {}",
                    len[s]
                )));
            }
            len[s] = len[s].max(p + 1);
        }
        Ok(())
    }

    /// Uploads the index lists of entries `r` of `batch` to `ints` (tokens, positions, sequence
    /// bases, cells, wanted rows); returns the wanted rows and how the entries attend.
    fn prepare(
        &mut self,
        batch: &Batch,
        r: std::ops::Range<usize>,
        ints: u64,
    ) -> Result<(Vec<usize>, Vec<Span>), CudaError> {
        let n = r.len();
        let host = &mut self.host_ints;
        host.clear();
        host.extend(batch.tokens[r.clone()].iter().map(|&t| t as i32));
        host.extend(batch.pos[r.clone()].iter().map(|&p| p as i32));
        host.extend(
            batch.seq[r.clone()]
                .iter()
                .map(|&s| (s as usize * self.n_ctx_seq) as i32),
        );
        for i in r.clone() {
            host.push((batch.seq[i] as usize * self.n_ctx_seq) as i32 + batch.pos[i] as i32);
        }
        let wanted: Vec<usize> = (0..n).filter(|&i| batch.logits[r.start + i]).collect();
        host.extend(wanted.iter().map(|&i| i as i32));
        self.cuda.gpu.upload(ints, host)?;
        Ok((wanted, spans(&batch.seq[r.clone()], &batch.pos[r])))
    }

    /// One ubatch through every layer.
    fn ubatch(
        &mut self,
        batch: &Batch,
        r: std::ops::Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), CudaError> {
        let n = r.len();
        let io = Io {
            x: self.s.x.ptr(),
            ints: self.s.ints.ptr(),
        };
        let (wanted, spans) = self.prepare(batch, r, io.ints)?;
        if n <= MMV_MAX && self.host.is_none() {
            // a decode step: no host round trip inside, so the layers replay as one graph
            if self.graphs[n - 1].is_none() {
                self.cuda.gpu.begin_capture()?;
                let recorded = self.layers(n, &spans, io);
                let graph = self.cuda.gpu.end_capture();
                recorded?;
                self.graphs[n - 1] = Some(graph?);
            }
            if let Some(g) = &self.graphs[n - 1] {
                g.launch()?;
            }
        } else if n <= MMV_MAX && host_graphs() {
            self.segmented_layers(n, &spans, io)?;
        } else {
            self.layers(n, &spans, io)?;
        }
        self.logits(n, &wanted, io, out)
    }

    /// A decode step with host experts: the card's work between two round trips replays as one
    /// graph per segment (captured on first use for each batch size), the round trips run
    /// eagerly. The same launches as [`GpuModel::layers`], in the same order.
    fn segmented_layers(&mut self, n: usize, spans: &[Span], io: Io) -> Result<(), CudaError> {
        let hosts: Vec<usize> = (0..self.layers.len())
            .filter(|&il| self.host_experts(il))
            .collect();
        if self.segments[n - 1].len() != hosts.len() + 1 {
            self.segments[n - 1] = (0..=hosts.len()).map(|_| None).collect();
        }
        for seg in 0..=hosts.len() {
            if self.segments[n - 1][seg].is_none() {
                self.cuda.gpu.begin_capture()?;
                let recorded = self.segment(&hosts, seg, n, spans, io);
                let graph = self.cuda.gpu.end_capture();
                recorded?;
                self.segments[n - 1][seg] = Some(graph?);
            }
            if let Some(g) = &self.segments[n - 1][seg] {
                g.launch()?;
            }
            if let Some(&il) = hosts.get(seg) {
                self.layer(il, n, spans, io, None, Part::Host)?;
            }
        }
        Ok(())
    }

    /// Segment `seg` of a decode step whose host-expert layers are `hosts`: the previous host
    /// layer's tail (or the embeddings), the whole layers up to the next host layer, and that
    /// layer's head.
    fn segment(
        &mut self,
        hosts: &[usize],
        seg: usize,
        n: usize,
        spans: &[Span],
        io: Io,
    ) -> Result<(), CudaError> {
        let first = match seg.checked_sub(1).map(|i| hosts[i]) {
            None => {
                self.embed(n, io)?;
                0
            }
            Some(prev) => {
                self.layer(prev, n, spans, io, None, Part::Tail)?;
                prev + 1
            }
        };
        let end = hosts.get(seg).copied().unwrap_or(self.layers.len());
        for il in first..end {
            self.layer(il, n, spans, io, None, Part::Whole)?;
        }
        match hosts.get(seg) {
            Some(&il) => self.layer(il, n, spans, io, None, Part::Head),
            None => Ok(()),
        }
    }

    fn layers(&mut self, n: usize, spans: &[Span], io: Io) -> Result<(), CudaError> {
        self.embed(n, io)?;
        for il in 0..self.layers.len() {
            self.layer(il, n, spans, io, None, Part::Whole)?;
        }
        Ok(())
    }

    /// A whole batch with host experts streamed: every ubatch goes through a layer before the
    /// next layer, whose host experts were copied onto the card while this one ran.
    fn streamed_pass(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), CudaError> {
        let (total, e) = (batch.len(), self.hp.n_embd);
        if let Some(st) = &mut self.stream {
            // a pass that failed midway left its buffers taken; the copies it queued still
            // run first on the side stream, and new products wait for the new copies
            st.ring = Ring::new(RING_BUFFERS);
        }
        if self.pass_x.bytes() < total * e * 4 {
            self.pass_x = self.cuda.gpu.alloc(0)?;
            self.pass_x = self.cuda.gpu.alloc(total * e * 4)?;
        }
        if self.pass_ints.bytes() < total * 5 * 4 {
            self.pass_ints = self.cuda.gpu.alloc(0)?;
            self.pass_ints = self.cuda.gpu.alloc(total * 5 * 4)?;
        }
        let mut chunks = Vec::new();
        for start in (0..total).step_by(self.n_ubatch) {
            let r = start..(start + self.n_ubatch).min(total);
            let io = Io {
                x: self.pass_x.at(start * e * 4),
                ints: self.pass_ints.at(start * 5 * 4),
            };
            let n = r.len();
            let (wanted, spans) = self.prepare(batch, r, io.ints)?;
            self.embed(n, io)?;
            chunks.push((n, io, wanted, spans));
        }
        let order: Vec<usize> = (0..self.layers.len())
            .filter(|&il| self.host_experts(il))
            .collect();
        let mut next = 0;
        while next < order.len().min(RING_BUFFERS) {
            self.stream_fill(order[next])?;
            next += 1;
        }
        for il in 0..self.layers.len() {
            let buf = if self.host_experts(il) {
                Some(ring(&mut self.stream)?.take(&self.cuda.gpu, il)?)
            } else {
                None
            };
            for (n, io, _, spans) in &chunks {
                self.layer(il, *n, spans, *io, buf, Part::Whole)?;
            }
            if let Some(b) = buf {
                ring(&mut self.stream)?.release(&self.cuda.gpu, b)?;
                if next < order.len() {
                    self.stream_fill(order[next])?;
                    next += 1;
                }
            }
        }
        for (n, io, wanted, _) in &chunks {
            self.logits(*n, wanted, *io, out)?;
        }
        Ok(())
    }

    /// Copies into card slots that have landed: their experts are served from the card now.
    fn land_swaps(&mut self) -> Result<(), CudaError> {
        let Some(t) = &mut self.tier else {
            return Ok(());
        };
        let mut i = 0;
        while i < t.in_flight.len() {
            if !t.in_flight[i].0.done()? {
                i += 1;
                continue;
            }
            let (_, copies) = t.in_flight.swap_remove(i);
            for (il, slot, e) in copies {
                t.live.landed(il, slot);
                if let GpuFfn::Moe { experts, .. } = &mut self.layers[il].ffn {
                    experts.slot[e as usize] = slot as i32;
                }
            }
        }
        Ok(())
    }

    /// Starts the copies residency plans after a step, on the side stream once the card is done
    /// with what this step queued (the slots being overwritten included). An evicted expert is
    /// served from the host from now on; a loaded one once [`GpuModel::land_swaps`] sees its copy
    /// landed.
    fn start_swaps(&mut self) -> Result<(), CudaError> {
        let Some(t) = &mut self.tier else {
            return Ok(());
        };
        let swaps = t.live.plan();
        if swaps.is_empty() {
            return Ok(());
        }
        let gpu = &self.cuda.gpu;
        gpu.side_waits(&gpu.main_event()?)?;
        let mut copies = Vec::with_capacity(swaps.len());
        for (il, swap) in swaps {
            let GpuFfn::Moe { experts, .. } = &mut self.layers[il].ffn else {
                return Err(CudaError(format!("residency swapped in dense layer {il}")));
            };
            if let Some(old) = swap.evict {
                experts.slot[old.expert as usize] = -1;
            }
            let Some(host) = &experts.host else {
                return Err(CudaError(format!(
                    "layer {il} has no host experts to swap in"
                )));
            };
            let (ne, e) = (experts.slot.len(), swap.load.expert as usize);
            for (t, card) in host.iter().zip(&experts.card) {
                let d = t.data();
                let eb = d.len() / ne;
                gpu.upload_side(card.buf.at(swap.slot * eb), &d[e * eb..(e + 1) * eb])?;
            }
            copies.push((il, swap.slot, e as u32));
        }
        t.in_flight.push((gpu.side_event()?, copies));
        Ok(())
    }

    fn host_experts(&self, il: usize) -> bool {
        matches!(&self.layers[il].ffn, GpuFfn::Moe { experts, .. } if !experts.all_on_card())
    }

    /// Queues the copy of layer `il`'s experts into the next ring buffer.
    fn stream_fill(&mut self, il: usize) -> Result<(), CudaError> {
        let GpuFfn::Moe { experts, .. } = &self.layers[il].ffn else {
            return Err(CudaError(format!("layer {il} has no experts to stream")));
        };
        ring(&mut self.stream)?.fill(&self.cuda.gpu, il, experts)
    }
    /// Token embeddings of the ubatch at `io` into its residual stream.
    fn embed(&mut self, n: usize, io: Io) -> Result<(), CudaError> {
        let c = &mut self.cuda;
        c.get_rows(&self.tok_embd, io.ints, n, io.x)?;
        if self.spec.embd_scale {
            let e = self.hp.n_embd;
            c.scale(io.x, (e as f32).sqrt(), n * e)?;
        }
        Ok(())
    }

    /// The logits of the wanted rows of the ubatch at `io`, appended to `out`.
    fn logits(
        &mut self,
        n: usize,
        wanted: &[usize],
        io: Io,
        out: &mut Vec<f32>,
    ) -> Result<(), CudaError> {
        let (c, s, hp) = (&mut self.cuda, &self.s, &self.hp);
        if wanted.is_empty() {
            return c.gpu.sync();
        }
        let e = hp.n_embd;
        let head = self.output.as_ref().unwrap_or(&self.tok_embd);
        let nw = wanted.len();
        c.move_rows(
            RowMove::Gather,
            io.x,
            io.ints + 16 * n as u64,
            s.cur.ptr(),
            e,
            nw,
        )?;
        c.rms_norm(
            s.cur.ptr(),
            self.output_norm.ptr(),
            s.cur.ptr(),
            nw,
            e,
            hp.eps,
        )?;
        let start = out.len();
        if self.embd_out {
            out.resize(start + nw * e, 0.0);
            return c.gpu.download(&mut out[start..], s.cur.ptr());
        }
        out.resize(start + nw * self.n_vocab, 0.0);
        for chunk in (0..nw).step_by(LOGIT_ROWS) {
            let m = (nw - chunk).min(LOGIT_ROWS);
            c.matmul(head, 0, s.cur.at(4 * chunk * e), m, s.logits.ptr())?;
            if let Some(cap) = hp.final_softcap {
                c.softcap(s.logits.ptr(), cap, m * self.n_vocab)?;
            }
            let dst = &mut out[start + chunk * self.n_vocab..start + (chunk + m) * self.n_vocab];
            c.gpu.download(dst, s.logits.ptr())?;
        }
        Ok(())
    }

    /// Layer `il` for the `n` tokens of the ubatch at `io`; its experts come from ring buffer
    /// `ring` when the pass streams them.
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &mut self,
        il: usize,
        n: usize,
        spans: &[Span],
        io: Io,
        ring: Option<usize>,
        part: Part,
    ) -> Result<(), CudaError> {
        let GpuModel {
            cuda: c,
            s,
            hp,
            layers,
            host,
            stream,
            tier,
            host_ints,
            spec,
            n_ctx_seq,
            ..
        } = self;
        let l = &layers[il];
        let e = hp.n_embd;
        let (hk, hv) = (hp.head_dim_k, hp.head_dim_v);
        let (nq, nkv, nv, na) = (
            hp.n_head * hk,
            hp.n_head_kv * hk,
            hp.n_head_kv * hv,
            hp.n_head * hv,
        );
        let at = |k: usize| io.ints + (4 * k * n) as u64;
        let (pos, base, cells) = (at(1), at(2), at(3));
        let neox = spec.rope == RopeKind::Neox;
        let q_scale = 1.0 / (hk as f32).sqrt();
        let x = io.x;
        // the attention half (a host layer's graph segment ends after its routing)
        if matches!(part, Part::Whole | Part::Head) {
            let input = c.add_rms_norm(
                x,
                0,
                l.attn_norm.ptr(),
                s.cur.ptr(),
                s.cur_q.ptr(),
                n,
                e,
                hp.eps,
            )?;
            c.matmul3(
                [&l.wq, &l.wk, &l.wv],
                input,
                n,
                [s.q.ptr(), s.k.ptr(), s.v.ptr()],
            )?;
            for (x, b, width) in [(&s.q, &l.bq, nq), (&s.k, &l.bk, nkv), (&s.v, &l.bv, nv)] {
                if let Some(b) = b {
                    c.add_bias(x.ptr(), b.ptr(), width, n * width)?;
                }
            }
            // queries scaled before attention, or the scale applied to the scores
            let (kq_scale, q_mul) = if spec.scale_q {
                (1.0, q_scale)
            } else {
                (q_scale, 1.0)
            };
            let norm = |w: &Option<DevBuf>| w.as_ref().map_or(0, |w| w.ptr());
            c.attn_prologue(
                [s.q.ptr(), s.k.ptr(), s.v.ptr()],
                [norm(&l.q_norm), norm(&l.k_norm)],
                [pos, cells],
                [l.k_cache.ptr(), l.v_cache.ptr()],
                n,
                (hp.n_head, hp.n_head_kv),
                (hk, hv),
                hp.n_rot,
                (l.rope_base, l.rope_scale),
                neox,
                hp.eps,
                q_mul,
            )?;
            let n_swa = if l.swa { hp.n_swa } else { 0 };
            for &span in spans {
                match span {
                    Span::Prompt {
                        start,
                        len,
                        seq,
                        p0,
                    } => c.attention_prompt(
                        s.q.at(4 * start * nq),
                        l.k_cache.ptr(),
                        l.v_cache.ptr(),
                        s.attn.at(4 * start * na),
                        seq * *n_ctx_seq,
                        p0,
                        len,
                        (hp.n_head, hp.n_head_kv),
                        (hk, hv),
                        kq_scale,
                        n_swa,
                    )?,
                    Span::Kernel { start, len } => c.attention(
                        s.q.at(4 * start * nq),
                        l.k_cache.ptr(),
                        l.v_cache.ptr(),
                        base + 4 * start as u64,
                        pos + 4 * start as u64,
                        s.attn.at(4 * start * na),
                        len,
                        (hp.n_head, hp.n_head_kv),
                        (hk, hv),
                        kq_scale,
                        n_swa,
                    )?,
                }
            }
            c.matmul(&l.wo, 0, s.attn.ptr(), n, s.o.ptr())?;
            if let Some(b) = &l.bo {
                c.add_bias(s.o.ptr(), b.ptr(), e, n * e)?;
            }
            if let Some(w) = &l.post_attn_norm {
                c.rms_norm(s.o.ptr(), w.ptr(), s.o.ptr(), n, e, hp.eps)?;
            }
            let input = c.add_rms_norm(
                x,
                s.o.ptr(),
                l.ffn_norm.ptr(),
                s.cur.ptr(),
                s.cur_q.ptr(),
                n,
                e,
                hp.eps,
            )?;
            debug_assert_eq!(input, cur_input(s, n, e));
        }
        // whether the FFN's output was added to x already
        let mut added = false;
        match &l.ffn {
            GpuFfn::Dense { .. } if part != Part::Whole => {
                return Err(CudaError(format!(
                    "dense layer {il} has no round trip to split at"
                )));
            }
            GpuFfn::Dense { gate, up, down } => {
                c.matmul(gate, 0, s.cur.ptr(), n, s.gate.ptr())?;
                c.matmul(up, 0, s.cur.ptr(), n, s.up.ptr())?;
                c.glu(s.gate.ptr(), s.up.ptr(), n * hp.n_ff, spec.act == Act::Gelu)?;
                c.matmul(down, 0, s.gate.ptr(), n, s.ffn.ptr())?;
            }
            GpuFfn::Moe { router, experts } => {
                // the Host part is the round trip alone: its routing ran in the Head part
                let (mats, on_host, share) = match (ring, stream.as_mut()) {
                    // the pass streamed the whole layer onto the card
                    (Some(b), Some(st)) => (&st.bufs[b], None, None),
                    (_, st) => (
                        &experts.card,
                        experts.host.as_ref().zip(host.as_mut()),
                        st.and_then(|st| st.share.as_mut()),
                    ),
                };
                let hosted = on_host.is_some();
                let on_host = on_host.map(|(tensors, side)| HostExperts {
                    slot: &experts.slot,
                    tensors,
                    side,
                    share,
                });
                // without a norm after the FFN, its sum goes straight into the residual stream
                let into_x = l.post_ffn_norm.is_none();
                let out = if into_x { x } else { s.ffn.ptr() };
                moe(
                    c,
                    hp,
                    spec.act,
                    router,
                    mats,
                    on_host,
                    s,
                    n,
                    host_ints,
                    part,
                    (out, into_x),
                )?;
                added = into_x;
                let round_trip = matches!(part, Part::Whole | Part::Host);
                if let (true, true, Some(t), Some(side)) =
                    (hosted, round_trip, tier.as_mut(), host.as_ref())
                {
                    t.live.record(il, &side.ids);
                }
            }
        }
        if added || !matches!(part, Part::Whole | Part::Tail) {
            return Ok(());
        }
        if let Some(w) = &l.post_ffn_norm {
            c.rms_norm(s.ffn.ptr(), w.ptr(), s.ffn.ptr(), n, e, hp.eps)?;
        }
        c.add(x, s.ffn.ptr(), n * e)
    }
}

/// Which part of a layer to run. A layer whose experts partly live on the host splits a decode
/// step at its round trip: `Head` (attention, norm, routing) and `Tail` (combining the experts'
/// outputs into the residual stream) go into graphs on either side of `Host` (the round trip,
/// run eagerly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Whole,
    Head,
    Host,
    Tail,
}

/// The experts of a layer that live on the host, for one step.
struct HostExperts<'a> {
    slot: &'a [i32],
    tensors: &'a [Tensor; 3],
    side: &'a mut HostSide,
    share: Option<&'a mut CardShare>,
}

/// The mixture-of-experts FFN of `n` tokens in `s.cur` into `out.0` (added to it when `out.1`):
/// the experts in `mats` on the card, and those without a slot (when `host` says which) on the
/// CPU meanwhile.
#[allow(clippy::too_many_arguments)]
fn moe(
    c: &mut Cuda,
    hp: &Hparams,
    act: Act,
    router: &DevMatrix,
    mats: &[DevMatrix; 3],
    host: Option<HostExperts>,
    s: &Scratch,
    n: usize,
    lists: &mut Vec<i32>,
    part: Part,
    (out, accumulate): (u64, bool),
) -> Result<(), CudaError> {
    let (ne, k, nf, e) = (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_embd);
    let gelu = act == Act::Gelu;
    let (ids, w) = (s.moe_ids.ptr(), s.moe_w.ptr());
    match part {
        Part::Whole | Part::Head => {
            c.matmul(router, 0, s.cur.ptr(), n, s.router.ptr())?;
            c.route(
                s.router.ptr(),
                n,
                ne,
                k,
                hp.expert_norm,
                hp.expert_scale,
                ids,
                w,
            )?;
            if part == Part::Head {
                return Ok(());
            }
        }
        Part::Tail => return c.moe_combine(s.moe_y.ptr(), w, out, accumulate, n, k, e),
        Part::Host => {}
    }
    let Some(h) = host else {
        if part == Part::Host {
            return Err(CudaError("a round trip without host experts".into()));
        }
        if n <= MMV_MAX {
            // decode: each (token, slot) pair reads only its expert's rows
            card_pairs(c, mats, ids, s, n, k, gelu)?;
        } else {
            let mut chosen = vec![0i32; n * k];
            c.gpu.download(&mut chosen, ids)?;
            card_groups(c, mats, &chosen, s, n, k, gelu, lists)?;
        }
        return c.moe_combine(s.moe_y.ptr(), w, out, accumulate, n, k, e);
    };
    let (side, share) = (h.side, h.share);
    let t0 = std::time::Instant::now();
    side.ids.resize(n * k, 0);
    c.gpu.download(&mut side.ids, ids)?;
    side.x.resize(n * e, 0.0);
    c.gpu.download(&mut side.x, s.cur.ptr())?;
    side.waits[0] += t0.elapsed();
    side.layers += 1;
    let slots: Vec<i32> = side.ids.iter().map(|&x| h.slot[x as usize]).collect();
    let mut pairs = Vec::new();
    let mut rows: Vec<i32> = Vec::new();
    for (p, &sl) in slots.iter().enumerate() {
        if sl < 0 {
            pairs.push((p / k, side.ids[p] as usize));
            rows.push(p as i32);
        }
    }
    // the card's experts first, so they run while the host computes its own
    if slots.iter().any(|&sl| sl >= 0) {
        if n <= MMV_MAX {
            c.gpu.upload(s.slot_ids.ptr(), &slots)?;
            card_pairs(c, mats, s.slot_ids.ptr(), s, n, k, gelu)?;
        } else {
            card_groups(c, mats, &slots, s, n, k, gelu, lists)?;
        }
    }
    // a small step copies some host experts onto the card and multiplies them there meanwhile
    let share = share.filter(|_| n <= MMV_MAX && !pairs.is_empty());
    let mut share = match share {
        Some(sh) => {
            if let Some((a, b, m)) = &sh.timing {
                if b.done()? {
                    sh.split.card(*m, a.elapsed_us(b)?);
                    sh.timing = None;
                }
            }
            let mut sent = by_use(&pairs);
            let distinct = sent.len();
            sent.truncate(sh.split.count(distinct));
            if !sent.is_empty() {
                let start = share_experts(c, sh, h.tensors, h.slot.len(), &sent)?;
                let mut ids = vec![-1i32; n * k];
                let (mut kept, mut kept_rows) = (Vec::new(), Vec::new());
                for (&(t, x), &row) in pairs.iter().zip(&rows) {
                    match sent.iter().position(|&y| y == x) {
                        Some(j) => ids[row as usize] = j as i32,
                        None => {
                            kept.push((t, x));
                            kept_rows.push(row);
                        }
                    }
                }
                (pairs, rows) = (kept, kept_rows);
                c.gpu.upload(s.share_ids.ptr(), &ids)?;
                card_pairs(c, &sh.mats, s.share_ids.ptr(), s, n, k, gelu)?;
                if let Some(start) = start {
                    sh.timing = Some((start, c.gpu.timed_main_event()?, sent.len()));
                }
                sh.read = Some(c.gpu.main_event()?);
            }
            sh.steps += 1;
            sh.sent += sent.len() as u64;
            // the CPU's distinct experts, for its cost per expert
            Some((sh, distinct - sent.len()))
        }
        None => None,
    };
    if !pairs.is_empty() {
        let t = h.tensors;
        let t1 = std::time::Instant::now();
        side.y.resize(pairs.len() * e, 0.0);
        expert_pairs(
            &side.pool,
            act,
            [t[0].mat(), t[1].mat(), t[2].mat()],
            nf,
            &side.x,
            &pairs,
            &mut side.y,
            &mut side.bufs,
            None,
        );
        let t2 = std::time::Instant::now();
        side.waits[1] += t2 - t1;
        if let Some((sh, kept)) = share.as_mut() {
            sh.split.cpu(*kept, (t2 - t1).as_secs_f64() * 1e6);
        }
        let staged = c.buf(Buf::HostOut, side.y.len() * 4)?;
        c.gpu.upload(staged, &side.y)?;
        c.gpu.upload(s.host_rows.ptr(), &rows)?;
        c.move_rows(
            RowMove::Scatter,
            staged,
            s.host_rows.ptr(),
            s.moe_y.ptr(),
            e,
            pairs.len(),
        )?;
        side.waits[2] += t2.elapsed();
    }
    if part == Part::Host {
        return Ok(());
    }
    c.moe_combine(s.moe_y.ptr(), w, out, accumulate, n, k, e)
}

/// Queues the copies of host experts `sent` (of `tensors`, each stacking `ne`) into the share
/// buffers, on the side stream after the products that last read them, with the main stream
/// made to wait for them; expert `sent[j]` lands in buffer slot `j`. Returns a timed event
/// before the copies when no earlier measurement is pending.
fn share_experts(
    c: &Cuda,
    sh: &mut CardShare,
    tensors: &[Tensor; 3],
    ne: usize,
    sent: &[usize],
) -> Result<Option<Event>, CudaError> {
    let gpu = &c.gpu;
    if let Some(ev) = &sh.read {
        gpu.side_waits(ev)?;
    }
    // one measurement at a time: a new one starts once the last one was read
    let start = match sh.timing {
        None => Some(gpu.timed_side_event()?),
        Some(_) => None,
    };
    for (t, m) in tensors.iter().zip(&mut sh.mats) {
        let d = t.data();
        let eb = shape_for(m, t, ne, sh.cap, sent.len())?;
        for (j, &x) in sent.iter().enumerate() {
            gpu.upload_side(m.buf.at(j * eb), &d[x * eb..(x + 1) * eb])?;
        }
    }
    gpu.main_waits(&gpu.side_event()?)?;
    Ok(start)
}

/// Decode-sized expert products: pair `p` of the `n * k` multiplies by expert `ids[p]` of
/// `mats` (pairs with a negative id are skipped), into row `p` of `s.moe_y`.
#[allow(clippy::too_many_arguments)]
/// The FFN's input `s.cur` of `n` tokens of `e` values, with the 8-bit copy the FFN norm made
/// in `s.cur_q` when it made one ([`ops::norm_quantizes`]).
fn cur_input(s: &Scratch, n: usize, e: usize) -> Input {
    Input {
        x: s.cur.ptr(),
        q8: ops::norm_quantizes(n, e).then(|| s.cur_q.ptr()),
    }
}

fn card_pairs(
    c: &mut Cuda,
    [gate, up, down]: &[DevMatrix; 3],
    ids: u64,
    s: &Scratch,
    n: usize,
    k: usize,
    gelu: bool,
) -> Result<(), CudaError> {
    c.matmul_id_glu(
        [gate, up],
        ids,
        cur_input(s, n, gate.k),
        k,
        n * k,
        [s.gate.ptr(), s.up.ptr()],
        gelu,
    )?;
    c.matmul_id(down, ids, s.gate.ptr(), 1, n * k, s.moe_y.ptr())
}

/// Padded rows one pass of [`card_groups`] may hold (or the ubatch's tokens, if more): bounds its
/// buffers however the routing skews.
pub const GROUP_ROWS: usize = 4096;

/// What one more pass of [`card_groups`] costs, in padded rows: its gathers, scatters and
/// launches and a batched product over fewer experts, against the rows a pass multiplies for
/// nothing when a small group is padded to a large one. On the H200 (even routing, whole model
/// on the card, one run each): 256 gave pp512 4123 / pp4096 3937 tok/s, 2048 gave 5037 / 5169,
/// 1e6 (fewest passes) 5300 / 5209.
const PASS_COST_ROWS: usize = 2048;

/// [`PASS_COST_ROWS`], or `BLOOMERY_PASS_ROWS` when set (for measuring).
fn pass_cost_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("BLOOMERY_PASS_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(PASS_COST_ROWS)
    })
}

/// Passes `(first expert, experts, padded group size)` over the experts with pairs in `groups`:
/// at most `per` experts, and at most `max_rows` padded rows (unless one group alone is larger).
/// The experts are cut into runs of the least cost, [`PASS_COST_ROWS`] a pass plus its padded
/// rows, so one hot expert under skewed routing gets a pass of its own instead of making its
/// neighbours' groups as large as its own; runs of empty groups cost nothing.
fn expert_passes(groups: &[Vec<usize>], per: usize, max_rows: usize) -> Vec<(usize, usize, usize)> {
    let n = groups.len();
    // best[i]: least cost of the first i experts, and where its last pass starts
    let mut best = vec![(0usize, 0usize); n + 1];
    for i in 1..=n {
        best[i] = (usize::MAX, 0);
        let mut m = 0;
        for j in (i.saturating_sub(per.max(1))..i).rev() {
            m = m.max(groups[j].len());
            let count = i - j;
            if count > 1 && count * m > max_rows {
                break;
            }
            let pass = if m == 0 {
                0
            } else {
                pass_cost_rows() + count * m
            };
            let cost = best[j].0 + pass;
            if cost < best[i].0 {
                best[i] = (cost, j);
            }
        }
    }
    let mut out = Vec::new();
    let mut i = n;
    while i > 0 {
        let j = best[i].1;
        let m = groups[j..i].iter().map(Vec::len).max().unwrap_or(0);
        if m > 0 {
            out.push((j, i - j, m));
        }
        i = j;
    }
    out.reverse();
    out
}

/// Prompt-sized expert products: each expert of `mats` gets the pairs whose entry in `slots` names
/// it (negative entries are skipped), gathered into a group padded to the largest group; the
/// groups of a pass of experts (as many as [`Cuda::experts_per_pass`] allows) are multiplied in
/// one batched product per matrix, and the results land in the pairs' rows of `s.moe_y`.
#[allow(clippy::too_many_arguments)]
fn card_groups(
    c: &mut Cuda,
    [gate, up, down]: &[DevMatrix; 3],
    slots: &[i32],
    s: &Scratch,
    n: usize,
    k: usize,
    gelu: bool,
    lists: &mut Vec<i32>,
) -> Result<(), CudaError> {
    let (ng, nf, e) = (gate.n_expert, gate.rows, down.rows);
    let mut by_slot: Vec<Vec<usize>> = vec![Vec::new(); ng];
    for (p, &x) in slots.iter().enumerate().take(n * k) {
        if x >= 0 {
            by_slot[x as usize].push(p);
        }
    }
    let per = Cuda::experts_per_pass(gate).min(Cuda::experts_per_pass(down));
    for (e0, count, m) in expert_passes(&by_slot, per, GROUP_ROWS.max(n)) {
        let groups = &by_slot[e0..e0 + count];
        lists.clear();
        lists.resize(2 * count * m, -1);
        for (x, pairs) in groups.iter().enumerate() {
            for (j, &p) in pairs.iter().enumerate() {
                lists[x * m + j] = (p / k) as i32;
                lists[count * m + x * m + j] = p as i32;
            }
        }
        let (tok_lists, pair_lists) = (s.moe_lists.ptr(), s.moe_lists.at(4 * count * m));
        c.gpu.upload(tok_lists, lists)?;
        let rows = count * m;
        let x16 = c.buf(Buf::X16, rows * e * 2)?;
        c.move_rows(RowMove::GatherF16, s.cur.ptr(), tok_lists, x16, e, rows)?;
        let g = c.buf(Buf::MoeGate, rows * nf * 4)?;
        let u = c.buf(Buf::MoeUp, rows * nf * 4)?;
        c.matmul_experts(gate, e0, count, x16, m, g)?;
        c.matmul_experts(up, e0, count, x16, m, u)?;
        c.glu(g, u, rows * nf, gelu)?;
        let g16 = c.buf(Buf::X16, rows * nf * 2)?;
        c.to_f16(g, g16, rows * nf)?;
        let y = c.buf(Buf::MoeOut, rows * e * 4)?;
        c.matmul_experts(down, e0, count, g16, m, y)?;
        c.move_rows(RowMove::Scatter, y, pair_lists, s.moe_y.ptr(), e, rows)?;
    }
    Ok(())
}

impl Forward for GpuModel {
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn n_ctx_seq(&self) -> usize {
        self.n_ctx_seq
    }

    fn n_swa(&self) -> usize {
        if self.hp.swa_layers.iter().any(|&s| s) {
            self.hp.n_swa as usize
        } else {
            0
        }
    }

    fn n_embd(&self) -> usize {
        self.hp.n_embd
    }

    fn output_hidden(&mut self, on: bool) {
        self.embd_out = on;
    }

    fn decode(&mut self, batch: &Batch, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.check(batch)?;
        self.cuda
            .gpu
            .bind()
            .map_err(|e| EngineError::BadBatch(format!("CUDA: {e}")))?;
        for i in 0..batch.len() {
            let s = batch.seq[i] as usize;
            self.seq_len[s] = self.seq_len[s].max(batch.pos[i] + 1);
        }
        let failed = |e: CudaError| EngineError::BadBatch(format!("CUDA step failed: {e}"));
        self.land_swaps().map_err(failed)?;
        if self.stream.is_some() && batch.len() >= STREAM_MIN_TOKENS {
            return self.streamed_pass(batch, out).map_err(failed);
        }
        let mut start = 0;
        while start < batch.len() {
            let end = (start + self.n_ubatch).min(batch.len());
            self.ubatch(batch, start..end, out).map_err(failed)?;
            start = end;
        }
        self.start_swaps().map_err(failed)
    }

    fn seq_rm(&mut self, seq: SeqId, p0: u32, p1: Option<u32>) {
        // positions are rows, so removing a middle range would leave a gap: everything from p0
        // on goes (the server only ever truncates, with p1 = None)
        let _ = p1;
        if let Some(len) = self.seq_len.get_mut(seq as usize) {
            *len = (*len).min(p0);
        }
    }

    fn seq_cp(&mut self, src: SeqId, dst: SeqId, n: u32) {
        let (src, dst) = (src as usize, dst as usize);
        if src >= self.seq_len.len() || dst >= self.seq_len.len() || src == dst {
            return;
        }
        let n = n.min(self.seq_len[src]) as usize;
        if let Err(e) = self.cuda.gpu.bind() {
            log::error!("copying the KV cache of sequence {src} to {dst}: {e}");
            return;
        }
        let (kw, vw) = self.kv_row_bytes();
        for l in &self.layers {
            for (buf, w) in [(&l.k_cache, kw), (&l.v_cache, vw)] {
                let (from, to) = (
                    buf.at(src * self.n_ctx_seq * w),
                    buf.at(dst * self.n_ctx_seq * w),
                );
                if let Err(e) = self.cuda.gpu.copy(to, from, n * w) {
                    log::error!("copying the KV cache of sequence {src} to {dst}: {e}");
                    self.seq_len[dst] = 0;
                    return;
                }
            }
        }
        self.seq_len[dst] = n as u32;
    }

    fn seq_save(&self, seq: SeqId) -> Option<SeqState> {
        let s = seq as usize;
        let n = *self.seq_len.get(s)? as usize;
        if n == 0 {
            return None;
        }
        if let Err(e) = self.cuda.gpu.bind() {
            log::error!("saving the KV cache of sequence {s}: {e}");
            return None;
        }
        let (kw, vw) = self.kv_row_bytes();
        let mut rows = Vec::with_capacity(2 * self.layers.len());
        for l in &self.layers {
            for (buf, w) in [(&l.k_cache, kw), (&l.v_cache, vw)] {
                let mut host = vec![0u8; n * w];
                if let Err(e) = self
                    .cuda
                    .gpu
                    .download(&mut host, buf.at(s * self.n_ctx_seq * w))
                {
                    log::error!("saving the KV cache of sequence {s}: {e}");
                    return None;
                }
                rows.push(host);
            }
        }
        let bytes = rows.iter().map(Vec::len).sum();
        Some(SeqState::new(SavedSeq { n, rows }, bytes))
    }

    fn seq_load(&mut self, seq: SeqId, state: &SeqState) -> bool {
        let s = seq as usize;
        let Some(saved) = state.get::<SavedSeq>() else {
            return false;
        };
        let (kw, vw) = self.kv_row_bytes();
        let fits = s < self.seq_len.len()
            && saved.n <= self.n_ctx_seq
            && saved.rows.len() == 2 * self.layers.len()
            && saved
                .rows
                .chunks(2)
                .all(|kv| kv[0].len() == saved.n * kw && kv[1].len() == saved.n * vw);
        if !fits {
            return false;
        }
        if let Err(e) = self.cuda.gpu.bind() {
            log::error!("restoring the KV cache of sequence {s}: {e}");
            return false;
        }
        self.seq_len[s] = 0;
        for (l, kv) in self.layers.iter().zip(saved.rows.chunks(2)) {
            for (buf, w, host) in [(&l.k_cache, kw, &kv[0]), (&l.v_cache, vw, &kv[1])] {
                if let Err(e) = self.cuda.gpu.upload(buf.at(s * self.n_ctx_seq * w), host) {
                    log::error!("restoring the KV cache of sequence {s}: {e}");
                    return false;
                }
            }
        }
        // the uploads read the saved rows, which the caller may drop once this returns
        if let Err(e) = self.cuda.gpu.sync() {
            log::error!("restoring the KV cache of sequence {s}: {e}");
            return false;
        }
        self.seq_len[s] = saved.n as u32;
        true
    }
}

/// A sequence's KV rows copied to the host (the prompt cache): per layer K then V, `n` rows.
struct SavedSeq {
    n: usize,
    rows: Vec<Vec<u8>>,
}

impl GpuModel {
    /// Bytes of one cached position's K and V rows in a layer (f16).
    fn kv_row_bytes(&self) -> (usize, usize) {
        let hp = &self.hp;
        (
            hp.n_head_kv * hp.head_dim_k * 2,
            hp.n_head_kv * hp.head_dim_v * 2,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_passes_bound_experts_and_padded_rows() {
        let g = |sizes: &[usize]| -> Vec<Vec<usize>> {
            sizes.iter().map(|&n| (0..n).collect()).collect()
        };
        // at most 3 experts a pass; empty groups at the end need no pass
        assert_eq!(
            expert_passes(&g(&[2, 0, 1, 4, 0, 0, 0]), 3, 100),
            vec![(0, 3, 2), (3, 1, 4)]
        );
        // every expert with pairs lies in exactly one pass, within the bounds
        let sizes = [0, 5, 0, 0, 7, 1, 90, 2, 0, 3, 3, 60, 0];
        let passes = expert_passes(&g(&sizes), 4, 100);
        let mut covered = [0; 13];
        for &(e0, count, m) in &passes {
            assert!(count <= 4 && (count == 1 || count * m <= 100), "{passes:?}");
            assert_eq!(m, sizes[e0..e0 + count].iter().copied().max().unwrap());
            covered[e0..e0 + count].iter_mut().for_each(|c| *c += 1);
        }
        for (e, &n) in sizes.iter().enumerate() {
            assert!(covered[e] <= 1 && (n == 0 || covered[e] == 1), "{passes:?}");
        }
        // 10 padded rows at most: a big group starts its own pass, and may exceed alone
        assert_eq!(
            expert_passes(&g(&[3, 3, 3, 12, 1]), 8, 10),
            vec![(0, 3, 3), (3, 1, 12), (4, 1, 1)]
        );
        assert!(expert_passes(&g(&[0, 0]), 4, 10).is_empty());
    }

    #[test]
    fn a_hot_expert_is_not_the_padding_of_its_neighbours() {
        let g = |sizes: &[usize]| -> Vec<Vec<usize>> {
            sizes.iter().map(|&n| (0..n).collect()).collect()
        };
        // skewed routing: expert 2 takes 3000 rows, the others ~30
        let passes = expert_passes(&g(&[30, 28, 3000, 31, 29, 33]), 8, 8192);
        assert_eq!(passes, vec![(0, 2, 30), (2, 1, 3000), (3, 3, 33)]);
        let padded: usize = passes.iter().map(|p| p.1 * p.2).sum();
        assert!(padded <= 2 * 3151, "{padded} padded rows for 3151 real");
        // small groups stay together however uneven: splitting them saves less than a pass costs
        assert_eq!(
            expert_passes(&g(&[1, 9, 2, 40, 0, 3]), 8, 4096),
            vec![(0, 6, 40)]
        );
    }

    #[test]
    fn long_runs_attend_through_products_and_the_rest_through_the_kernel() {
        // a 20-token prompt chunk of sequence 1 between decode tokens of sequences 0 and 2
        let mut seq = vec![0u32];
        let mut pos = vec![7u32];
        seq.extend([1; 20]);
        pos.extend(30..50);
        seq.extend([2, 0]);
        pos.extend([3, 8]);
        assert_eq!(
            spans(&seq, &pos),
            vec![
                Span::Kernel { start: 0, len: 1 },
                Span::Prompt {
                    start: 1,
                    len: 20,
                    seq: 1,
                    p0: 30
                },
                Span::Kernel { start: 21, len: 2 },
            ]
        );
        // a decode step is one kernel stretch whatever sequences it holds
        assert_eq!(
            spans(&[0, 1, 0], &[5, 9, 6]),
            vec![Span::Kernel { start: 0, len: 3 }]
        );
        // a position gap ends a run
        let (seq, pos): (Vec<u32>, Vec<u32>) = (0..32).map(|i| (0, i + (i / 16) * 5)).unzip();
        assert_eq!(spans(&seq, &pos).len(), 2);
    }
}
