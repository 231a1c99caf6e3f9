//! Embeddings and reranking: how a prompt's hidden states become what the server returns, as
//! llama.cpp pools them (`--pooling`, the model's `{arch}.pooling_type`) and normalizes them
//! (`--embd-normalize`, a request's `embd_normalize`), and the requests and answers of
//! `/embeddings`, `/v1/embeddings` and `/rerank` in upstream's shapes.

use serde_json::{json, Value};

use super::codec::TextCodec;
use super::request;
use super::task::{EmbdResult, TaskError};

/// llama.cpp's pooling types.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's hidden state, unnormalized (`/embeddings` only).
    #[default]
    None,
    Mean,
    /// The first token's.
    Cls,
    /// The last token's.
    Last,
    /// Reranking: the last token's state (causal models without a classifier head), its first
    /// value the score.
    Rank,
}

impl Pooling {
    /// `--pooling`'s names.
    pub fn from_name(name: &str) -> Option<Pooling> {
        Some(match name {
            "none" => Pooling::None,
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            "last" => Pooling::Last,
            "rank" => Pooling::Rank,
            _ => return None,
        })
    }

    /// The GGUF key's values (`LLAMA_POOLING_TYPE_*`); unknown ones are none, as an absent key.
    pub fn from_gguf(v: u32) -> Pooling {
        match v {
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            4 => Pooling::Rank,
            _ => Pooling::None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }

    /// Whether position `pos` of an `n`-token prompt needs its hidden state.
    pub fn wants(self, pos: usize, n: usize) -> bool {
        match self {
            Pooling::None | Pooling::Mean => true,
            Pooling::Cls => pos == 0,
            Pooling::Last | Pooling::Rank => pos + 1 == n,
        }
    }

    /// Whether a prompt may be evaluated over several steps (upstream's `can_split`): only when
    /// the pooled state is the last token's, which a causal model's cache carries to it.
    /// Otherwise upstream wants the whole prompt in one ubatch.
    pub fn can_split(self) -> bool {
        matches!(self, Pooling::Last | Pooling::Rank)
    }
}

/// One prompt's hidden states on their way to its result.
#[derive(Clone, Debug)]
pub struct Pooler {
    pooling: Pooling,
    n_tokens: usize,
    rows: Vec<Vec<f32>>,
    sum: Vec<f32>,
}

impl Pooler {
    pub fn new(pooling: Pooling, n_embd: usize, n_tokens: usize) -> Pooler {
        Pooler {
            pooling,
            n_tokens,
            rows: Vec::new(),
            sum: if pooling == Pooling::Mean {
                vec![0.0; n_embd]
            } else {
                Vec::new()
            },
        }
    }

    /// The hidden state of a position [`Pooling::wants`] (in prompt order).
    pub fn add(&mut self, row: &[f32]) {
        if self.pooling == Pooling::Mean {
            let w = 1.0 / self.n_tokens.max(1) as f32;
            self.sum.iter_mut().zip(row).for_each(|(s, &x)| *s += x * w);
        } else {
            self.rows.push(row.to_vec());
        }
    }

    /// The result: every row as it came (pooling none), else the one pooled vector, normalized
    /// by `normalize` (`common_embd_normalize`'s modes) or left as it is when `None` (a
    /// reranking score reads it raw).
    pub fn finish(self, normalize: Option<i32>) -> Vec<Vec<f32>> {
        let pooled = match self.pooling {
            Pooling::None => return self.rows,
            Pooling::Mean => self.sum,
            _ => self.rows.into_iter().next().unwrap_or_default(),
        };
        vec![match normalize {
            Some(mode) => normalized(&pooled, mode),
            None => pooled,
        }]
    }
}

/// `v` scaled by llama.cpp's `common_embd_normalize`: -1 none, 0 max absolute (to int16's
/// range), 2 Euclidean, any other p the p-norm; a zero norm gives zeros.
pub fn normalized(v: &[f32], mode: i32) -> Vec<f32> {
    let sum: f64 = match mode {
        -1 => 1.0,
        0 => v.iter().fold(0.0f64, |m, &x| m.max(f64::from(x.abs()))) / 32760.0,
        2 => v.iter().map(|&x| f64::from(x * x)).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|&x| f64::from(x.abs()).powi(p))
            .sum::<f64>()
            .powf(1.0 / f64::from(p)),
    };
    let norm = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    v.iter().map(|&x| x * norm).collect()
}

