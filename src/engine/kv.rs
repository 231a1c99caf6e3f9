//! The KV cache: per sequence, per layer, one K row and one V row per cached position, stored in
//! the cache type (`-ctk` / `-ctv`: F16 by default, Q8_0 or Q4_0). Cells keep their positions, so
//! any range can be removed and sequences can be copied for prompt reuse.

use std::collections::BTreeMap;

use super::{EngineError, SeqId};
use crate::backend::cpu::quant::quantize_kv_row;
use crate::model::quants::dequantize;
use crate::model::GgmlType;

/// One sequence's cells: `pos[c]` is cell `c`'s position; layer `l`'s K row of cell `c` is
/// `k[l][c * k_row .. (c + 1) * k_row]`.
#[derive(Clone, Debug, Default)]
pub struct SeqCells {
    pub pos: Vec<u32>,
    pub k: Vec<Vec<u8>>,
    pub v: Vec<Vec<u8>>,
}

pub struct KvCache {
    pub type_k: GgmlType,
    pub type_v: GgmlType,
    /// Bytes of one cell's K (V) row: all KV heads.
    pub k_row: usize,
    pub v_row: usize,
    /// V is not stored: each cell's V row is the first `v_row` bytes of its K row (latent
    /// attention's absorbed form, one KV head, one type for both).
    v_in_k: bool,
    n_layer: usize,
    n_ctx_seq: usize,
    n_seq_max: usize,
    layout: UpstreamLayout,
    seqs: BTreeMap<SeqId, SeqCells>,
}

/// What upstream's cache sizes follow (`--kv-unified`, `--swa-full`, `-ub`, the model's window):
/// its attention graph spans a view of the cache whose length picks ggml's kernels.
#[derive(Clone, Copy, Debug, Default)]
pub struct UpstreamLayout {
    pub kv_unified: bool,
    pub swa_full: bool,
    pub n_ubatch: usize,
    pub n_swa: usize,
}

pub fn check_kv_type(ty: GgmlType, width: usize, which: &str) -> Result<(), EngineError> {
    match ty {
        GgmlType::F16 | GgmlType::F32 => Ok(()),
        GgmlType::Q8_0 | GgmlType::Q4_0 if width.is_multiple_of(32) => Ok(()),
        GgmlType::Q8_0 | GgmlType::Q4_0 => Err(EngineError::Load(format!(
            "{which} cache type {ty} needs rows that are a multiple of 32 elements, the model's are {width}"
        ))),
        other => Err(EngineError::Load(format!(
            "{which} cache type {other} is not supported (f32, f16, q8_0, q4_0)"
        ))),
    }
}

impl KvCache {
    pub fn new(
        type_k: GgmlType,
        type_v: GgmlType,
        k_width: usize,
        v_width: usize,
        n_layer: usize,
        n_ctx_seq: usize,
        n_seq_max: usize,
    ) -> Result<KvCache, EngineError> {
        check_kv_type(type_k, k_width, "K")?;
        check_kv_type(type_v, v_width, "V")?;
        let row = |ty: GgmlType, w: usize| w / ty.block_size() * ty.type_size();
        Ok(KvCache {
            type_k,
            type_v,
            k_row: row(type_k, k_width),
            v_row: row(type_v, v_width),
            v_in_k: false,
            n_layer,
            n_ctx_seq,
            n_seq_max,
            layout: UpstreamLayout::default(),
            seqs: BTreeMap::new(),
        })
    }

    pub fn set_layout(&mut self, layout: UpstreamLayout) {
        self.layout = layout;
    }

    /// Reads each cell's V row from the start of its K row instead of storing it (as upstream's
    /// key-only cache for latent attention): needs one type and one KV head for both.
    pub fn set_v_in_k(&mut self) {
        assert!(
            self.type_k == self.type_v && self.v_row <= self.k_row,
            "V inside K needs one type and a V row no longer than K's"
        );
        self.v_in_k = true;
    }

    /// Bytes of V each cell stores apart from K.
    fn v_stored(&self) -> usize {
        if self.v_in_k {
            0
        } else {
            self.v_row
        }
    }

