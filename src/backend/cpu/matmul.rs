//! Threaded products of a weight matrix (rows of quantized blocks, as ggml stores them) with a
//! batch of activation rows: `out[t][r] = dot(w.row(r), x[t])`. Activations are converted once to
//! the weight type's `vec_dot_type`; threads split the weight rows, and each thread walks a small
//! tile of rows across every token so the weights are read from memory once per batch.

use super::dot::{
    kernel, kernel4, kernel4_rowwise, kernel_batched, kernel_sgemm, kernel_tile, DotFn, DotFn4,
    DotTile, TILED_MIN_ROWS,
};
use super::packed;
use super::pool::{split_range, SyncPtr, ThreadPool};
use super::quant::{act_row_bytes, quantize_act};
use crate::model::quants::vec_dot_type;
use crate::model::GgmlType;

/// A 2-D weight: `rows` rows of `cols` elements of type `ty`, row-major.
#[derive(Clone, Copy, Debug)]
pub struct QMat<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    /// The same rows repacked for the AVX-512 kernel of [`super::packed`], where the weights'
    /// owner made that copy.
    pub packed: Option<&'a [u8]>,
}

impl<'a> QMat<'a> {
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Rows `[r0, r1)` as a matrix of their own (one expert of a stacked expert tensor).
    pub fn rows(&self, r0: usize, r1: usize) -> QMat<'a> {
        let rb = self.row_bytes();
        QMat {
            ty: self.ty,
            rows: r1 - r0,
            cols: self.cols,
            data: &self.data[r0 * rb..r1 * rb],
            packed: None,
        }
    }
}

/// Rows of weights handled together by one thread before moving to the next tile.
const ROW_TILE: usize = 16;
/// Tokens handled together inside a row tile.
const TOKEN_TILE: usize = 64;
/// Fewest tokens of a tile that the strip kernels take: they decode a row tile's weights into a
/// buffer and correct each token's sums up front, which four tokens do not repay; fewer go
/// through the four-token kernel (`head_speed`: Gemma's Q8_0 head against 4 tokens 18.3-18.7 ms
/// that way, 20.3 as a strip; 8 and 12 tokens 26.6 and 32.4 as strips, 26.8 and 38.8 in fours).
const STRIP_MIN_TOKENS: usize = 8;

/// Activations converted for one weight type, reusable across several products with weights of
/// the same `vec_dot_type` (q, k and v share one conversion).
pub struct Activations {
    pub ty: GgmlType,
    pub cols: usize,
    pub n: usize,
    pub data: Vec<u8>,
}

impl Activations {
    pub fn new() -> Activations {
        Activations {
            ty: GgmlType::F32,
            cols: 0,
            n: 0,
            data: Vec::new(),
        }
    }

    /// Converts `n` rows of `cols` floats for products with weights of type `w`.
    pub fn prepare(&mut self, pool: &ThreadPool, w: GgmlType, x: &[f32], cols: usize, n: usize) {
        let ty = vec_dot_type(w);
        let rb = act_row_bytes(ty, cols);
        self.ty = ty;
        self.cols = cols;
        self.n = n;
        self.data.resize(rb * n, 0);
        if n < 4 {
            for t in 0..n {
                quantize_act(
                    ty,
                    &x[t * cols..(t + 1) * cols],
                    &mut self.data[t * rb..(t + 1) * rb],
                );
            }
            return;
        }
        let out = SyncPtr::new(self.data.as_mut_ptr());
        pool.run(|ith, nth| {
            let (t0, t1) = split_range(n, ith, nth, 1);
            for t in t0..t1 {
                // SAFETY: each thread writes its own token rows of `data`, sized above.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(t * rb), rb) };
                quantize_act(ty, &x[t * cols..(t + 1) * cols], dst);
            }
        });
    }

    pub fn row(&self, t: usize) -> &[u8] {
        let rb = act_row_bytes(self.ty, self.cols);
        &self.data[t * rb..(t + 1) * rb]
    }
}

