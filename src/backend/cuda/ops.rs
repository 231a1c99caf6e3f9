//! Typed launches of the kernels in `kernels/`: one method per operation, taking device
//! addresses and sizes. Matrix products pick the path by the number of columns: a few columns go
//! through the dequantizing matrix-vector kernels, more are dequantized to f16 once and
//! multiplied by cuBLAS on the tensor cores.

use std::collections::HashMap;

use cudarc::driver::CudaFunction;

use super::compile;
use super::device::{Arg, CudaError, DevBuf, Gemm, Gpu};
use crate::model::GgmlType;

/// Columns up to which products run through the matrix-vector kernels (`MMV_MAX` in
/// kernels/matvec.cu).
pub const MMV_MAX: usize = 8;
const MMV_WARPS: u32 = 4;
/// Most experts a router may have (`MAX_EXPERTS` in kernels/ops.cu).
pub const MAX_EXPERTS: usize = 512;
/// Widest attention head (`ATT_MAXD` in kernels/attention.cu).
pub const MAX_HEAD_DIM: usize = 256;

/// The weight types the kernels read (`FOR_EACH_TYPE` in kernels/quants.cuh).
pub const TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
    GgmlType::Mxfp4,
    GgmlType::Nvfp4,
];

pub fn supports(ty: GgmlType) -> bool {
    TYPES.contains(&ty)
}

/// A weight matrix (or a stack of expert matrices) on the card in its file's block format.
pub struct DevMatrix {
    pub buf: DevBuf,
    pub ty: GgmlType,
    /// Row length (elements).
    pub k: usize,
    /// Rows per expert (all rows for a dense matrix).
    pub rows: usize,
    pub n_expert: usize,
    pub row_bytes: usize,
}

impl DevMatrix {
    pub fn expert_bytes(&self) -> usize {
        self.rows * self.row_bytes
    }
}

struct PerType {
    mmv: CudaFunction,
    mmv_id: CudaFunction,
    mmv_id_glu: CudaFunction,
    deq_f16: CudaFunction,
    get_rows: CudaFunction,
    /// Three matrices in one launch (`mmv3_*`), for the types [`grouped`] names.
    mmv3: Option<CudaFunction>,
}

struct Fns {
    rms_norm: CudaFunction,
    rope: CudaFunction,
    add: CudaFunction,
    add_bias: CudaFunction,
    scale: CudaFunction,
    softcap: CudaFunction,
    glu: CudaFunction,
    to_f16: CudaFunction,
    kv_store: CudaFunction,
    gather_rows: CudaFunction,
    scatter_rows: CudaFunction,
    gather_f16: CudaFunction,
    softmax_rows: CudaFunction,
    route: CudaFunction,
    moe_combine: CudaFunction,
    attn: CudaFunction,
    quantize_x: CudaFunction,
    attn_prologue: CudaFunction,
}

/// How [`Cuda::move_rows`] uses its index list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowMove {
    /// `out[j] = x[idx[j]]`.
    Gather,
    /// `out[idx[j]] = x[j]`, skipping `idx[j] < 0` (padding).
    Scatter,
    /// `out[j] = f16(x[idx[j]])`, zero rows where `idx[j] < 0`.
    GatherF16,
}

/// The most f16 weights one batched expert product dequantizes at once: experts beyond it go in
/// further passes, which bounds the card memory a prompt pass needs whatever the expert count.
pub const W16_PASS_BYTES: usize = 96 << 20;
/// The most bytes of attention scores and probabilities one prompt attention pass holds.
pub const ATTN_PASS_BYTES: usize = 96 << 20;

/// Scratch buffers that grow to the largest request and are reused between operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// Weights dequantized to f16 for cuBLAS.
    W16,
    /// Activations converted to f16 for cuBLAS.
    X16,
    /// Prompt attention: queries in f16, scores, and probabilities in f16.
    Q16,
    Scores,
    Probs,
    /// Mixture-of-experts prompt pass: gate and up outputs and the experts' outputs, per expert
    /// group.
    MoeGate,
    MoeUp,
    MoeOut,
    /// Outputs of the experts the host computed, on their way into the step's expert outputs.
    HostOut,
    /// Decode products' input quantized to 8 bits (for Q4_K and Q8_0 weights; `quantize_x`).
    Xq,
}

const N_BUF: usize = 10;

/// A card with its kernels loaded and the scratch that cuBLAS products read.
pub struct Cuda {
    pub gpu: Gpu,
    per_type: HashMap<GgmlType, PerType>,
    f: Fns,
    scratch: Vec<DevBuf>,
}

fn blocks(n: usize, per: u32) -> u32 {
    n.div_ceil(per as usize) as u32
}