    /// Layer `l`'s V rows of `cells` and the stride between them: cell `c`'s row starts at
    /// `c * stride` and is `v_row` bytes long.
    pub fn v_rows<'a>(&self, cells: &'a SeqCells, l: usize) -> (&'a [u8], usize) {
        if self.v_in_k {
            (&cells.k[l], self.k_row)
        } else {
            (&cells.v[l], self.v_row)
        }
    }

    /// The cells upstream's graph would attend over for `s` on a layer of the window cache
    /// (`swa`) or the full one (`llama_kv_cache::get_n_kv`): the cells in use, padded to 256, at
    /// most the cache's size. The cells in use are this sequence's, or every sequence's when
    /// the cache is unified (upstream packs them into one stream).
    pub fn n_kv_view(&self, s: SeqId, swa: bool) -> usize {
        let l = &self.layout;
        let base = self.n_ctx_seq;
        let size = if swa && !l.swa_full && l.n_swa > 0 {
            let streams = if l.kv_unified { self.n_seq_max } else { 1 };
            (base.min(l.n_swa * streams + l.n_ubatch)).next_multiple_of(256)
        } else {
            base
        };
        let used = if l.kv_unified {
            self.seqs.values().map(|c| c.pos.len()).sum()
        } else {
            self.len(s)
        };
        size.min(used.next_multiple_of(256).max(256))
    }

    pub fn n_ctx_seq(&self) -> usize {
        self.n_ctx_seq
    }

    pub fn n_seq_max(&self) -> usize {
        self.n_seq_max
    }

    pub fn seq(&self, s: SeqId) -> Option<&SeqCells> {
        self.seqs.get(&s)
    }

    /// Cells in use by `s`.
    pub fn len(&self, s: SeqId) -> usize {
        self.seqs.get(&s).map_or(0, |c| c.pos.len())
    }

    /// Reserves a cell at `pos` for `s` in every layer and returns its index. A cell already at
    /// `pos` is reused (the new K/V overwrite it).
    pub fn alloc(&mut self, s: SeqId, pos: u32) -> Result<usize, EngineError> {
        let (n_layer, vs) = (self.n_layer, self.v_stored());
        let cells = self.seqs.entry(s).or_insert_with(|| SeqCells {
            pos: Vec::new(),
            k: vec![Vec::new(); n_layer],
            v: vec![Vec::new(); n_layer],
        });
        if let Some(c) = cells.pos.iter().rposition(|&p| p == pos) {
            return Ok(c);
        }
        if cells.pos.len() >= self.n_ctx_seq {
            return Err(EngineError::NoSpace {
                seq: s,
                needed: cells.pos.len() + 1,
                capacity: self.n_ctx_seq,
            });
        }
        cells.pos.push(pos);
        for l in 0..n_layer {
            cells.k[l].resize(cells.pos.len() * self.k_row, 0);
            cells.v[l].resize(cells.pos.len() * vs, 0);
        }
        Ok(cells.pos.len() - 1)
    }

    /// Stores layer `l`'s K and V (f32, `k_width` / `v_width` long) in cell `c` of `s`.
    pub fn store(&mut self, s: SeqId, l: usize, c: usize, k: &[f32], v: &[f32]) {
        let (kr, vr) = (self.k_row, self.v_row);
        let (tk, tv) = (self.type_k, self.type_v);
        let v_in_k = self.v_in_k;
        let cells = self.seqs.get_mut(&s).expect("alloc before store");
        quantize_kv_row(tk, k, &mut cells.k[l][c * kr..(c + 1) * kr]);
        if !v_in_k {
            quantize_kv_row(tv, v, &mut cells.v[l][c * vr..(c + 1) * vr]);
        }
    }

    /// Cells in `[p0, p1)` before this call, for a caller that counts room ahead of a batch.
    pub fn count_in(&self, s: SeqId, p0: u32, p1: u32) -> usize {
        self.seqs
            .get(&s)
            .map_or(0, |c| c.pos.iter().filter(|&&p| p >= p0 && p < p1).count())
    }

    /// Replaces `s`'s cells with saved ones (of this cache's layout); false when they do not fit.
    pub fn put(&mut self, s: SeqId, cells: SeqCells) -> bool {
        let fits = cells.pos.len() <= self.n_ctx_seq
            && cells.k.len() == self.n_layer
            && cells.v.len() == self.n_layer
            && cells
                .k
                .iter()
                .all(|k| k.len() == cells.pos.len() * self.k_row)
            && cells
                .v
                .iter()
                .all(|v| v.len() == cells.pos.len() * self.v_stored());
        if !fits {
            return false;
        }
        self.seqs.remove(&s);
        if !cells.pos.is_empty() {
            self.seqs.insert(s, cells);
        }
        true
    }

    pub fn seq_rm(&mut self, s: SeqId, p0: u32, p1: Option<u32>) {
        let Some(cells) = self.seqs.get(&s) else {
            return;
        };
        let p1 = p1.unwrap_or(u32::MAX);
        let keep: Vec<bool> = cells.pos.iter().map(|&p| p < p0 || p >= p1).collect();
        self.retain(s, &keep);
    }

    /// Moves `s`'s cells at positions `[p0, p1)` by `delta` (llama.cpp's `seq_add`): each moved
    /// cell's layer-`l` K row is handed to `rotate(l, row)` in f32 (`k_width` values) to be
    /// turned for its new place and goes back in the cache type, as llama.cpp's K-shift casts a
    /// quantized cache to f32 and back. A cell moved below position 0 is dropped, as there.
    pub fn shift(
        &mut self,
        s: SeqId,
        (p0, p1): (u32, u32),
        delta: i32,
        mut rotate: impl FnMut(usize, &mut [f32]),
    ) {
        let (kr, tk) = (self.k_row, self.type_k);
        let width = kr / tk.type_size() * tk.block_size();
        let Some(cells) = self.seqs.get_mut(&s) else {
            return;
        };
        if delta == 0 {
            return;
        }
        let mut row = vec![0f32; width];
        let mut keep = vec![true; cells.pos.len()];
        for c in 0..cells.pos.len() {
            let p = cells.pos[c];
            if p < p0 || p >= p1 {
                continue;
            }
            let moved = i64::from(p) + i64::from(delta);
            if moved < 0 {
                keep[c] = false;
                continue;
            }
            cells.pos[c] = moved as u32;
            for (l, k) in cells.k.iter_mut().enumerate() {
                let bytes = &mut k[c * kr..(c + 1) * kr];
                dequantize(tk, bytes, &mut row).expect("cache rows are whole blocks");
                rotate(l, &mut row);
                quantize_kv_row(tk, &row, bytes);
            }
        }
        self.retain(s, &keep);
    }

    /// Keeps the cells of `s` whose `keep` entry is set, in their order.
    fn retain(&mut self, s: SeqId, keep: &[bool]) {
        let vs = self.v_stored();
        let Some(cells) = self.seqs.get_mut(&s) else {
            return;
        };
        if keep.iter().all(|&k| k) {
            return;
        }
        let compact = |data: &mut Vec<u8>, row: usize| {
            let mut w = 0;
            for (c, &k) in keep.iter().enumerate() {
                if k {
                    data.copy_within(c * row..(c + 1) * row, w * row);
                    w += 1;
                }
            }
            data.truncate(w * row);
        };
        for l in 0..self.n_layer {
            compact(&mut cells.k[l], self.k_row);
            compact(&mut cells.v[l], vs);
        }
        let mut i = 0;
        cells.pos.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        if cells.pos.is_empty() {
            self.seqs.remove(&s);
        }
    }

    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, n: u32) {
        if src == dst {
            return;
        }
        self.seq_rm(dst, 0, None);
        let Some(from) = self.seqs.get(&src) else {
            return;
        };
        let mut copy = SeqCells {
            pos: Vec::new(),
            k: vec![Vec::new(); self.n_layer],
            v: vec![Vec::new(); self.n_layer],
        };
        let vs = self.v_stored();
        for (c, &p) in from.pos.iter().enumerate() {
            if p < n {
                copy.pos.push(p);
                for l in 0..self.n_layer {
                    copy.k[l].extend_from_slice(&from.k[l][c * self.k_row..(c + 1) * self.k_row]);
                    copy.v[l].extend_from_slice(&from.v[l][c * vs..(c + 1) * vs]);
                }
            }
        }
        if !copy.pos.is_empty() {
            self.seqs.insert(dst, copy);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> KvCache {
        KvCache::new(GgmlType::F16, GgmlType::F16, 4, 4, 2, 8, 4).unwrap()
    }

    fn fill(kv: &mut KvCache, s: SeqId, n: u32) {
        for p in 0..n {
            let c = kv.alloc(s, p).unwrap();
            let row = [p as f32; 4];
            for l in 0..2 {
                kv.store(s, l, c, &row, &row);
            }
        }
    }

    #[test]
    fn remove_copy_and_capacity() {
        let mut kv = cache();
        fill(&mut kv, 0, 6);
        kv.seq_rm(0, 2, Some(4));
        assert_eq!(kv.seq(0).unwrap().pos, vec![0, 1, 4, 5]);
        // the rows moved with their positions
        assert_eq!(
            &kv.seq(0).unwrap().k[1][2 * 8..2 * 8 + 2],
            &0x4400u16.to_le_bytes()
        );
        kv.seq_cp(0, 3, 5);
        assert_eq!(kv.seq(3).unwrap().pos, vec![0, 1, 4]);
        kv.seq_rm(0, 1, None);
        assert_eq!(kv.seq(0).unwrap().pos, vec![0]);
        kv.seq_rm(0, 0, None);
        assert!(kv.seq(0).is_none());
        fill(&mut kv, 1, 8);
        assert_eq!(
            kv.alloc(1, 8),
            Err(EngineError::NoSpace {
                seq: 1,
                needed: 9,
                capacity: 8
            })
        );
    }

    /// A shift moves positions, turns only the moved cells' K rows (every layer's, through the
    /// cache type), leaves V alone and drops cells moved below 0.
    #[test]
    fn shift_moves_positions_and_turns_keys() {
        let mut kv = cache();
        fill(&mut kv, 0, 6);
        kv.seq_rm(0, 1, Some(3));
        let mut seen = Vec::new();
        kv.shift(0, (3, 6), -2, |l, row| {
            seen.push((l, row[0]));
            row.iter_mut().for_each(|v| *v += 0.5 + l as f32);
        });
        assert_eq!(kv.seq(0).unwrap().pos, vec![0, 1, 2, 3]);
        assert_eq!(
            seen,
            vec![(0, 3.0), (1, 3.0), (0, 4.0), (1, 4.0), (0, 5.0), (1, 5.0)]
        );
        let k_at = |kv: &KvCache, l: usize, c: usize| {
            let mut v = [0.0f32; 4];
            let row = &kv.seq(0).unwrap().k[l][c * 8..(c + 1) * 8];
            crate::backend::cpu::vec::f16_to_f32_slice(row, &mut v);
            v[0]
        };
        let v_at = |kv: &KvCache, c: usize| {
            let mut v = [0.0f32; 4];
            let row = &kv.seq(0).unwrap().v[1][c * 8..(c + 1) * 8];
            crate::backend::cpu::vec::f16_to_f32_slice(row, &mut v);
            v[0]
        };
        // cell 0 (position 0) untouched; the cell now at position 1 held position 3's rows
        assert_eq!(k_at(&kv, 0, 0), 0.0);
        assert_eq!(k_at(&kv, 0, 1), 3.5);
        assert_eq!(k_at(&kv, 1, 1), 4.5);
        assert_eq!(v_at(&kv, 1), 3.0);
        // moved below position 0: dropped
        kv.shift(0, (0, 2), -1, |_, _| {});
        assert_eq!(kv.seq(0).unwrap().pos, vec![0, 2, 3]);
        assert_eq!(k_at(&kv, 0, 0), 3.5);
        // no move, no change
        kv.shift(0, (0, 9), 0, |_, row| row.fill(9.0));
        assert_eq!(k_at(&kv, 0, 0), 3.5);
    }

    /// Latent attention's key-only cache: V is read from the start of each K row, through
    /// removal and copies, and nothing is stored for it.
    #[test]
    fn v_inside_k() {
        let mut kv = KvCache::new(GgmlType::F16, GgmlType::F16, 6, 4, 1, 8, 2).unwrap();
        kv.set_v_in_k();
        for p in 0..4u32 {
            let c = kv.alloc(0, p).unwrap();
            let k: Vec<f32> = (0..6).map(|i| (10 * p + i) as f32).collect();
            kv.store(0, 0, c, &k, &[-1.0; 4]);
        }
        kv.seq_rm(0, 1, Some(2));
        kv.seq_cp(0, 1, 3);
        for s in [0, 1] {
            let cells = kv.seq(s).unwrap();
            assert!(cells.v[0].is_empty());
            let (rows, stride) = kv.v_rows(cells, 0);
            assert_eq!(stride, 12);
            let mut v = [0.0f32; 4];
            crate::backend::cpu::vec::f16_to_f32_slice(&rows[stride..stride + 8], &mut v);
            // the second cell left is position 2: its K row's first four values
            assert_eq!(v, [20.0, 21.0, 22.0, 23.0]);
        }
        assert_eq!(kv.seq(1).unwrap().pos, vec![0, 2]);
    }

    #[test]
    fn refuses_block_types_on_odd_rows() {
        assert!(KvCache::new(GgmlType::Q8_0, GgmlType::F16, 40, 40, 1, 8, 1).is_err());
        assert!(KvCache::new(GgmlType::Q4K, GgmlType::F16, 256, 256, 1, 8, 1).is_err());
        assert!(KvCache::new(GgmlType::Q8_0, GgmlType::Q4_0, 64, 64, 1, 8, 1).is_ok());
    }
}