impl Default for Activations {
    fn default() -> Self {
        Activations::new()
    }
}

/// `out[t * w.rows + r] = w.row(r) . x[t]` for the `n` rows of `x` (`n * w.cols` floats).
pub fn matmul(
    pool: &ThreadPool,
    w: &QMat,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    act: &mut Activations,
) {
    act.prepare(pool, w.ty, x, w.cols, n);
    matmul_prepared(pool, w, act, out);
}

/// [`matmul`] on activations already converted by [`Activations::prepare`] for `w.ty`.
pub fn matmul_prepared(pool: &ThreadPool, w: &QMat, act: &Activations, out: &mut [f32]) {
    assert_eq!(act.cols, w.cols, "activation width");
    assert!(out.len() >= act.n * w.rows, "output holds n x rows");
    if let Some(packed) = w.packed {
        return packed_product(pool, w, packed, act, out);
    }
    if w.ty == GgmlType::Q6K && act.n >= TILED_MIN_ROWS && packed::in_groups(w.rows) {
        return q6k_tiled_product(pool, w, act, out);
    }
    let dot = kernel(w.ty).unwrap_or_else(|| panic!("no kernel for {}: checked at load", w.ty));
    let sgemm = kernel_sgemm(w.ty).filter(|_| act.n >= 2 && w.rows.is_multiple_of(4));
    let (dot, dot4, tile) = match kernel_batched(w.ty).filter(|_| act.n >= TILED_MIN_ROWS) {
        // the order ggml sums these types in when the product has this many rows
        Some((one, four)) => (one, four, None),
        None => match sgemm {
            Some(one) => (one, None, None),
            None => (dot, kernel4(w.ty), kernel_tile(w.ty)),
        },
    };
    let out = SyncPtr::new(out.as_mut_ptr());
    pool.run(|ith, nth| {
        let (r0, r1) = split_range(w.rows, ith, nth, ROW_TILE);
        // SAFETY: this thread writes only columns [r0, r1) of every output row.
        unsafe { tile_loop((dot, dot4, tile), w, act, r0, r1, out) };
    });
}

/// [`matmul_prepared`] on repacked rows: threads split the groups of rows; each group takes the
/// tokens in fours, then the rest one at a time (as ggml's repacked kernels split them).
fn packed_product(pool: &ThreadPool, w: &QMat, packed: &[u8], act: &Activations, out: &mut [f32]) {
    let groups = w.rows / packed::ROWS;
    let gb = packed.len() / groups;
    let n = act.n;
    let out = SyncPtr::new(out.as_mut_ptr());
    pool.run(|ith, nth| {
        let (g0, g1) = split_range(groups, ith, nth, 1);
        for g in g0..g1 {
            let grp = &packed[g * gb..(g + 1) * gb];
            let r0 = g * packed::ROWS;
            // SAFETY: this thread writes only its groups' columns of every output row.
            let put =
                |t: usize, v: &[f32; packed::ROWS]| unsafe { put_group(out, t * w.rows + r0, v) };
            let mut t = 0;
            while t + 4 <= n {
                let a = [act.row(t), act.row(t + 1), act.row(t + 2), act.row(t + 3)];
                for (q, v) in packed::q4k_group_x4(w.cols, grp, a).iter().enumerate() {
                    put(t + q, v);
                }
                t += 4;
            }
            for t in t..n {
                put(t, &packed::q4k_group_x1(w.cols, grp, act.row(t)));
            }
        }
    });
}