/// An embeddings request's prompts (`input` or `content`): one prompt, or a list of them; each
/// a string, token ids, strings and ids mixed, an object with `prompt_string`, or an object
/// whose `content` is an array of OpenAI text parts. Special tokens are added and parsed.
pub fn embedding_inputs(codec: &dyn TextCodec, prompt: &Value) -> Result<Vec<Vec<u32>>, TaskError> {
    let entries = request::subprompts(prompt);
    if entries.is_empty() {
        return Err(TaskError::invalid("\"input\" must not be empty"));
    }
    let tokens = entries
        .into_iter()
        .map(|p| match p.get("content") {
            Some(content) => content_parts_tokens(codec, content),
            None => request::tokenize_subprompt(codec, p, true, true),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if tokens.iter().any(Vec::is_empty) {
        return Err(TaskError::invalid("Input content cannot be empty"));
    }
    Ok(tokens)
}

/// `tokenize_oai_content_array`: the text parts joined, then tokenized; this model takes no
/// media.
fn content_parts_tokens(codec: &dyn TextCodec, content: &Value) -> Result<Vec<u32>, TaskError> {
    let parts = content
        .as_array()
        .ok_or_else(|| TaskError::invalid("\"content\" must be an array"))?;
    let mut text = String::new();
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(part.get("text").and_then(Value::as_str).unwrap_or("")),
            Some(t @ ("image_url" | "input_audio" | "input_video")) => {
                return Err(TaskError::invalid(format!(
                    "{t} is not supported by this model (no multimodal projector)"
                )))
            }
            other => {
                return Err(TaskError::invalid(format!(
                    "unsupported content[].type: {}",
                    other.unwrap_or("(none)")
                )))
            }
        }
    }
    Ok(codec.tokenize(&text, true, true))
}

/// `format_prompt_rerank`: the model's rerank template (`{query}` and `{document}` filled in,
/// special tokens parsed), else BOS, query, EOS, SEP, document, EOS as the vocabulary adds them
/// (EOS falls back to SEP).
pub fn rerank_prompt(
    codec: &dyn TextCodec,
    template: Option<&str>,
    query: &str,
    doc: &str,
) -> Vec<u32> {
    if let Some(t) = template {
        let prompt = t.replace("{query}", query).replace("{document}", doc);
        return codec.tokenize(&prompt, false, true);
    }
    let ids = codec.special_ids();
    let eos = ids.eos.or(ids.sep);
    let mut out = Vec::new();
    if codec.add_bos() {
        out.extend(ids.bos);
    }
    out.extend(codec.tokenize(query, false, false));
    if codec.add_eos() {
        out.extend(eos);
    }
    if codec.add_sep() {
        out.extend(ids.sep);
    }
    out.extend(codec.tokenize(doc, false, false));
    if codec.add_eos() {
        out.extend(eos);
    }
    out
}

/// `/v1/embeddings`' answer (`format_embeddings_response_oaicompat`): the pooled vectors in
/// input order, as floats or base64 of their little-endian bytes.
pub fn oai_embeddings(body: &Value, model: &str, results: &[EmbdResult], base64: bool) -> Value {
    let n_tokens: usize = results.iter().map(|r| r.n_tokens).sum();
    let data: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let v = r.rows.first().map(Vec::as_slice).unwrap_or(&[]);
            if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!({"embedding": base64_encode(&bytes), "index": i, "object": "embedding",
                       "encoding_format": "base64"})
            } else {
                json!({"embedding": v, "index": i, "object": "embedding"})
            }
        })
        .collect();
    json!({
        "model": body.get("model").and_then(Value::as_str).unwrap_or(model),
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "data": data,
    })
}

/// `/embeddings`' answer: per prompt its index and rows (one pooled vector, or every
/// token's with pooling none).
pub fn native_embeddings(results: &[EmbdResult]) -> Value {
    Value::Array(
        results
            .iter()
            .map(|r| json!({"index": r.index, "embedding": r.rows}))
            .collect(),
    )
}

/// `/rerank`'s answer (`format_response_rerank`): documents by descending score, cut to
/// `top_n`; Jina's shape, or TEI's (`texts` in the request) with `return_text`.
pub fn rerank_response(
    body: &Value,
    model: &str,
    scores: &[(usize, f32, usize)],
    tei: bool,
    docs: &[String],
    top_n: usize,
) -> Value {
    let label = if tei { "score" } else { "relevance_score" };
    let return_text = tei && body.get("return_text").and_then(Value::as_bool) == Some(true);
    let mut ranked: Vec<&(usize, f32, usize)> = scores.iter().collect();
    // a stable sort, as the scores' order among equals is the documents'
    ranked.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
    let n_tokens: usize = scores.iter().map(|s| s.2).sum();
    let results: Vec<Value> = ranked
        .into_iter()
        .take(top_n)
        .map(|&(index, score, _)| {
            let mut e = json!({"index": index, label: score});
            if return_text {
                e["text"] = json!(docs.get(index).cloned().unwrap_or_default());
            }
            e
        })
        .collect();
    if tei {
        return Value::Array(results);
    }
    json!({
        "model": body.get("model").and_then(Value::as_str).unwrap_or(model),
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": results,
    })
}

