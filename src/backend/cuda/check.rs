//! Every kernel against a CPU reference on fresh random data: dequantization and products for
//! each weight type (references from `model::quants`, computed in f64), norms, RoPE, GLU,
//! routing and attention. `bloomery-gpu-check` runs these on the card; the error measure and the
//! reference functions are tested here on the CPU.

use super::device::CudaError;
use super::ops::{Cuda, TYPES};
use crate::model::quants::{dequantize, f16_to_f32, f32_to_f16};
use crate::model::synthetic::random_blocks;
use crate::model::GgmlType;

/// One check's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    pub rel_err: f64,
    pub limit: f64,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.rel_err <= self.limit
    }
}

/// `|out - ref| / |ref|` over the whole vectors; any non-finite output is an infinite error.
pub fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    if out.len() != reference.len() || out.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = out
        .iter()
        .zip(reference)
        .map(|(&o, &r)| (o as f64 - r).powi(2))
        .sum();
    let den: f64 = reference.iter().map(|r| r * r).sum();
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (num / den).sqrt()
}

/// A small deterministic generator for test inputs (normal-ish values from 4 uniforms).
pub struct Rand(u64);

impl Rand {
    pub fn new(seed: u64) -> Rand {
        Rand(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn normal(&mut self) -> f32 {
        let s: f64 = (0..4)
            .map(|_| (self.next() >> 11) as f64 / (1u64 << 53) as f64)
            .sum();
        ((s - 2.0) * 3f64.sqrt()) as f32
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Reference RMS norm in f64.
pub fn ref_rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let width = w.len();
    x.chunks_exact(width)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / width as f64;
            let s = 1.0 / (ms + eps as f64).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&v, &g)| v as f64 * s * g as f64)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Reference RoPE in f64 on rows of `hd` (heads of all tokens; `pos` per row).
pub fn ref_rope(
    x: &[f32],
    pos: &[i32],
    hd: usize,
    n_rot: usize,
    base: f32,
    neox: bool,
) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (row, &p) in out.chunks_exact_mut(hd).zip(pos) {
        for i in 0..n_rot / 2 {
            let theta = p as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
            let (s, c) = theta.sin_cos();
            let (a, b) = if neox {
                (i, i + n_rot / 2)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (row[a], row[b]);
            row[a] = x0 * c - x1 * s;
            row[b] = x0 * s + x1 * c;
        }
    }
    out
}

/// Reference attention of one query over keys/values (already rounded as the cache holds them).
pub fn ref_attend(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], scale: f32) -> Vec<f64> {
    let scores: Vec<f64> = keys
        .iter()
        .map(|k| {
            q.iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                * scale as f64
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let total: f64 = e.iter().sum();
    let mut out = vec![0.0; values[0].len()];
    for (v, w) in values.iter().zip(&e) {
        for (o, &x) in out.iter_mut().zip(v) {
            *o += w / total * x as f64;
        }
    }
    out
}

/// The input a decode product over `ty` weights computes with: for Q4_K and Q8_0, `x` rounded
/// to 8 bits per value with one f32 scale per 32 values (`quantize_x` in kernels/matvec.cu),
/// else `x`.
fn product_x(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    if !super::ops::reads_q8(ty) {
        return x.to_vec();
    }
    x.chunks(32)
        .flat_map(|c| {
            let d = c.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            c.iter().map(move |&v| {
                if d == 0.0 {
                    0.0
                } else {
                    (v / d).round_ties_even() * d
                }
            })
        })
        .collect()
}

/// act(g) * u: SiLU, or GELU's tanh form.
fn ref_glu(g: f64, u: f64, gelu: bool) -> f64 {
    let act = if gelu {
        0.5 * g * (1.0 + (0.797_884_560_8 * g * (1.0 + 0.044715 * g * g)).tanh())
    } else {
        g / (1.0 + (-g).exp())
    };
    act * u
}

fn up(c: &Cuda, v: &[f32]) -> Result<super::DevBuf, CudaError> {
    c.upload_f32(v)
}

fn down(c: &Cuda, ptr: u64, n: usize) -> Result<Vec<f32>, CudaError> {
    let mut v = vec![f32::NAN; n];
    c.gpu.download(&mut v, ptr)?;
    Ok(v)
}

/// An output buffer poisoned with NaN, so an element no kernel wrote fails the check.
fn poisoned(c: &Cuda, n: usize) -> Result<super::DevBuf, CudaError> {
    up(c, &vec![f32::NAN; n])
}

fn matvec_ref(w: &[f32], k: usize, x: &[f32]) -> Vec<f64> {
    let rows = w.len() / k;
    x.chunks_exact(k)
        .flat_map(|xc| {
            (0..rows).map(move |r| {
                w[r * k..(r + 1) * k]
                    .iter()
                    .zip(xc)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
            })
        })
        .collect()
}

/// Runs every check once with inputs drawn from `seed`.
pub fn run(c: &mut Cuda, seed: u64) -> Result<Vec<Outcome>, CudaError> {
    let mut out = Vec::new();
    let mut rng = Rand::new(seed | 1);
    let (rows, ne) = (67usize, 3usize);
    for &ty in TYPES {
        // rows of more than one span of the products' staged copies (128 chunks at most), the
        // last span partial, and (for the 32-element formats) rows that start at odd addresses
        let k = match ty.block_size() {
            32 => 4128,
            64 => 4160,
            _ => 4352,
        };
        let n_all = rows * k * ne;
        let data = random_blocks(ty, n_all, seed ^ ty.id() as u64, 0.05)
            .map_err(|e| CudaError(format!("random {} blocks: {e}", ty.name())))?;
        let mut w = vec![0f32; n_all];
        dequantize(ty, &data, &mut w).map_err(|e| CudaError(e.to_string()))?;
        let mat = c.upload_matrix(&data, ty, k, rows, ne)?;
        let name = ty.name();
        // embedding rows
        let ids = [2i32, 0, (rows * ne - 1) as i32];
        let ids_d = c.gpu.alloc(12)?;
        c.gpu.upload(ids_d.ptr(), &ids)?;
        let o = poisoned(c, 3 * k)?;
        c.get_rows(&mat, ids_d.ptr(), 3, o.ptr())?;
        let reference: Vec<f64> = ids
            .iter()
            .flat_map(|&r| {
                w[r as usize * k..(r as usize + 1) * k]
                    .iter()
                    .map(|&v| v as f64)
            })
            .collect();
        out.push(Outcome {
            name: format!("get_rows {name}"),
            rel_err: rel_err(&down(c, o.ptr(), 3 * k)?, &reference),
            limit: 1e-6,
        });
        // products with expert 1, through both paths
        let we = &w[rows * k..2 * rows * k];
        for n in [1usize, 3, 8, 37] {
            let x = rng.vec(n * k);
            let xd = up(c, &x)?;
            let y = poisoned(c, n * rows)?;
            c.matmul(&mat, 1, xd.ptr(), n, y.ptr())?;
            let xp = if n <= super::ops::MMV_MAX {
                product_x(ty, &x)
            } else {
                x.clone()
            };
            out.push(Outcome {
                name: format!("matmul {name} n={n}"),
                rel_err: rel_err(&down(c, y.ptr(), n * rows)?, &matvec_ref(we, k, &xp)),
                // f16 operands on the tensor-core path
                limit: if n > super::ops::MMV_MAX { 3e-3 } else { 1e-5 },
            });
        }
        // three matrices over one input in one launch (a layer's q, k and v): experts 0 and 2
        // whole and the first 30 rows of expert 1
        if super::ops::grouped(ty) {
            let rb = mat.row_bytes;
            let e = rows * rb;
            let parts = [(0, rows), (e, 30), (2 * e, rows)];
            let ms = parts
                .iter()
                .map(|&(at, r)| c.upload_matrix(&data[at..at + r * rb], ty, k, r, 1))
                .collect::<Result<Vec<_>, _>>()?;
            for n in [1usize, 3] {
                let x = rng.vec(n * k);
                let xd = up(c, &x)?;
                let ys = parts
                    .iter()
                    .map(|&(_, r)| poisoned(c, n * r))
                    .collect::<Result<Vec<_>, _>>()?;
                c.matmul3(
                    [&ms[0], &ms[1], &ms[2]],
                    xd.ptr().into(),
                    n,
                    [ys[0].ptr(), ys[1].ptr(), ys[2].ptr()],
                )?;
                let xp = product_x(ty, &x);
                let (mut got, mut reference) = (Vec::new(), Vec::new());
                for (j, &(_, r)) in parts.iter().enumerate() {
                    got.extend(down(c, ys[j].ptr(), n * r)?);
                    let first = j * rows * k;
                    reference.extend(matvec_ref(&w[first..first + r * k], k, &xp));
                }
                out.push(Outcome {
                    name: format!("matmul3 {name} n={n}"),
                    rel_err: rel_err(&got, &reference),
                    limit: 1e-5,
                });
            }
        }
        // every expert from the second on its own group of rows, in one batched product
        let (m, count) = (5, ne - 1);
        let x = rng.vec(count * m * k);
        let xd = up(c, &x)?;
        let x16 = c.gpu.alloc(x.len() * 2)?;
        c.to_f16(xd.ptr(), x16.ptr(), x.len())?;
        let y = poisoned(c, count * m * rows)?;
        c.matmul_experts(&mat, 1, count, x16.ptr(), m, y.ptr())?;
        let reference: Vec<f64> = (0..count)
            .flat_map(|j| {
                let we = &w[(j + 1) * rows * k..(j + 2) * rows * k];
                matvec_ref(we, k, &x[j * m * k..(j + 1) * m * k])
            })
            .collect();
        out.push(Outcome {
            name: format!("matmul_experts {name}"),
            rel_err: rel_err(&down(c, y.ptr(), count * m * rows)?, &reference),
            limit: 3e-3,
        });
        // expert rows by id: 5 pairs, each its own input row
        let pairs = 5;
        let eids: Vec<i32> = (0..pairs).map(|_| rng.below(ne) as i32).collect();
        let x = rng.vec(pairs * k);
        let (xd, idd, y) = (
            up(c, &x)?,
            c.gpu.alloc(4 * pairs)?,
            poisoned(c, pairs * rows)?,
        );
        c.gpu.upload(idd.ptr(), &eids)?;
        c.matmul_id(&mat, idd.ptr(), xd.ptr(), 1, pairs, y.ptr())?;
        let x = product_x(ty, &x);
        let reference: Vec<f64> = eids
            .iter()
            .enumerate()
            .flat_map(|(p, &e)| {
                let we = &w[e as usize * rows * k..(e as usize + 1) * rows * k];
                matvec_ref(we, k, &x[p * k..(p + 1) * k])
            })
            .collect();
        out.push(Outcome {
            name: format!("matmul_id {name}"),
            rel_err: rel_err(&down(c, y.ptr(), pairs * rows)?, &reference),
            limit: 1e-5,
        });
        // gate and up rows by id in one kernel: the two experts' matrices are `mat` and the
        // same blocks shifted by one expert, x shared by every pair of a token (x_div 2)
        let gu: Vec<i32> = (0..pairs).map(|_| rng.below(ne - 1) as i32).collect();
        c.gpu.upload(idd.ptr(), &gu)?;
        let shifted = c.upload_matrix(&data[data.len() / ne..], ty, k, rows, ne - 1)?;
        let (g, u) = (poisoned(c, pairs * rows)?, poisoned(c, pairs * rows)?);
        for gelu in [false, true] {
            c.matmul_id_glu(
                [&mat, &shifted],
                idd.ptr(),
                xd.ptr().into(),
                2,
                pairs,
                [g.ptr(), u.ptr()],
                gelu,
            )?;
            let reference: Vec<f64> = gu
                .iter()
                .enumerate()
                .flat_map(|(p, &e)| {
                    let e = e as usize;
                    let xr = &x[(p / 2) * k..(p / 2 + 1) * k];
                    let gate = matvec_ref(&w[e * rows * k..(e + 1) * rows * k], k, xr);
                    let upv = matvec_ref(&w[(e + 1) * rows * k..(e + 2) * rows * k], k, xr);
                    gate.into_iter()
                        .zip(upv)
                        .map(move |(a, b)| ref_glu(a, b, gelu))
                })
                .collect();
            out.push(Outcome {
                name: format!(
                    "matmul_id_glu {name} {}",
                    if gelu { "gelu" } else { "silu" }
                ),
                rel_err: rel_err(&down(c, g.ptr(), pairs * rows)?, &reference),
                limit: 1e-5,
            });
        }
    }
    out.extend(ops(c, &mut rng)?);
    Ok(out)
}

fn ops(c: &mut Cuda, rng: &mut Rand) -> Result<Vec<Outcome>, CudaError> {
    let mut out = Vec::new();
    // RMS norm, out of place and in place; rows held in registers (up to 16 values a thread)
    // and wider ones
    for (rows, width) in [(5, 640), (1, 2048), (3, 5000)] {
        let (x, w) = (rng.vec(rows * width), rng.vec(width));
        let (xd, wd, o) = (up(c, &x)?, up(c, &w)?, poisoned(c, rows * width)?);
        c.rms_norm(xd.ptr(), wd.ptr(), o.ptr(), rows, width, 1e-6)?;
        let reference = ref_rms_norm(&x, &w, 1e-6);
        out.push(Outcome {
            name: format!("rms_norm {rows} x {width}"),
            rel_err: rel_err(&down(c, o.ptr(), rows * width)?, &reference),
            limit: 1e-6,
        });
        c.rms_norm(xd.ptr(), wd.ptr(), xd.ptr(), rows, width, 1e-6)?;
        out.push(Outcome {
            name: format!("rms_norm {rows} x {width} in place"),
            rel_err: rel_err(&down(c, xd.ptr(), rows * width)?, &reference),
            limit: 1e-6,
        });
    }
    // the residual sum and the norm in one launch, and the normalized rows quantized there
    // (when they fit: not 5000 wide)
    for (rows, width) in [(1, 2048), (3, 4096), (3, 5000)] {
        let (x, a, w) = (rng.vec(rows * width), rng.vec(rows * width), rng.vec(width));
        let (xd, ad, wd, o) = (
            up(c, &x)?,
            up(c, &a)?,
            up(c, &w)?,
            poisoned(c, rows * width)?,
        );
        let xq = c.gpu.alloc(Cuda::quantized_x_bytes(rows, width))?;
        let input = c.add_rms_norm(
            xd.ptr(),
            ad.ptr(),
            wd.ptr(),
            o.ptr(),
            xq.ptr(),
            rows,
            width,
            1e-6,
        )?;
        if let Some(q8) = input.q8 {
            // quantize_x's rounding of the rows the kernel wrote, compared exactly
            let normed = down(c, o.ptr(), rows * width)?;
            let stride = Cuda::quantized_x_bytes(1, width);
            let mut bytes = vec![0u8; rows * stride];
            c.gpu.download(&mut bytes, q8)?;
            let (mut got, mut want) = (Vec::new(), Vec::new());
            for (r, row) in normed.chunks(width).enumerate() {
                let qrow = &bytes[r * stride..(r + 1) * stride];
                for (ci, chunk) in row.chunks(32).enumerate() {
                    let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = amax / 127.0;
                    let qs: Vec<f32> = chunk
                        .iter()
                        .map(|&v| {
                            if amax == 0.0 {
                                0.0
                            } else {
                                (v / d).round_ties_even()
                            }
                        })
                        .collect();
                    let sum: f32 = qs.iter().sum();
                    want.extend(qs.iter().map(|&q| q as f64));
                    want.extend([d as f64, (d * sum) as f64]);
                    got.extend(qrow[32 * ci..32 * ci + 32].iter().map(|&b| b as i8 as f32));
                    let at = width + 8 * ci;
                    let f = |o: usize| f32::from_le_bytes(qrow[o..o + 4].try_into().unwrap());
                    got.extend([f(at), f(at + 4)]);
                }
            }
            out.push(Outcome {
                name: format!("add_rms_norm {rows} x {width} quantized"),
                rel_err: rel_err(&got, &want),
                limit: 0.0,
            });
        } else if width <= 4096 {
            out.push(Outcome {
                name: format!("add_rms_norm {rows} x {width}: no quantized rows"),
                rel_err: f64::INFINITY,
                limit: 0.0,
            });
        }
        let sum: Vec<f32> = x.iter().zip(&a).map(|(p, q)| p + q).collect();
        out.push(Outcome {
            name: format!("add_rms_norm {rows} x {width}"),
            rel_err: rel_err(
                &down(c, o.ptr(), rows * width)?,
                &ref_rms_norm(&sum, &w, 1e-6),
            ),
            limit: 1e-6,
        });
        let exact: Vec<f64> = sum.iter().map(|&v| v as f64).collect();
        out.push(Outcome {
            name: format!("add_rms_norm {rows} x {width} sum"),
            rel_err: rel_err(&down(c, xd.ptr(), rows * width)?, &exact),
            limit: 0.0,
        });
    }
    out.extend(prologue_checks(c, rng)?);
    // RoPE, both layouts, partial rotation
    let (n, heads, hd) = (3, 4, 128);
    let pos = [0i32, 7, 1000];
    let pd = c.gpu.alloc(12)?;
    c.gpu.upload(pd.ptr(), &pos)?;
    for (neox, n_rot) in [(true, 128), (false, 128), (true, 64)] {
        let x = rng.vec(n * heads * hd);
        let xd = up(c, &x)?;
        c.rope(xd.ptr(), pd.ptr(), n, heads, hd, n_rot, 10000.0, 1.0, neox)?;
        let row_pos: Vec<i32> = pos.iter().flat_map(|&p| [p; 4]).collect();
        out.push(Outcome {
            name: format!("rope neox={neox} n_rot={n_rot}"),
            rel_err: rel_err(
                &down(c, xd.ptr(), x.len())?,
                &ref_rope(&x, &row_pos, hd, n_rot, 10000.0, neox),
            ),
            limit: 1e-4,
        });
    }
    // GLU
    for gelu in [false, true] {
        let (g, u) = (rng.vec(1000), rng.vec(1000));
        let (gd, ud) = (up(c, &g)?, up(c, &u)?);
        c.glu(gd.ptr(), ud.ptr(), 1000, gelu)?;
        let reference: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&a, &b)| ref_glu(a as f64, b as f64, gelu))
            .collect();
        out.push(Outcome {
            name: format!("glu {}", if gelu { "gelu" } else { "silu" }),
            rel_err: rel_err(&down(c, gd.ptr(), 1000)?, &reference),
            limit: 1e-5,
        });
    }
    // top-k as Qwen3-MoE routes, and more choices than a warp has lanes
    out.push(route_check(c, rng, 128, 8)?);
    out.push(route_check(c, rng, 160, 40)?);
    out.extend(attention_checks(c, rng)?);
    Ok(out)
}

/// `attn_prologue` against norm, RoPE, scale and f16 rounding in turn: 3 tokens at positions 0,
/// 7 and 1000 stored into cells 5, 0 and 3 of an 8-cell cache.
fn prologue_checks(c: &mut Cuda, rng: &mut Rand) -> Result<Vec<Outcome>, CudaError> {
    let mut out = Vec::new();
    let (n, hq, hkv, cells_n) = (3usize, 4usize, 2usize, 8usize);
    let (pos, cells) = ([0i32, 7, 1000], [5i32, 0, 3]);
    let (pd, cd) = (c.gpu.alloc(12)?, c.gpu.alloc(12)?);
    c.gpu.upload(pd.ptr(), &pos)?;
    c.gpu.upload(cd.ptr(), &cells)?;
    for (hd, hv, n_rot, neox, normed) in [
        (128, 128, 128, true, true),
        (256, 256, 256, false, true),
        (64, 96, 32, true, false),
    ] {
        let (q, k, v) = (
            rng.vec(n * hq * hd),
            rng.vec(n * hkv * hd),
            rng.vec(n * hkv * hv),
        );
        let (qn, kn) = (rng.vec(hd), rng.vec(hd));
        let (qd, kd, vd) = (up(c, &q)?, up(c, &k)?, up(c, &v)?);
        let (qnd, knd) = (up(c, &qn)?, up(c, &kn)?);
        let kc = c.gpu.alloc(2 * cells_n * hkv * hd)?;
        let vc = c.gpu.alloc(2 * cells_n * hkv * hv)?;
        let q_scale = 0.125f32;
        let norms = if normed {
            [qnd.ptr(), knd.ptr()]
        } else {
            [0, 0]
        };
        c.attn_prologue(
            [qd.ptr(), kd.ptr(), vd.ptr()],
            norms,
            [pd.ptr(), cd.ptr()],
            [kc.ptr(), vc.ptr()],
            n,
            (hq, hkv),
            (hd, hv),
            n_rot,
            (10000.0, 1.0),
            neox,
            1e-6,
            q_scale,
        )?;
        // the reference: per-head norm, then RoPE at each row's position
        let heads = |x: &[f32], h: usize, nw: &[f32]| -> Vec<f64> {
            let normed_x: Vec<f32> = if normed {
                ref_rms_norm(x, nw, 1e-6)
                    .iter()
                    .map(|&v| v as f32)
                    .collect()
            } else {
                x.to_vec()
            };
            let row_pos: Vec<i32> = pos.iter().flat_map(|&p| vec![p; h]).collect();
            ref_rope(&normed_x, &row_pos, hd, n_rot, 10000.0, neox)
        };
        let q_ref: Vec<f64> = heads(&q, hq, &qn)
            .iter()
            .map(|v| v * q_scale as f64)
            .collect();
        let tag = format!("hd={hd} hv={hv} n_rot={n_rot} neox={neox} norm={normed}");
        out.push(Outcome {
            name: format!("attn_prologue q {tag}"),
            rel_err: rel_err(&down(c, qd.ptr(), q.len())?, &q_ref),
            limit: 1e-4,
        });
        // the cells written, read back from the f16 caches
        let cache_rows = |ptr: u64, width: usize| -> Result<Vec<f32>, CudaError> {
            let mut all = vec![0u16; cells_n * width];
            c.gpu.download(&mut all, ptr)?;
            Ok(cells
                .iter()
                .flat_map(|&cell| {
                    let at = cell as usize * width;
                    all[at..at + width].iter().map(|&h| f16_to_f32(h))
                })
                .collect())
        };
        let k_ref: Vec<f64> = heads(&k, hkv, &kn)
            .iter()
            .map(|&v| f16_to_f32(f32_to_f16(v as f32)) as f64)
            .collect();
        out.push(Outcome {
            name: format!("attn_prologue k {tag}"),
            rel_err: rel_err(&cache_rows(kc.ptr(), hkv * hd)?, &k_ref),
            limit: 1e-3,
        });
        let v_ref: Vec<f64> = v
            .iter()
            .map(|&x| f16_to_f32(f32_to_f16(x)) as f64)
            .collect();
        out.push(Outcome {
            name: format!("attn_prologue v {tag}"),
            rel_err: rel_err(&cache_rows(vc.ptr(), hkv * hv)?, &v_ref),
            limit: 0.0,
        });
    }
    Ok(out)
}

fn route_check(c: &mut Cuda, rng: &mut Rand, ne: usize, k: usize) -> Result<Outcome, CudaError> {
    let n = 5;
    let logits = rng.vec(n * ne);
    let ld = up(c, &logits)?;
    let (ids, w) = (c.gpu.alloc(4 * n * k)?, poisoned(c, n * k)?);
    c.route(ld.ptr(), n, ne, k, true, 1.0, ids.ptr(), w.ptr())?;
    let mut got_ids = vec![0i32; n * k];
    c.gpu.download(&mut got_ids, ids.ptr())?;
    let got_w = down(c, w.ptr(), n * k)?;
    let mut reference = Vec::new();
    let mut ids_match = true;
    for t in 0..n {
        let l = &logits[t * ne..(t + 1) * ne];
        let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let e: Vec<f64> = l.iter().map(|&v| (v as f64 - m).exp()).collect();
        let mut order: Vec<usize> = (0..ne).collect();
        order.sort_by(|&a, &b| e[b].total_cmp(&e[a]).then(a.cmp(&b)));
        let sum: f64 = order[..k].iter().map(|&i| e[i]).sum();
        for (s, &i) in order[..k].iter().enumerate() {
            ids_match &= got_ids[t * k + s] == i as i32;
            reference.push(e[i] / sum);
        }
    }
    Ok(Outcome {
        name: format!("route top-{k} of {ne}"),
        rel_err: if ids_match {
            rel_err(&got_w, &reference)
        } else {
            f64::INFINITY
        },
        limit: 1e-5,
    })
}

fn attention_checks(c: &mut Cuda, rng: &mut Rand) -> Result<Vec<Outcome>, CudaError> {
    let mut out = Vec::new();
    for (hd, n_swa) in [(128usize, 0u32), (256, 0), (64, 8)] {
        let (n_head, n_head_kv, ctx) = (8usize, 2usize, 40usize);
        let (kw, vw) = (n_head_kv * hd, n_head_kv * hd);
        // one sequence (cells 0..ctx) written through kv_store as a prompt would
        let (kf, vf) = (rng.vec(ctx * kw), rng.vec(ctx * vw));
        let (kc, vc) = (c.gpu.alloc(ctx * kw * 2)?, c.gpu.alloc(ctx * vw * 2)?);
        let cells: Vec<i32> = (0..ctx as i32).collect();
        let cd = c.gpu.alloc(4 * ctx)?;
        c.gpu.upload(cd.ptr(), &cells)?;
        let (kd, vd) = (up(c, &kf)?, up(c, &vf)?);
        c.kv_store(kd.ptr(), kc.ptr(), cd.ptr(), kw, ctx)?;
        c.kv_store(vd.ptr(), vc.ptr(), cd.ptr(), vw, ctx)?;
        let round =
            |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| f16_to_f32(f32_to_f16(x))).collect() };
        let (kr, vr) = (round(&kf), round(&vf));
        // queries at the last position and at a few earlier ones (prompt rows)
        let qpos = [ctx as i32 - 1, 0, 5, 17];
        let nq = qpos.len();
        let q = rng.vec(nq * n_head * hd);
        let base = vec![0i32; nq];
        let (qd, pd, bd) = (up(c, &q)?, c.gpu.alloc(4 * nq)?, c.gpu.alloc(4 * nq)?);
        c.gpu.upload(pd.ptr(), &qpos)?;
        c.gpu.upload(bd.ptr(), &base)?;
        let o = poisoned(c, nq * n_head * hd)?;
        let scale = 1.0 / (hd as f32).sqrt();
        c.attention(
            qd.ptr(),
            kc.ptr(),
            vc.ptr(),
            bd.ptr(),
            pd.ptr(),
            o.ptr(),
            nq,
            (n_head, n_head_kv),
            (hd, hd),
            scale,
            n_swa,
        )?;
        let mut reference = Vec::new();
        for (t, &p) in qpos.iter().enumerate() {
            for h in 0..n_head {
                let g = h / (n_head / n_head_kv);
                let lo = if n_swa > 0 {
                    (p + 1 - n_swa as i32).max(0)
                } else {
                    0
                };
                let keys: Vec<Vec<f32>> = (lo..=p)
                    .map(|j| kr[j as usize * kw + g * hd..j as usize * kw + (g + 1) * hd].to_vec())
                    .collect();
                let vals: Vec<Vec<f32>> = (lo..=p)
                    .map(|j| vr[j as usize * vw + g * hd..j as usize * vw + (g + 1) * hd].to_vec())
                    .collect();
                let qh = &q[(t * n_head + h) * hd..(t * n_head + h + 1) * hd];
                reference.extend(ref_attend(qh, &keys, &vals, scale));
            }
        }
        out.push(Outcome {
            name: format!("attention hd={hd} swa={n_swa}"),
            rel_err: rel_err(&down(c, o.ptr(), nq * n_head * hd)?, &reference),
            limit: 1e-5,
        });
        // the prompt path: the first 24 positions as one chunk, then the next 16
        for (p0, m) in [(0usize, 24usize), (24, 16)] {
            let q = rng.vec(m * n_head * hd);
            let qd = up(c, &q)?;
            let o = poisoned(c, m * n_head * hd)?;
            c.attention_prompt(
                qd.ptr(),
                kc.ptr(),
                vc.ptr(),
                o.ptr(),
                0,
                p0,
                m,
                (n_head, n_head_kv),
                (hd, hd),
                scale,
                n_swa,
            )?;
            let mut reference = Vec::new();
            for i in 0..m {
                let p = (p0 + i) as i32;
                let lo = if n_swa > 0 {
                    (p + 1 - n_swa as i32).max(0)
                } else {
                    0
                };
                for h in 0..n_head {
                    let g = h / (n_head / n_head_kv);
                    let rows = |src: &[f32], w: usize| -> Vec<Vec<f32>> {
                        (lo..=p)
                            .map(|j| {
                                src[j as usize * w + g * hd..j as usize * w + (g + 1) * hd].to_vec()
                            })
                            .collect()
                    };
                    let qh = &q[(i * n_head + h) * hd..(i * n_head + h + 1) * hd];
                    reference.extend(ref_attend(qh, &rows(&kr, kw), &rows(&vr, vw), scale));
                }
            }
            out.push(Outcome {
                name: format!("attention_prompt hd={hd} swa={n_swa} p0={p0}"),
                rel_err: rel_err(&down(c, o.ptr(), m * n_head * hd)?, &reference),
                // f16 queries and probabilities on the tensor cores
                limit: 3e-3,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_measure_fails_nan_and_wrong_lengths() {
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(rel_err(&[1.0, f32::NAN], &[1.0, 2.0]).is_infinite());
        assert!(rel_err(&[1.0], &[1.0, 2.0]).is_infinite());
        assert!(rel_err(&[0.0, 1.0], &[0.0, 0.0]).is_infinite());
        let e = rel_err(&[1.0, 2.001], &[1.0, 2.0]);
        assert!(e > 4e-4 && e < 5e-4, "{e}");
    }

    #[test]
    fn references_agree_with_the_cpu_engine_blocks() {
        // RoPE by a quarter turn at position 1 with one pair: (1, 0) -> (cos 1, sin 1)
        let r = ref_rope(&[1.0, 0.0], &[1], 2, 2, 10000.0, false);
        assert!((r[0] - 1f64.cos()).abs() < 1e-12 && (r[1] - 1f64.sin()).abs() < 1e-12);
        let n = ref_rms_norm(&[3.0, -4.0], &[1.0, 2.0], 0.0);
        let s = 1.0 / 12.5f64.sqrt();
        assert!((n[0] - 3.0 * s).abs() < 1e-12 && (n[1] + 8.0 * s).abs() < 1e-12);
        // equal scores average the values
        let a = ref_attend(
            &[0.0],
            &[vec![1.0], vec![2.0]],
            &[vec![1.0], vec![3.0]],
            1.0,
        );
        assert!((a[0] - 2.0).abs() < 1e-12);
    }
}