/// [`matmul_prepared`] for Q6_K weights and [`TILED_MIN_ROWS`] or more tokens: threads split the
/// groups of sixteen rows, each group's blocks unpacked once per tile of tokens.
fn q6k_tiled_product(pool: &ThreadPool, w: &QMat, act: &Activations, out: &mut [f32]) {
    let groups = w.rows / packed::ROWS;
    let n = act.n;
    let out = SyncPtr::new(out.as_mut_ptr());
    pool.run(|ith, nth| {
        let (g0, g1) = split_range(groups, ith, nth, 1);
        let mut sums = vec![[0.0f32; packed::ROWS]; TOKEN_TILE];
        let mut acts: Vec<&[u8]> = Vec::with_capacity(TOKEN_TILE);
        for g in g0..g1 {
            let r0 = g * packed::ROWS;
            let rows: [&[u8]; packed::ROWS] = std::array::from_fn(|r| w.row(r0 + r));
            for t0 in (0..n).step_by(TOKEN_TILE) {
                let t1 = (t0 + TOKEN_TILE).min(n);
                acts.clear();
                acts.extend((t0..t1).map(|t| act.row(t)));
                packed::q6k_tiled_group(w.cols, rows, &acts, &mut sums);
                for (t, v) in (t0..t1).zip(&sums) {
                    // SAFETY: this thread writes only its groups' columns of every output row.
                    unsafe { put_group(out, t * w.rows + r0, v) };
                }
            }
        }
    });
}

/// One token's results for a group of rows, at `out[at..at + ROWS]`.
///
/// # Safety
/// `out` must hold those entries and no other thread may write them meanwhile.
unsafe fn put_group(out: SyncPtr<f32>, at: usize, v: &[f32; packed::ROWS]) {
    std::ptr::copy_nonoverlapping(v.as_ptr(), out.get().add(at), packed::ROWS);
}

/// Many small products in one threaded pass: for pair `j = (block, t)`,
/// `out[j * rows_per + r] = dot(w.row(block * rows_per + r), act.row(t))`. Threads split the rows
/// of all pairs together, so the chosen experts of a decode step cost one dispatch instead of one
/// per expert.
pub fn matmul_pairs(
    pool: &ThreadPool,
    w: &QMat,
    rows_per: usize,
    pairs: &[(usize, usize)],
    act: &Activations,
    out: &mut [f32],
) {
    assert_eq!(act.cols, w.cols, "activation width");
    assert!(
        out.len() >= pairs.len() * rows_per,
        "output holds pairs x rows"
    );
    assert!(
        pairs
            .iter()
            .all(|&(b, t)| (b + 1) * rows_per <= w.rows && t < act.n),
        "pairs name blocks of w and rows of act"
    );
    let total = pairs.len() * rows_per;
    let out = SyncPtr::new(out.as_mut_ptr());
    pool.run(|ith, nth| {
        let (i0, i1) = split_range(total, ith, nth, ROW_TILE);
        if i0 < i1 {
            // SAFETY: each thread writes only its own range of `out`, sized above.
            let mine = unsafe { std::slice::from_raw_parts_mut(out.get().add(i0), i1 - i0) };
            pair_dots(w, rows_per, pairs, act, i0, mine);
        }
    });
}

/// The token rows that multiply one block of a stacked weight (an expert's rows) in
/// [`matmul_groups`]: `rows` are rows of the activations, and the group's results go to output
/// rows `out..out + rows.len()` (each `rows_per` floats).
pub struct Group {
    pub block: usize,
    pub rows: Vec<usize>,
    pub out: usize,
}

/// Prompt-sized products of a stacked weight, grouped by block: for group `g` and its `j`th token
/// row, `out[(g.out + j) * rows_per + r] = dot(w.row(g.block * rows_per + r), act.row(g.rows[j]))`.
/// Every group's tiles of rows go to the threads in one pass, dealt by cost (tokens times rows),
/// and each tile runs its tokens four at a time through the four-row kernel where the type has
/// one that sums each row as the one-row kernel does (ggml's expert products run every row
/// through its one-row kernel).
pub fn matmul_groups(
    pool: &ThreadPool,
    w: &QMat,
    rows_per: usize,
    groups: &[Group],
    act: &Activations,
    out: &mut [f32],
) {
    check_groups(w, rows_per, groups, act, out.len());
    let out = SyncPtr::new(out.as_mut_ptr());
    pool.run(|ith, nth| {
        for (g, r0, r1) in group_tiles(groups, rows_per, ith, nth) {
            // SAFETY: tiles are disjoint (group, rows) ranges of `out`, checked above.
            unsafe { group_tile(w, rows_per, &groups[g], act, r0, r1, out) };
        }
    });
}