/// Whether decode products over `ty` weights read their input quantized to 8 bits per 32 values
/// (`reads_q8` in kernels/matvec.cu).
pub fn reads_q8(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q8_0)
}

/// A product's input: f32 rows at `x`, and their 8-bit copy for the decode products when one
/// was made with them ([`Cuda::add_rms_norm`] with a quantized output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Input {
    pub x: u64,
    pub q8: Option<u64>,
}

impl From<u64> for Input {
    fn from(x: u64) -> Input {
        Input { x, q8: None }
    }
}

/// Whether [`Cuda::add_rms_norm`] can quantize `rows` rows of `width` as it normalizes them
/// (rows held in the kernel's registers, whole 32-value chunks; a decode step's rows).
pub fn norm_quantizes(rows: usize, width: usize) -> bool {
    rows <= MMV_MAX && width.is_multiple_of(32) && width <= 16 * 256
}

/// Whether decode products over `ty` run with a group of warps per row (`grouped` and
/// `mmv_group` in kernels/matvec.cu, which decide by type alone): F32 and the types that read
/// quantized input. Their rows are whole 16-weight items, as every matrix's rows are whole
/// 32-value chunks ([`Cuda::upload_matrix`]).
pub fn grouped(ty: GgmlType) -> bool {
    ty == GgmlType::F32 || reads_q8(ty)
}

/// Warps per row of a grouped product: about [`items_per_thread`] 16-weight items a thread, at
/// most the block's four warps.
fn warps_per_row(k: usize) -> u32 {
    warps_for(k / 16, items_per_thread())
}

fn warps_for(items: usize, per_thread: usize) -> u32 {
    match items.div_ceil(32 * per_thread.max(1)) {
        0..=1 => 1,
        2 => 2,
        _ => 4,
    }
}

