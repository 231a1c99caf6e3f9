//! The file's quantization mix (`general.file_type`, llama.cpp's `llama_ftype`) and its display
//! name, as `/props` reports it (`model_ftype`). Files without the key get llama.cpp's guess:
//! the type most tensors have, marked "(guessed)".

use super::gguf::GgufFile;
use super::types::GgmlType;

/// (llama_ftype id, name), from `include/llama.h` and llama-model-loader's name table.
const NAMES: &[(u32, &str)] = &[
    (0, "all F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K - Medium"),
    (11, "Q3_K - Small"),
    (12, "Q3_K - Medium"),
    (13, "Q3_K - Large"),
    (14, "Q4_K - Small"),
    (15, "Q4_K - Medium"),
    (16, "Q5_K - Small"),
    (17, "Q5_K - Medium"),
    (18, "Q6_K"),
    (19, "IQ2_XXS - 2.0625 bpw"),
    (20, "IQ2_XS - 2.3125 bpw"),
    (21, "Q2_K - Small"),
    (22, "IQ3_XS - 3.3 bpw"),
    (23, "IQ3_XXS - 3.0625 bpw"),
    (24, "IQ1_S - 1.5625 bpw"),
    (25, "IQ4_NL - 4.5 bpw"),
    (26, "IQ3_S - 3.4375 bpw"),
    (27, "IQ3_S mix - 3.66 bpw"),
    (28, "IQ2_S - 2.5 bpw"),
    (29, "IQ2_M - 2.7 bpw"),
    (30, "IQ4_XS - 4.25 bpw"),
    (31, "IQ1_M - 1.75 bpw"),
    (32, "BF16"),
    (36, "TQ1_0 - 1.69 bpw ternary"),
    (37, "TQ2_0 - 2.06 bpw ternary"),
    (38, "MXFP4 MoE"),
    (39, "NVFP4"),
    (40, "Q1_0"),
    (41, "Q2_0"),
];

/// The ftype llama.cpp guesses from a tensor type.
fn guess(t: GgmlType) -> u32 {
    use GgmlType::*;
    match t {
        F16 => 1,
        Bf16 => 32,
        Q4_0 => 2,
        Q4_1 => 3,
        Q5_0 => 8,
        Q5_1 => 9,
        Q8_0 => 7,
        Q2K => 10,
        Q3K => 12,
        Q4K => 15,
        Q5K => 17,
        Q6K => 18,
        Tq1_0 => 36,
        Tq2_0 => 37,
        Iq2Xxs => 19,
        Iq2Xs => 20,
        Iq2S => 28,
        Iq3Xxs => 23,
        Iq1S => 24,
        Iq1M => 31,
        Iq4Nl => 25,
        Iq4Xs => 30,
        Iq3S => 26,
        Nvfp4 => 39,
        Q1_0 => 40,
        Q2_0 => 41,
        _ => 0,
    }
}

fn name_of(id: u32) -> &'static str {
    NAMES
        .iter()
        .find(|(i, _)| *i == id)
        .map_or("unknown, may not work", |(_, n)| n)
}

/// `Q4_K - Medium`, or `(guessed) Q8_0` when the file does not say.
pub fn file_type_name(gguf: &GgufFile) -> String {
    if let Some(id) = gguf.get("general.file_type").and_then(|v| v.as_i64()) {
        return name_of(u32::try_from(id).unwrap_or(u32::MAX)).to_string();
    }
    // The first type to reach the highest count wins, as in llama.cpp's loop.
    let mut counts: Vec<(GgmlType, usize)> = Vec::new();
    let mut best: Option<(GgmlType, usize)> = None;
    for t in &gguf.tensors {
        let n = match counts.iter_mut().find(|(ty, _)| *ty == t.ggml_type) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                counts.push((t.ggml_type, 1));
                1
            }
        };
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((t.ggml_type, n));
        }
    }
    let id = best.map_or(0, |(t, _)| guess(t));
    format!("(guessed) {}", name_of(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_llama_h() {
        assert_eq!(name_of(15), "Q4_K - Medium");
        assert_eq!(name_of(38), "MXFP4 MoE");
        assert_eq!(name_of(4), "unknown, may not work");
        assert_eq!(guess(GgmlType::Q4K), 15);
    }
}