/// The bounds [`matmul_groups`] relies on: blocks of `w`, rows of `act`, and an output of
/// `out_len` floats that holds every group's rows.
pub fn check_groups(
    w: &QMat,
    rows_per: usize,
    groups: &[Group],
    act: &Activations,
    out_len: usize,
) {
    assert_eq!(act.cols, w.cols, "activation width");
    for g in groups {
        assert!((g.block + 1) * rows_per <= w.rows, "group block inside w");
        assert!(g.rows.iter().all(|&t| t < act.n), "group rows inside act");
        assert!(
            (g.out + g.rows.len()) * rows_per <= out_len,
            "output holds the group"
        );
    }
}

/// Thread `ith`'s share of the tiles `(group, first row, end row)` of [`matmul_groups`]: tiles
/// of [`ROW_TILE`] rows, dealt in order so each thread gets about `1/nth` of the cost.
pub fn group_tiles(
    groups: &[Group],
    rows_per: usize,
    ith: usize,
    nth: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let total: usize = groups.iter().map(|g| g.rows.len() * rows_per).sum();
    let mut before = 0usize;
    groups
        .iter()
        .enumerate()
        .flat_map(move |(gi, g)| {
            (0..rows_per)
                .step_by(ROW_TILE)
                .map(move |r0| (gi, r0, (r0 + ROW_TILE).min(rows_per), g.rows.len()))
        })
        .filter(move |&(_, r0, r1, m)| {
            let cost = m * (r1 - r0);
            let owner = (before * nth).checked_div(total).unwrap_or(0);
            before += cost;
            cost > 0 && owner == ith
        })
        .map(|(gi, r0, r1, _)| (gi, r0, r1))
}

/// Rows `[r0, r1)` of group `g` of [`matmul_groups`], on the calling thread.
///
/// # Safety
/// `out` must hold the group's output rows ([`check_groups`]) and no other thread may write
/// these entries meanwhile.
pub unsafe fn group_tile(
    w: &QMat,
    rows_per: usize,
    g: &Group,
    act: &Activations,
    r0: usize,
    r1: usize,
    out: SyncPtr<f32>,
) {
    if r1 - r0 == packed::ROWS
        && g.rows.len() >= 4
        && r0.is_multiple_of(packed::ROWS)
        && packed::packable(w.ty, rows_per)
    {
        // sixteen Q4_K rows at once, each block unpacked once for all the group's tokens
        let rows: [&[u8]; packed::ROWS] =
            std::array::from_fn(|r| w.row(g.block * rows_per + r0 + r));
        let acts: Vec<&[u8]> = g.rows.iter().map(|&t| act.row(t)).collect();
        let mut sums = vec![[0.0f32; packed::ROWS]; acts.len()];
        packed::q4k_rows_blocks(w.cols, rows, &acts, &mut sums);
        for (j, v) in sums.iter().enumerate() {
            put_group(out, (g.out + j) * rows_per + r0, v);
        }
        return;
    }
    let dot = kernel(w.ty).unwrap_or_else(|| panic!("no kernel for {}: checked at load", w.ty));
    // as ggml's expert products: an expert with enough rows takes the batched order, the others
    // sum every row as the one-row kernel does
    let kernels = match kernel_batched(w.ty).filter(|_| g.rows.len() >= TILED_MIN_ROWS) {
        Some(k) => k,
        None => (dot, kernel4_rowwise(w.ty)),
    };
    for r in r0..r1 {
        row_dots(
            kernels,
            w.cols,
            w.row(g.block * rows_per + r),
            g.rows.len(),
            |j| act.row(g.rows[j]),
            |j, v| *out.get().add((g.out + j) * rows_per + r) = v,
        );
    }
}