fn base64_encode(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_names_and_gguf_values_are_llamas() {
        for p in [
            Pooling::None,
            Pooling::Mean,
            Pooling::Cls,
            Pooling::Last,
            Pooling::Rank,
        ] {
            assert_eq!(Pooling::from_name(p.name()), Some(p));
        }
        assert_eq!(Pooling::from_name("max"), None);
        let gguf: Vec<Pooling> = (0..6).map(Pooling::from_gguf).collect();
        assert_eq!(
            gguf,
            [
                Pooling::None,
                Pooling::Mean,
                Pooling::Cls,
                Pooling::Last,
                Pooling::Rank,
                Pooling::None
            ]
        );
    }

    #[test]
    fn pooling_picks_the_positions_it_reads() {
        let picked = |p: Pooling| (0..4).filter(|&i| p.wants(i, 4)).collect::<Vec<_>>();
        assert_eq!(picked(Pooling::None), [0, 1, 2, 3]);
        assert_eq!(picked(Pooling::Mean), [0, 1, 2, 3]);
        assert_eq!(picked(Pooling::Cls), [0]);
        assert_eq!(picked(Pooling::Last), [3]);
        assert_eq!(picked(Pooling::Rank), [3]);
        assert!(Pooling::Last.can_split() && Pooling::Rank.can_split());
        assert!(!Pooling::Mean.can_split() && !Pooling::None.can_split());
    }

    #[test]
    fn poolers_average_keep_or_pick_rows() {
        let rows = [[1.0f32, 2.0], [3.0, 6.0]];
        let mut mean = Pooler::new(Pooling::Mean, 2, 2);
        let mut none = Pooler::new(Pooling::None, 2, 2);
        for r in &rows {
            mean.add(r);
            none.add(r);
        }
        assert_eq!(mean.finish(Some(-1)), vec![vec![2.0, 4.0]]);
        assert_eq!(none.finish(Some(2)), vec![vec![1.0, 2.0], vec![3.0, 6.0]]);
        let mut last = Pooler::new(Pooling::Rank, 2, 2);
        last.add(&rows[1]);
        assert_eq!(last.finish(None), vec![vec![3.0, 6.0]]);
        let mut last = Pooler::new(Pooling::Last, 2, 2);
        last.add(&rows[1]);
        let v = &last.finish(Some(2))[0];
        assert!(
            (v[0] - 3.0 / 45f32.sqrt()).abs() < 1e-6 && (v[1] - 6.0 / 45f32.sqrt()).abs() < 1e-6
        );
    }

    #[test]
    fn normalization_modes_match_common_embd_normalize() {
        let v = [3.0f32, -4.0];
        assert_eq!(normalized(&v, -1), vec![3.0, -4.0]);
        // as upstream: each value times the norm's reciprocal, in f32
        assert_eq!(normalized(&v, 2), vec![3.0 * 0.2f32, -4.0 * 0.2f32]);
        let seventh = (1.0 / 7.0f64) as f32;
        assert_eq!(normalized(&v, 1), vec![3.0 * seventh, -4.0 * seventh]);
        let m = normalized(&v, 0);
        assert!((m[1] + 32760.0).abs() < 1e-2 && (m[0] - 24570.0).abs() < 1e-2);
        let p3 = 91f64.powf(1.0 / 3.0) as f32;
        let c = normalized(&v, 3);
        assert!((c[0] - 3.0 / p3).abs() < 1e-6);
        assert_eq!(normalized(&[0.0, 0.0], 2), vec![0.0, 0.0]);
    }

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(&1.0f32.to_le_bytes()), "AACAPw==");
    }

    #[test]
    fn rerank_answers_sort_cut_and_shape_as_upstream() {
        let scores = [(0, 0.5, 3), (1, 2.0, 4), (2, -1.0, 5)];
        let docs: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let jina = rerank_response(&json!({}), "m", &scores, false, &docs, 2);
        assert_eq!(
            jina,
            json!({"model": "m", "object": "list",
                   "usage": {"prompt_tokens": 12, "total_tokens": 12},
                   "results": [{"index": 1, "relevance_score": 2.0},
                               {"index": 0, "relevance_score": 0.5}]})
        );
        let tei = rerank_response(&json!({"return_text": true}), "m", &scores, true, &docs, 9);
        assert_eq!(
            tei,
            json!([{"index": 1, "score": 2.0, "text": "b"}, {"index": 0, "score": 0.5, "text": "a"},
                   {"index": 2, "score": -1.0, "text": "c"}])
        );
    }

    #[test]
    fn embedding_answers_carry_usage_and_rows() {
        let r = [
            EmbdResult {
                index: 0,
                rows: vec![vec![1.0, 0.0]],
                n_tokens: 3,
            },
            EmbdResult {
                index: 1,
                rows: vec![vec![0.0, 1.0]],
                n_tokens: 4,
            },
        ];
        let oai = oai_embeddings(&json!({"model": "x"}), "m", &r, false);
        assert_eq!(oai["model"], "x");
        assert_eq!(oai["usage"], json!({"prompt_tokens": 7, "total_tokens": 7}));
        assert_eq!(
            oai["data"][1],
            json!({"embedding": [0.0, 1.0], "index": 1, "object": "embedding"})
        );
        let b = oai_embeddings(&json!({}), "m", &r[..1], true);
        assert_eq!(b["data"][0]["embedding"], "AACAPwAAAAA=");
        assert_eq!(b["data"][0]["encoding_format"], "base64");
        assert_eq!(
            native_embeddings(&r[..1]),
            json!([{"index": 0, "embedding": [[1.0, 0.0]]}])
        );
    }
}
