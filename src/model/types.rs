//! ggml tensor types: ids as stored in GGUF, names, and size accounting (elements per block, bytes
//! per block). Dequantization and dot products per type live beside this table.

use std::fmt;

/// A ggml tensor element type, as numbered in GGUF files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
    Nvfp4,
    Q1_0,
    Q2_0,
}

/// (type, GGUF id, name, elements per block, bytes per block). Sizes match the `gguf` package's
/// `GGML_QUANT_SIZES`; a unit test checks that they do.
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "f32", 1, 4),
    (GgmlType::F16, 1, "f16", 1, 2),
    (GgmlType::Q4_0, 2, "q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "q8_1", 32, 36),
    (GgmlType::Q2K, 10, "q2_K", 256, 84),
    (GgmlType::Q3K, 11, "q3_K", 256, 110),
    (GgmlType::Q4K, 12, "q4_K", 256, 144),
    (GgmlType::Q5K, 13, "q5_K", 256, 176),
    (GgmlType::Q6K, 14, "q6_K", 256, 210),
    (GgmlType::Q8K, 15, "q8_K", 256, 292),
    (GgmlType::Iq2Xxs, 16, "iq2_xxs", 256, 66),
    (GgmlType::Iq2Xs, 17, "iq2_xs", 256, 74),
    (GgmlType::Iq3Xxs, 18, "iq3_xxs", 256, 98),
    (GgmlType::Iq1S, 19, "iq1_s", 256, 50),
    (GgmlType::Iq4Nl, 20, "iq4_nl", 32, 18),
    (GgmlType::Iq3S, 21, "iq3_s", 256, 110),
    (GgmlType::Iq2S, 22, "iq2_s", 256, 82),
    (GgmlType::Iq4Xs, 23, "iq4_xs", 256, 136),
    (GgmlType::I8, 24, "i8", 1, 1),
    (GgmlType::I16, 25, "i16", 1, 2),
    (GgmlType::I32, 26, "i32", 1, 4),
    (GgmlType::I64, 27, "i64", 1, 8),
    (GgmlType::F64, 28, "f64", 1, 8),
    (GgmlType::Iq1M, 29, "iq1_m", 256, 56),
    (GgmlType::Bf16, 30, "bf16", 1, 2),
    (GgmlType::Tq1_0, 34, "tq1_0", 256, 54),
    (GgmlType::Tq2_0, 35, "tq2_0", 256, 66),
    (GgmlType::Mxfp4, 39, "mxfp4", 32, 17),
    (GgmlType::Nvfp4, 40, "nvfp4", 64, 36),
    (GgmlType::Q1_0, 41, "q1_0", 128, 18),
    (GgmlType::Q2_0, 42, "q2_0", 64, 18),
];

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every GgmlType has a table row")
    }

    /// The type stored under `id` in a GGUF file, or `None` for ids ggml does not define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's lower-case name (`q4_K`, `iq2_xxs`, ...).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Parses ggml's type name, case-insensitively (as `-ctk q8_0` or `--override-tensor` give it).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|r| r.2.eq_ignore_ascii_case(name))
            .map(|r| r.0)
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// Bytes taken by `n_elements` elements, or `None` when `n_elements` is not a whole number of
    /// blocks.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }

    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|r| r.0)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for t in GgmlType::all() {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(43), None);
    }

    #[test]
    fn size_accounting() {
        assert_eq!(GgmlType::Q4K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(3), Some(12));
    }
}