/// One weight row `wr` against the activation rows `row(0..m)`, four at a time through the
/// four-row kernel where the type has one (the same bits as one at a time, but for Q4_K's
/// [`kernel4`]); `put(j, v)` takes
/// the `j`th result.
#[inline]
fn row_dots<'a>(
    (dot, dot4): (DotFn, Option<DotFn4>),
    cols: usize,
    wr: &[u8],
    m: usize,
    row: impl Fn(usize) -> &'a [u8],
    mut put: impl FnMut(usize, f32),
) {
    let mut j = 0;
    if let Some(dot4) = dot4 {
        while j + 4 <= m {
            let rows = [row(j), row(j + 1), row(j + 2), row(j + 3)];
            for (q, v) in dot4(cols, wr, rows).into_iter().enumerate() {
                put(j + q, v);
            }
            j += 4;
        }
    }
    for j in j..m {
        put(j, dot(cols, wr, row(j)));
    }
}

/// Entries `[i0, i0 + out.len())` of [`matmul_pairs`]'s output, on the calling thread.
pub fn pair_dots(
    w: &QMat,
    rows_per: usize,
    pairs: &[(usize, usize)],
    act: &Activations,
    i0: usize,
    out: &mut [f32],
) {
    let dot = kernel(w.ty).unwrap_or_else(|| panic!("no kernel for {}: checked at load", w.ty));
    let prefetch = prefetch_rows();
    let row_of = |i: usize| {
        let (block, t) = pairs[i / rows_per];
        (block * rows_per + i % rows_per, t)
    };
    let end = i0 + out.len();
    for (j, o) in out.iter_mut().enumerate() {
        let (r, t) = row_of(i0 + j);
        if prefetch > 0 && i0 + j + prefetch < end {
            // each row is read once per step: ask for the one `prefetch` rows on now, so the
            // memory system works ahead of the products (the hardware prefetcher alone left
            // host-expert decode at 40% of the host's read bandwidth)
            prefetch_row(w.row(row_of(i0 + j + prefetch).0));
        }
        *o = dot(w.cols, w.row(r), act.row(t));
    }
}

/// How many rows ahead [`pair_dots`] prefetches (`BLOOMERY_PREFETCH_ROWS`, default 12; 0: off).
/// On the lent H200 host, decode with every expert on the host went from 31.1 tok/s without to
/// 36.5 with 2 rows and 39.0 with 6 (docs/GPU-NOTES.md, session 15); in session 19, tg64 34.6 /
/// 37.6 / 39.3 tok/s with 0 / 6 / 12 rows (host compute 427 / 395 / 356 us per layer step).
fn prefetch_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("BLOOMERY_PREFETCH_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(12)
    })
}