/// Items of 16 weights each thread of a grouped decode product aims to read: 1, or
/// `BLOOMERY_MMV_ITEMS` (a tuning knob for measuring fewer, longer-running threads).
fn items_per_thread() -> usize {
    static ITEMS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ITEMS.get_or_init(|| {
        std::env::var("BLOOMERY_MMV_ITEMS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|&n: &usize| (1..=16).contains(&n))
            .unwrap_or(1)
    })
}

/// The grid's x size and the kernels' last argument for a decode product of `rows` rows of
/// `w`: a group of warps per row (the argument its warps) or `rows_per_warp` rows per warp.
fn mmv_shape(w: &DevMatrix, rows: usize, all_rows: usize) -> (u32, u32) {
    if grouped(w.ty) {
        let g = warps_per_row(w.k);
        (blocks(rows, MMV_WARPS / g), g)
    } else {
        let rpw = rows_per_warp(all_rows);
        (blocks(rows, MMV_WARPS * rpw), rpw)
    }
}

/// Rows each warp of a matrix-vector product takes for `rows` rows in all: enough warps to keep
/// every multiprocessor's copies in flight (about 2048), and otherwise several rows per warp so
/// the next row's weights are copied while one is computed.
fn rows_per_warp(rows: usize) -> u32 {
    (rows / 2048).clamp(1, 8) as u32
}

fn i32_of(v: usize) -> Arg {
    Arg::I32(v as i32)
}

impl Cuda {
    /// Opens card `ordinal` and loads the kernels (compiling them on a cache miss, and again if
    /// the driver refuses a cached image).
    pub fn open(ordinal: usize) -> Result<Cuda, CudaError> {
        let mut gpu = Gpu::open(ordinal)?;
        let arch = gpu.info.compute_capability;
        let driver = super::device::driver_version()?;
        let cached = compile::image(arch, driver, false)?;
        if let Err(e) = gpu.load_kernels(cached) {
            log::warn!("the cached kernel image was refused ({e}); compiling again");
            gpu.load_kernels(compile::image(arch, driver, true)?)?;
        }
        let mut per_type = HashMap::new();
        for &ty in TYPES {
            let n = ty.name().to_lowercase();
            per_type.insert(
                ty,
                PerType {
                    mmv: gpu.function(&format!("mmv_{n}"))?,
                    mmv_id: gpu.function(&format!("mmv_id_{n}"))?,
                    mmv_id_glu: gpu.function(&format!("mmv_id_glu_{n}"))?,
                    deq_f16: gpu.function(&format!("deq_f16_{n}"))?,
                    get_rows: gpu.function(&format!("get_rows_{n}"))?,
                    mmv3: if grouped(ty) {
                        Some(gpu.function(&format!("mmv3_{n}"))?)
                    } else {
                        None
                    },
                },
            );
        }
        let f = Fns {
            rms_norm: gpu.function("rms_norm")?,
            rope: gpu.function("rope")?,
            add: gpu.function("add")?,
            add_bias: gpu.function("add_bias")?,
            scale: gpu.function("scale")?,
            softcap: gpu.function("softcap")?,
            glu: gpu.function("glu")?,
            to_f16: gpu.function("to_f16")?,
            kv_store: gpu.function("kv_store")?,
            gather_rows: gpu.function("gather_rows")?,
            scatter_rows: gpu.function("scatter_rows")?,
            gather_f16: gpu.function("gather_f16")?,
            softmax_rows: gpu.function("softmax_rows")?,
            route: gpu.function("route")?,
            moe_combine: gpu.function("moe_combine")?,
            attn: gpu.function("attn_f16")?,
            quantize_x: gpu.function("quantize_x")?,
            attn_prologue: gpu.function("attn_prologue")?,
        };
        let scratch = (0..N_BUF).map(|_| gpu.alloc(0)).collect::<Result<_, _>>()?;
        Ok(Cuda {
            gpu,
            per_type,
            f,
            scratch,
        })
    }

    fn kernels(&self, ty: GgmlType) -> Result<&PerType, CudaError> {
        self.per_type
            .get(&ty)
            .ok_or_else(|| CudaError(format!("no CUDA kernels for {} weights", ty.name())))
    }

    pub fn upload_f32(&self, v: &[f32]) -> Result<DevBuf, CudaError> {
        let b = self.gpu.alloc(v.len() * 4)?;
        self.gpu.upload(b.ptr(), v)?;
        Ok(b)
    }

    /// Uploads `data` (rows of `k` elements in `ty`'s blocks, `rows` per expert).
    pub fn upload_matrix(
        &self,
        data: &[u8],
        ty: GgmlType,
        k: usize,
        rows: usize,
        n_expert: usize,
    ) -> Result<DevMatrix, CudaError> {
        self.kernels(ty)?;
        let row_bytes = ty
            .bytes_for(k as u64)
            .ok_or_else(|| CudaError(format!("a row of {k} is not whole {} blocks", ty.name())))?
            as usize;
        if !k.is_multiple_of(32) || data.len() != row_bytes * rows * n_expert {
            return Err(CudaError(format!(
                "{} matrix of {n_expert} x {rows} x {k}: {} bytes given",
                ty.name(),
                data.len()
            )));
        }
        let buf = self.gpu.alloc(data.len())?;
        self.gpu.upload(buf.ptr(), data)?;
        // the source is a memory map that must stay mapped until the copy is done
        self.gpu.sync()?;
        Ok(DevMatrix {
            buf,
            ty,
            k,
            rows,
            n_expert,
            row_bytes,
        })
    }

    /// Scratch buffer `which`, grown to at least `bytes` (its old contents are lost when it
    /// grows).
    pub fn buf(&mut self, which: Buf, bytes: usize) -> Result<u64, CudaError> {
        let i = which as usize;
        if self.scratch[i].bytes() < bytes {
            // free first: the card may not hold both
            self.scratch[i] = self.gpu.alloc(0)?;
            // an eighth more than asked, so slowly growing requests do not reallocate each time
            self.scratch[i] = self.gpu.alloc(bytes + bytes / 8)?;
        }
        Ok(self.scratch[i].ptr())
    }

    /// Bytes of `rows` rows of `k` values quantized for the decode products (`xq_stride` in
    /// kernels/matvec.cu).
    pub fn quantized_x_bytes(rows: usize, k: usize) -> usize {
        rows * ((k + k / 4 + 15) & !15)
    }

    /// The input of a decode product over `w`: `x` itself, or for Q4_K and Q8_0 weights its
    /// `rows` rows quantized into [`Buf::Xq`] (which must already be large enough when a graph
    /// is being captured: the engine sizes it at load).
    fn product_input(&mut self, w: &DevMatrix, x: Input, rows: usize) -> Result<u64, CudaError> {
        if !reads_q8(w.ty) {
            return Ok(x.x);
        }
        if let Some(q) = x.q8 {
            return Ok(q);
        }
        let x = x.x;
        let out = self.buf(Buf::Xq, Self::quantized_x_bytes(rows, w.k))?;
        let chunks = (w.k / 32) as u32;
        self.gpu.launch(
            &self.f.quantize_x,
            (chunks.div_ceil(4), rows as u32, 1),
            128,
            0,
            &[Arg::Ptr(x), i32_of(w.k), i32_of(rows), Arg::Ptr(out)],
        )?;
        Ok(out)
    }

    /// Dequantizes `rows` rows of `w` starting at byte `base` to f16 in [`Buf::W16`] (f16
    /// weights are read in place).
    fn weights_f16(&mut self, w: &DevMatrix, base: u64, rows: usize) -> Result<u64, CudaError> {
        if w.ty == GgmlType::F16 {
            return Ok(base);
        }
        let a = self.buf(Buf::W16, rows * w.k * 2)?;
        let f = &self.kernels(w.ty)?.deq_f16;
        let chunks = rows * w.k / 32;
        self.gpu.launch(
            f,
            (blocks(chunks, 128), 1, 1),
            128,
            0,
            &[
                Arg::Ptr(base),
                Arg::I64(w.row_bytes as i64),
                i32_of(w.k),
                i32_of(rows),
                Arg::Ptr(a),
            ],
        )?;
        Ok(a)
    }

    /// `y[n][rows] = W_e x[n][k]` for expert `e` of `w` (0 for a dense matrix).
    pub fn matmul(
        &mut self,
        w: &DevMatrix,
        expert: usize,
        x: u64,
        n: usize,
        y: u64,
    ) -> Result<(), CudaError> {
        let base = w.buf.at(expert * w.expert_bytes());
        if n <= MMV_MAX {
            let x = self.product_input(w, x.into(), n)?;
            let f = &self.kernels(w.ty)?.mmv;
            let (gx, rpw) = mmv_shape(w, w.rows, w.rows);
            return self.gpu.launch(
                f,
                (gx, 1, 1),
                32 * MMV_WARPS,
                0,
                &[
                    Arg::Ptr(base),
                    Arg::I64(w.row_bytes as i64),
                    i32_of(w.k),
                    i32_of(w.rows),
                    Arg::Ptr(x),
                    i32_of(n),
                    Arg::Ptr(y),
                    Arg::I32(rpw as i32),
                ],
            );
        }
        if w.ty == GgmlType::F32 {
            return self
                .gpu
                .gemm(&Gemm::weights(false, w.rows, n, w.k, base, x, y));
        }
        let b = self.buf(Buf::X16, n * w.k * 2)?;
        self.to_f16(x, b, n * w.k)?;
        // f16 copies of at most W16_PASS_BYTES of rows at a time (a large vocabulary's head
        // would otherwise need a copy of its own)
        let per = (W16_PASS_BYTES / (w.k * 2)).max(1);
        for r0 in (0..w.rows).step_by(per) {
            let rows = per.min(w.rows - r0);
            let a = self.weights_f16(w, base + (r0 * w.row_bytes) as u64, rows)?;
            self.gpu.gemm(&Gemm {
                ldc: w.rows,
                ..Gemm::weights(true, rows, n, w.k, a, b, y + 4 * r0 as u64)
            })?;
        }
        Ok(())
    }

    /// `y_j = W_j x` for the three matrices of `ws` (expert 0 each) over the same `n` input
    /// rows: one launch and one quantization of x when they share a grouped type and row
    /// layout and `n` is a decode product's, else three products.
    pub fn matmul3(
        &mut self,
        ws: [&DevMatrix; 3],
        x: Input,
        n: usize,
        ys: [u64; 3],
    ) -> Result<(), CudaError> {
        let w = ws[0];
        let one = ws
            .iter()
            .all(|m| m.ty == w.ty && m.k == w.k && m.row_bytes == w.row_bytes);
        if !(one && n <= MMV_MAX && grouped(w.ty)) {
            for (m, y) in ws.into_iter().zip(ys) {
                self.matmul(m, 0, x.x, n, y)?;
            }
            return Ok(());
        }
        let x = self.product_input(w, x, n)?;
        let Some(f) = &self.kernels(w.ty)?.mmv3 else {
            return Err(CudaError(format!("no mmv3 kernel for {}", w.ty.name())));
        };
        let rows: usize = ws.iter().map(|m| m.rows).sum();
        let (gx, g) = mmv_shape(w, rows, rows);
        self.gpu.launch(
            f,
            (gx, 1, 1),
            32 * MMV_WARPS,
            0,
            &[
                Arg::Ptr(ws[0].buf.ptr()),
                Arg::Ptr(ws[1].buf.ptr()),
                Arg::Ptr(ws[2].buf.ptr()),
                Arg::I64(w.row_bytes as i64),
                i32_of(w.k),
                i32_of(ws[0].rows),
                i32_of(ws[1].rows),
                i32_of(ws[2].rows),
                Arg::Ptr(x),
                i32_of(n),
                Arg::Ptr(ys[0]),
                Arg::Ptr(ys[1]),
                Arg::Ptr(ys[2]),
                Arg::I32(g as i32),
            ],
        )
    }

    /// Experts `[e0, e0 + count)` of `w`, each on its own group of `m` f16 input rows: the
    /// `j`th of them reads rows `[j m, (j + 1) m)` of `x16` and writes the same rows of `y` (f32,
    /// `w.rows` wide). The experts are dequantized to f16 together, so callers keep `count` to
    /// [`Cuda::experts_per_pass`].
    pub fn matmul_experts(
        &mut self,
        w: &DevMatrix,
        e0: usize,
        count: usize,
        x16: u64,
        m: usize,
        y: u64,
    ) -> Result<(), CudaError> {
        let a = self.weights_f16(w, w.buf.at(e0 * w.expert_bytes()), w.rows * count)?;
        self.gpu.gemm(&Gemm {
            stride_a: w.rows * w.k,
            stride_b: m * w.k,
            stride_c: m * w.rows,
            batch: count,
            ..Gemm::weights(true, w.rows, m, w.k, a, x16, y)
        })
    }

    /// How many experts of `w` one [`Cuda::matmul_experts`] should take, so their f16 copy
    /// stays within [`W16_PASS_BYTES`].
    pub fn experts_per_pass(w: &DevMatrix) -> usize {
        (W16_PASS_BYTES / (w.rows * w.k * 2).max(1)).max(1)
    }

    /// For each pair `p < pairs`: `y[p] = W_{ids[p]} x[p / x_div]` (mixture-of-experts decode).
    pub fn matmul_id(
        &mut self,
        w: &DevMatrix,
        ids: u64,
        x: u64,
        x_div: usize,
        pairs: usize,
        y: u64,
    ) -> Result<(), CudaError> {
        let x = self.product_input(w, x.into(), pairs.div_ceil(x_div))?;
        let f = &self.kernels(w.ty)?.mmv_id;
        let (gx, rpw) = mmv_shape(w, w.rows, w.rows * pairs);
        self.gpu.launch(
            f,
            (gx, pairs as u32, 1),
            32 * MMV_WARPS,
            0,
            &[
                Arg::Ptr(w.buf.ptr()),
                Arg::I64(w.row_bytes as i64),
                Arg::I64(w.expert_bytes() as i64),
                i32_of(w.k),
                i32_of(w.rows),
                Arg::Ptr(ids),
                Arg::Ptr(x),
                i32_of(x_div),
                Arg::Ptr(y),
                Arg::I32(rpw as i32),
            ],
        )
    }

    /// For each pair `p < pairs`: `g[p] = act(G_{ids[p]} x[p / x_div]) * U_{ids[p]} x[p / x_div]`
    /// (the gated half of a mixture-of-experts FFN in decode), in one kernel when gate and up
    /// share a layout; `u` is scratch for the other way.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_id_glu(
        &mut self,
        [gate, up]: [&DevMatrix; 2],
        ids: u64,
        x: Input,
        x_div: usize,
        pairs: usize,
        [g, u]: [u64; 2],
        gelu: bool,
    ) -> Result<(), CudaError> {
        if gate.ty != up.ty || gate.row_bytes != up.row_bytes || gate.rows != up.rows {
            self.matmul_id(gate, ids, x.x, x_div, pairs, g)?;
            self.matmul_id(up, ids, x.x, x_div, pairs, u)?;
            return self.glu(g, u, pairs * gate.rows, gelu);
        }
        let x = self.product_input(gate, x, pairs.div_ceil(x_div))?;
        let f = &self.kernels(gate.ty)?.mmv_id_glu;
        let (gx, rpw) = mmv_shape(gate, gate.rows, gate.rows * pairs);
        self.gpu.launch(
            f,
            (gx, pairs as u32, 1),
            32 * MMV_WARPS,
            0,
            &[
                Arg::Ptr(gate.buf.ptr()),
                Arg::Ptr(up.buf.ptr()),
                Arg::I64(gate.row_bytes as i64),
                Arg::I64(gate.expert_bytes() as i64),
                i32_of(gate.k),
                i32_of(gate.rows),
                Arg::Ptr(ids),
                Arg::Ptr(x),
                i32_of(x_div),
                Arg::I32(gelu as i32),
                Arg::Ptr(g),
                Arg::I32(rpw as i32),
            ],
        )
    }

    /// `out[t] = W[ids[t]]` as f32 (embedding lookups).
    pub fn get_rows(&self, w: &DevMatrix, ids: u64, n: usize, out: u64) -> Result<(), CudaError> {
        let f = &self.kernels(w.ty)?.get_rows;
        self.gpu.launch(
            f,
            (blocks(w.k / 32, 64), n as u32, 1),
            64,
            0,
            &[
                Arg::Ptr(w.buf.ptr()),
                Arg::I64(w.row_bytes as i64),
                i32_of(w.k),
                Arg::Ptr(ids),
                Arg::Ptr(out),
            ],
        )
    }

    pub fn rms_norm(
        &self,
        x: u64,
        w: u64,
        out: u64,
        rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        self.add_rms_norm(x, 0, w, out, 0, rows, width, eps)?;
        Ok(())
    }

    /// `x += add` (when `add` is not 0), then `out = rms_norm(x) * w`, in one launch. With `xq`
    /// (not 0, [`Cuda::quantized_x_bytes`] of the rows) and rows [`norm_quantizes`] takes, the
    /// rows are also quantized there for the decode products; the returned input says whether.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm(
        &self,
        x: u64,
        add: u64,
        w: u64,
        out: u64,
        xq: u64,
        rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<Input, CudaError> {
        let xq = if norm_quantizes(rows, width) { xq } else { 0 };
        self.gpu.launch(
            &self.f.rms_norm,
            (rows as u32, 1, 1),
            256,
            0,
            &[
                Arg::Ptr(x),
                Arg::Ptr(add),
                Arg::Ptr(w),
                Arg::Ptr(out),
                i32_of(width),
                Arg::F32(eps),
                Arg::Ptr(xq),
            ],
        )?;
        Ok(Input {
            x: out,
            q8: (xq != 0).then_some(xq),
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: u64,
        pos: u64,
        n: usize,
        heads: usize,
        hd: usize,
        n_rot: usize,
        base: f32,
        freq_scale: f32,
        neox: bool,
    ) -> Result<(), CudaError> {
        self.gpu.launch(
            &self.f.rope,
            (heads as u32, n as u32, 1),
            64,
            0,
            &[
                Arg::Ptr(x),
                Arg::Ptr(pos),
                i32_of(heads),
                i32_of(hd),
                i32_of(n_rot),
                Arg::F32(base),
                Arg::F32(freq_scale),
                Arg::I32(neox as i32),
            ],
        )
    }

    fn elementwise(&self, f: &CudaFunction, n: usize, args: &[Arg]) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        self.gpu.launch(f, (blocks(n, 256), 1, 1), 256, 0, args)
    }

    /// A kernel with one thread per element of `n` rows of `width`, in blocks of 256 across a
    /// row; rows on grid.y, or on grid.x when `rows_in_x` (grid.y stops at 65535 and a padded
    /// expert group can be longer).
    fn per_row(
        &self,
        f: &CudaFunction,
        width: usize,
        n: usize,
        rows_in_x: bool,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        let (across, rows) = (blocks(width, 256), n as u32);
        let grid = if rows_in_x {
            (rows, across, 1)
        } else {
            (across, rows, 1)
        };
        self.gpu.launch(f, grid, 256, 0, args)
    }

    /// `x += y` over `n` floats.
    pub fn add(&self, x: u64, y: u64, n: usize) -> Result<(), CudaError> {
        self.elementwise(
            &self.f.add,
            n,
            &[Arg::Ptr(x), Arg::Ptr(y), Arg::I64(n as i64)],
        )
    }

    pub fn add_bias(&self, x: u64, b: u64, width: usize, n: usize) -> Result<(), CudaError> {
        self.elementwise(
            &self.f.add_bias,
            n,
            &[Arg::Ptr(x), Arg::Ptr(b), i32_of(width), Arg::I64(n as i64)],
        )
    }

    pub fn scale(&self, x: u64, s: f32, n: usize) -> Result<(), CudaError> {
        self.elementwise(
            &self.f.scale,
            n,
            &[Arg::Ptr(x), Arg::F32(s), Arg::I64(n as i64)],
        )
    }

    pub fn softcap(&self, x: u64, cap: f32, n: usize) -> Result<(), CudaError> {
        self.elementwise(
            &self.f.softcap,
            n,
            &[Arg::Ptr(x), Arg::F32(cap), Arg::I64(n as i64)],
        )
    }

    /// `g = act(g) * u`.
    pub fn glu(&self, g: u64, u: u64, n: usize, gelu: bool) -> Result<(), CudaError> {
        self.elementwise(
            &self.f.glu,
            n,
            &[
                Arg::Ptr(g),
                Arg::Ptr(u),
                Arg::I64(n as i64),
                Arg::I32(gelu as i32),
            ],
        )
    }

    pub fn to_f16(&self, x: u64, out: u64, n: usize) -> Result<(), CudaError> {
        self.elementwise(
            &self.f.to_f16,
            n,
            &[Arg::Ptr(x), Arg::Ptr(out), Arg::I64(n as i64)],
        )
    }

    /// Row `t` of `src` into cache cell `cells[t]` as f16.
    /// The end of attention's projections for `n` tokens in one launch (`attn_prologue` in
    /// kernels/ops.cu): query and key heads normalized by `qn` / `kn` when given (0 when not),
    /// RoPE on both, queries scaled by `q_scale` in place, keys and values stored into their
    /// cells of the f16 caches.
    #[allow(clippy::too_many_arguments)]
    pub fn attn_prologue(
        &self,
        [q, k, v]: [u64; 3],
        [qn, kn]: [u64; 2],
        [pos, cells]: [u64; 2],
        [k_cache, v_cache]: [u64; 2],
        n: usize,
        (hq, hkv): (usize, usize),
        (hd, hv): (usize, usize),
        n_rot: usize,
        (base, freq_scale): (f32, f32),
        neox: bool,
        eps: f32,
        q_scale: f32,
    ) -> Result<(), CudaError> {
        if hd > MAX_HEAD_DIM || hd % 2 != 0 || n_rot > hd {
            return Err(CudaError(format!(
                "attention heads of {hd} (rotating {n_rot}) are not supported on the card"
            )));
        }
        self.gpu.launch(
            &self.f.attn_prologue,
            ((hq + 2 * hkv) as u32, n as u32, 1),
            128,
            0,
            &[
                Arg::Ptr(q),
                Arg::Ptr(k),
                Arg::Ptr(v),
                Arg::Ptr(qn),
                Arg::Ptr(kn),
                Arg::Ptr(pos),
                Arg::Ptr(cells),
                Arg::Ptr(k_cache),
                Arg::Ptr(v_cache),
                i32_of(hq),
                i32_of(hkv),
                i32_of(hd),
                i32_of(hv),
                i32_of(n_rot),
                Arg::F32(base),
                Arg::F32(freq_scale),
                Arg::I32(neox as i32),
                Arg::F32(eps),
                Arg::F32(q_scale),
            ],
        )
    }

    pub fn kv_store(
        &self,
        src: u64,
        cache: u64,
        cells: u64,
        width: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        self.per_row(
            &self.f.kv_store,
            width,
            n,
            false,
            &[
                Arg::Ptr(src),
                Arg::Ptr(cache),
                Arg::Ptr(cells),
                i32_of(width),
            ],
        )
    }

    /// Moves `n` rows of `width` between `x` and `out` through the index list `idx` (see
    /// [`RowMove`]).
    pub fn move_rows(
        &self,
        how: RowMove,
        x: u64,
        idx: u64,
        out: u64,
        width: usize,
        n: usize,
    ) -> Result<(), CudaError> {
        let (f, rows_in_x) = match how {
            RowMove::Gather => (&self.f.gather_rows, false),
            RowMove::Scatter => (&self.f.scatter_rows, true),
            RowMove::GatherF16 => (&self.f.gather_f16, true),
        };
        self.per_row(
            f,
            width,
            n,
            rows_in_x,
            &[Arg::Ptr(x), Arg::Ptr(idx), Arg::Ptr(out), i32_of(width)],
        )
    }

    /// Attention of `m` consecutive query tokens of one sequence (positions `p0..p0 + m`, its
    /// cache rows starting at cell `base`) through cuBLAS: per KV group, the scores of its heads
    /// in one batched product, a masked softmax, then the weighted values the same way; queries
    /// in passes small enough that a group's scores stay within [`ATTN_PASS_BYTES`].
    #[allow(clippy::too_many_arguments)]
    pub fn attention_prompt(
        &mut self,
        q: u64,
        kc: u64,
        vc: u64,
        out: u64,
        base: usize,
        p0: usize,
        m: usize,
        (n_head, n_head_kv): (usize, usize),
        (hk, hv): (usize, usize),
        scale: f32,
        n_swa: u32,
    ) -> Result<(), CudaError> {
        let gs = n_head / n_head_kv;
        let (kstride, vstride) = (n_head_kv * hk, n_head_kv * hv);
        // queries in passes whose scores and probabilities (6 bytes per score) of one KV
        // group's heads stay within ATTN_PASS_BYTES
        let per = (ATTN_PASS_BYTES / (gs * (p0 + m) * 6)).clamp(1, m);
        for i0 in (0..m).step_by(per) {
            let (q, out, p0, m) = (
                q + 4 * (i0 * n_head * hk) as u64,
                out + 4 * (i0 * n_head * hv) as u64,
                p0 + i0,
                per.min(m - i0),
            );
            let kv_len = p0 + m;
            let q16 = self.buf(Buf::Q16, m * n_head * hk * 2)?;
            // one KV group at a time, so the scores take a group's heads, not all of them
            let scores = self.buf(Buf::Scores, gs * m * kv_len * 4)?;
            let probs = self.buf(Buf::Probs, gs * m * kv_len * 2)?;
            self.to_f16(q, q16, m * n_head * hk)?;
            for g in 0..n_head_kv {
                let h0 = g * gs;
                self.gpu.gemm(&Gemm {
                    half: true,
                    trans_a: true,
                    m: kv_len,
                    n: m,
                    k: hk,
                    a: kc + 2 * (base * kstride + g * hk) as u64,
                    lda: kstride,
                    stride_a: 0,
                    b: q16 + 2 * (h0 * hk) as u64,
                    ldb: n_head * hk,
                    stride_b: hk,
                    c: scores,
                    ldc: kv_len,
                    stride_c: m * kv_len,
                    batch: gs,
                })?;
                self.gpu.launch(
                    &self.f.softmax_rows,
                    ((gs * m) as u32, 1, 1),
                    256,
                    0,
                    &[
                        Arg::Ptr(scores),
                        Arg::Ptr(probs),
                        i32_of(kv_len),
                        i32_of(p0),
                        i32_of(m),
                        Arg::F32(scale),
                        Arg::I32(n_swa as i32),
                    ],
                )?;
                self.gpu.gemm(&Gemm {
                    half: true,
                    trans_a: false,
                    m: hv,
                    n: m,
                    k: kv_len,
                    a: vc + 2 * (base * vstride + g * hv) as u64,
                    lda: vstride,
                    stride_a: 0,
                    b: probs,
                    ldb: kv_len,
                    stride_b: m * kv_len,
                    c: out + 4 * (h0 * hv) as u64,
                    ldc: n_head * hv,
                    stride_c: hv,
                    batch: gs,
                })?;
            }
        }
        Ok(())
    }

    /// Top-`k` experts of each of `n` tokens from router logits `[n][ne]`: ids and weights
    /// `[n][k]`.
    #[allow(clippy::too_many_arguments)]
    pub fn route(
        &self,
        logits: u64,
        n: usize,
        ne: usize,
        k: usize,
        norm: bool,
        scale: f32,
        ids: u64,
        w: u64,
    ) -> Result<(), CudaError> {
        self.gpu.launch(
            &self.f.route,
            (n as u32, 1, 1),
            32,
            0,
            &[
                Arg::Ptr(logits),
                i32_of(ne),
                i32_of(k),
                Arg::I32(norm as i32),
                Arg::F32(scale),
                Arg::Ptr(ids),
                Arg::Ptr(w),
            ],
        )
    }

    /// `out[t] = sum_s w[t k + s] y[t k + s]`.
    /// `out[t] (+)= sum_s w[t k + s] y[t k + s]`: added to `out` when `accumulate`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &self,
        y: u64,
        w: u64,
        out: u64,
        accumulate: bool,
        n: usize,
        k: usize,
        width: usize,
    ) -> Result<(), CudaError> {
        self.per_row(
            &self.f.moe_combine,
            width,
            n,
            false,
            &[
                Arg::Ptr(y),
                Arg::Ptr(w),
                Arg::Ptr(out),
                i32_of(k),
                i32_of(width),
                Arg::I32(accumulate as i32),
            ],
        )
    }

    /// Attention of `n` query tokens over one layer's f16 cache (see kernels/attention.cu).
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        q: u64,
        kc: u64,
        vc: u64,
        base: u64,
        pos: u64,
        out: u64,
        n: usize,
        heads: (usize, usize),
        dims: (usize, usize),
        scale: f32,
        n_swa: u32,
    ) -> Result<(), CudaError> {
        self.gpu.launch(
            &self.f.attn,
            (heads.0 as u32, n as u32, 1),
            128,
            0,
            &[
                Arg::Ptr(q),
                Arg::Ptr(kc),
                Arg::Ptr(vc),
                Arg::Ptr(base),
                Arg::Ptr(pos),
                Arg::Ptr(out),
                i32_of(heads.0),
                i32_of(heads.1),
                i32_of(dims.0),
                i32_of(dims.1),
                Arg::F32(scale),
                Arg::I32(n_swa as i32),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_products_give_each_thread_about_the_items_asked_for() {
        // one item a thread: up to 32 items one warp, up to 64 two, else four
        for (items, g) in [
            (1, 1),
            (32, 1),
            (33, 2),
            (64, 2),
            (65, 4),
            (128, 4),
            (256, 4),
        ] {
            assert_eq!(warps_for(items, 1), g, "{items} items");
        }
        // k = 768 (48 items), 2048 (128) and 4096 (256) at two and four items a thread
        assert_eq!(warps_for(48, 2), 1);
        assert_eq!(warps_for(128, 2), 2);
        assert_eq!(warps_for(256, 2), 4);
        assert_eq!(warps_for(128, 4), 1);
        assert_eq!(warps_for(256, 4), 2);
        assert_eq!(warps_for(256, 0), 4);
    }
}