#[inline]
fn prefetch_row(row: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for at in (0..row.len()).step_by(64) {
        // SAFETY: a prefetch of an address inside `row`; it reads nothing and cannot fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                row.as_ptr().add(at) as *const i8,
                std::arch::x86_64::_MM_HINT_T0,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// The single-threaded body, also used for products too small to be worth splitting. A token
/// tile of [`STRIP_MIN_TOKENS`] or more goes through the strip kernel where the type has one
/// (each row tile's weights decoded once, tiles of four rows by four tokens in registers); the
/// remaining rows and tokens four tokens at a time through the four-token kernel where the type
/// has one (rows prefetched ahead for a few tokens), the rest one at a time, as ggml splits a
/// product's rows. All give the same bits but for Q4_K, whose rows in fours are summed as
/// ggml's four-row kernel sums them.
unsafe fn tile_loop(
    (dot, dot4, tile): (DotFn, Option<DotFn4>, Option<DotTile>),
    w: &QMat,
    act: &Activations,
    r0: usize,
    r1: usize,
    out: SyncPtr<f32>,
) {
    let n = act.n;
    // a token tile's activation rows and a row tile's weight rows, reused by every tile
    let mut acts: Vec<&[u8]> = Vec::with_capacity(TOKEN_TILE);
    let mut rows: Vec<&[u8]> = Vec::with_capacity(ROW_TILE);
    let mut rb = r0;
    while rb < r1 {
        let re = (rb + ROW_TILE).min(r1);
        let mut tb = 0;
        while tb < n {
            let te = (tb + TOKEN_TILE).min(n);
            // the tiled part: whole groups of four rows and four tokens
            let (mut rt, tt) = (rb, tb + (te - tb) / 4 * 4);
            let rg = rb + (re - rb) / 4 * 4;
            if let Some(tile) = tile.filter(|_| tt - tb >= STRIP_MIN_TOKENS && rg > rb) {
                // the tile's whole groups of four rows and four tokens in one call
                acts.clear();
                acts.extend((tb..tt).map(|t| act.row(t)));
                rows.clear();
                rows.extend((rb..rg).map(|r| w.row(r)));
                // this thread's columns rb..rg of output rows tb..tt
                tile(
                    w.cols,
                    &rows,
                    &acts,
                    out.get().add(tb * w.rows + rb),
                    w.rows,
                );
                // the groups' leftover tokens
                for r in rb..rg {
                    for t in tt..te {
                        *out.get().add(t * w.rows + r) = dot(w.cols, w.row(r), act.row(t));
                    }
                }
                rt = rg;
            }
            // a few tokens make the product stream its rows: ask for rows ahead, as pair_dots
            let ahead = if te - tb < STRIP_MIN_TOKENS {
                prefetch_rows()
            } else {
                0
            };
            for r in rt..re {
                if ahead > 0 && r + ahead < r1 {
                    prefetch_row(w.row(r + ahead));
                }
                row_dots(
                    (dot, dot4),
                    w.cols,
                    w.row(r),
                    te - tb,
                    |j| act.row(tb + j),
                    |j, v| *out.get().add((tb + j) * w.rows + r) = v,
                );
            }
            tb = te;
        }
        rb = re;
    }
}

/// `rows` rows of `cols` Q8_0 weights with small varied scales, for tests (`seed` varies them).
#[cfg(test)]
pub(crate) fn q8_0_test_rows(rows: usize, cols: usize, seed: usize) -> Vec<u8> {
    let mut data = Vec::new();
    for r in 0..rows {
        for b in 0..cols / 32 {
            let scale = 0.003 * ((r + b + seed) % 7 + 1) as f32;
            data.extend_from_slice(&crate::model::quants::f32_to_f16(scale).to_le_bytes());
            data.extend((0..32).map(|i| ((i * 37 + r * 11 + seed * 5) % 253) as u8));
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q8_0_mat(data: &[u8], rows: usize, cols: usize) -> QMat<'_> {
        QMat {
            ty: GgmlType::Q8_0,
            rows,
            cols,
            data,
            packed: None,
        }
    }

    /// A large Q8_0 matrix (Gemma 3 270M's output head: 262144 x 640) against 1 to 16
    /// tokens on two threads: ms per product and GB/s of weights
    /// (`cargo test --release --lib head_speed -- --ignored --nocapture`).
    #[test]
    #[ignore = "timing, for measuring"]
    fn head_speed() {
        let (rows, cols) = (262_144, 640);
        let w = q8_0_test_rows(rows, cols, 3);
        let mat = q8_0_mat(&w, rows, cols);
        let pool = ThreadPool::new(2);
        for n in [1, 4, 8, 12, 16] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
                .collect();
            let mut out = vec![0.0; n * rows];
            let mut act = Activations::new();
            matmul(&pool, &mat, &x, n, &mut out, &mut act);
            let reps = 10;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                matmul(&pool, &mat, &x, n, &mut out, &mut act);
            }
            let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
            println!(
                "{n} tokens: {ms:.2} ms, {:.1} GB/s",
                w.len() as f64 / ms / 1e6
            );
        }
    }

    #[test]
    fn matmul_matches_row_by_row_dots() {
        // 37 rows and 70 tokens: whole and partial tiles of rows and of tokens
        for n in [5, 70] {
            matmul_matches_row_by_row(n);
        }
    }

    fn matmul_matches_row_by_row(n: usize) {
        let pool = ThreadPool::new(2);
        let (rows, cols) = (37, 64);
        let data = q8_0_test_rows(rows, cols, 0);
        let w = q8_0_mat(&data, rows, cols);
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i % 13) as f32 - 6.0) * 0.1)
            .collect();
        let mut out = vec![0.0; n * rows];
        let mut act = Activations::new();
        matmul(&pool, &w, &x, n, &mut out, &mut act);
        let dot = kernel(GgmlType::Q8_0).unwrap();
        for t in 0..n {
            for r in 0..rows {
                assert_eq!(out[t * rows + r], dot(cols, w.row(r), act.row(t)));
            }
        }
    }

    #[test]
    fn groups_are_the_same_dots_as_each_blocks_product() {
        let pool = ThreadPool::new(3);
        let (blocks, rows_per, cols, n) = (5, 40, 64, 11);
        let data = q8_0_test_rows(blocks * rows_per, cols, 2);
        let w = QMat {
            ty: GgmlType::Q8_0,
            rows: blocks * rows_per,
            cols,
            data: &data,
            packed: None,
        };
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.1)
            .collect();
        let mut act = Activations::new();
        act.prepare(&pool, w.ty, &x, cols, n);
        let lists: [(usize, Vec<usize>); 4] = [
            (3, vec![0, 2, 5, 6, 7, 9, 10]),
            (0, vec![1]),
            (4, vec![]),
            (1, vec![3, 4, 8, 0, 2]),
        ];
        let mut groups = Vec::new();
        let mut at = 0;
        for (block, rows) in lists {
            let len = rows.len();
            groups.push(Group {
                block,
                rows,
                out: at,
            });
            at += len;
        }
        let mut out = vec![f32::NAN; at * rows_per];
        matmul_groups(&pool, &w, rows_per, &groups, &act, &mut out);
        let mut abuf = Activations::new();
        for g in &groups {
            let xs: Vec<f32> = g
                .rows
                .iter()
                .flat_map(|&t| x[t * cols..(t + 1) * cols].iter().copied())
                .collect();
            let mut want = vec![0.0; g.rows.len() * rows_per];
            let block = w.rows(g.block * rows_per, (g.block + 1) * rows_per);
            matmul(&pool, &block, &xs, g.rows.len(), &mut want, &mut abuf);
            let got = &out[g.out * rows_per..(g.out + g.rows.len()) * rows_per];
            assert_eq!(got, &want[..], "block {}", g.block);
        }
    }

    #[test]
    fn group_tiles_cover_every_tile_once() {
        let groups: Vec<Group> = [3usize, 0, 17, 1]
            .iter()
            .enumerate()
            .map(|(b, &m)| Group {
                block: b,
                rows: vec![0; m],
                out: 0,
            })
            .collect();
        for nth in 1..5 {
            let mut seen = Vec::new();
            for ith in 0..nth {
                seen.extend(group_tiles(&groups, 40, ith, nth));
            }
            seen.sort();
            let want: Vec<_> = [0usize, 2, 3]
                .iter()
                .flat_map(|&g| [(g, 0, 16), (g, 16, 32), (g, 32, 40)])
                .collect();
            assert_eq!(seen, want, "{nth} threads");
        }
    }

    #[test]
    fn pairs_are_the_same_dots_as_whole_products() {
        let pool = ThreadPool::new(2);
        let (blocks, rows_per, cols, n) = (4, 8, 64, 3);
        let rows = blocks * rows_per;
        let data = q8_0_test_rows(rows, cols, 1);
        let w = QMat {
            ty: GgmlType::Q8_0,
            rows,
            cols,
            data: &data,
            packed: None,
        };
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i % 11) as f32 - 5.0) * 0.2)
            .collect();
        let mut act = Activations::new();
        act.prepare(&pool, w.ty, &x, cols, n);
        let mut whole = vec![0.0; n * rows];
        matmul_prepared(&pool, &w, &act, &mut whole);
        let pairs = [(3, 0), (0, 2), (3, 1), (1, 0), (2, 2)];
        let mut out = vec![f32::NAN; pairs.len() * rows_per];
        matmul_pairs(&pool, &w, rows_per, &pairs, &act, &mut out);
        for (j, &(b, t)) in pairs.iter().enumerate() {
            for r in 0..rows_per {
                assert_eq!(out[j * rows_per + r], whole[t * rows + b * rows_per + r]);
            }
        }
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// `cargo test --release --lib stream_speed -- --ignored --nocapture`: GB/s of one-token
    /// products over matrices far larger than the caches (as decode reads them), beside a plain
    /// summing read of the same bytes. No timing is asserted.
    #[test]
    #[ignore]
    fn stream_speed() {
        let threads: usize = std::env::var("THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2);
        let pool = ThreadPool::new(threads);
        let cols = 2048;
        for ty in [GgmlType::Q8_0, GgmlType::Q4K] {
            let rows = (256 << 20) / (cols / ty.block_size() * ty.type_size());
            let bytes = rows * cols / ty.block_size() * ty.type_size();
            // STREAM_HUGE=1: anonymous memory advised to transparent huge pages
            let mut anon;
            let mut vec;
            let data: &mut [u8] = if std::env::var_os("STREAM_HUGE").is_some() {
                anon = memmap2::MmapMut::map_anon(bytes).unwrap();
                #[cfg(target_os = "linux")]
                anon.advise(memmap2::Advice::HugePage).unwrap();
                &mut anon[..]
            } else {
                vec = vec![0u8; bytes];
                &mut vec[..]
            };
            let bs = ty.type_size();
            for (i, b) in data.chunks_exact_mut(bs).enumerate() {
                for (j, v) in b.iter_mut().enumerate() {
                    *v = (i * 31 + j * 7) as u8;
                }
                let h = crate::model::quants::f32_to_f16(0.001).to_le_bytes();
                b[..2].copy_from_slice(&h);
                if ty == GgmlType::Q4K {
                    b[2..4].copy_from_slice(&h);
                }
            }
            let w = QMat {
                ty,
                rows,
                cols,
                data,
                packed: None,
            };
            let x: Vec<f32> = (0..cols).map(|i| (i % 17) as f32 * 0.1 - 0.8).collect();
            let mut out = vec![0.0; rows];
            let mut act = Activations::new();
            matmul(&pool, &w, &x, 1, &mut out, &mut act);
            let reps = 10;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                matmul(&pool, &w, &x, 1, &mut out, &mut act);
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            let sums = SyncPtr::new(out.as_mut_ptr());
            let t = std::time::Instant::now();
            for _ in 0..reps {
                pool.run(|ith, nth| {
                    let (a, b) = split_range(bytes / 8, ith, nth, 8);
                    // SAFETY: words [a, b) lie inside `data`; each thread writes its own sum.
                    let words = unsafe {
                        std::slice::from_raw_parts(data.as_ptr().add(8 * a) as *const u64, b - a)
                    };
                    let v = words.iter().fold(0u64, |s, &x| s.wrapping_add(x));
                    unsafe { *sums.get().add(ith) = v as f32 };
                });
            }
            let sread = t.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{ty} x1, {threads} threads: product {:.1} GB/s, plain read {:.1} GB/s",
                bytes as f64 / s / 1e9,
                bytes as f64 / sread / 1e9
            );
        }
    }
}
