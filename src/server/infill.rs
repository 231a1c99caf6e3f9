//! `/infill`: fill-in-the-middle prompts as llama-server builds them. The request's prefix, the
//! code the client has typed so far (`prompt`) and its suffix become one token sequence around
//! the model's FIM tokens, with other files of the project (`input_extra`) before it in the
//! repository-level layout (`[FIM_REP]myproject\n[FIM_SEP]name\ntext...[FIM_SEP]filename\n`):
//!
//! `extra.. [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]`
//!
//! (`--spm-infill` puts the suffix part first). The prefix keeps its last tokens, up to three
//! quarters of a batch; the suffix its first, up to what is left of the last quarter; the extra
//! context fills what the slot's context leaves after a batch and twice the server's `n_predict`.
//! The result is an ordinary completion over those tokens.

use serde_json::Value;

use super::codec::TextCodec;
use super::request::tokenize_mixed;
use super::task::{ErrorKind, TaskError};

/// How the prompt is laid out: the server's `-b`, `-n` and `--spm-infill`, and the slot's context.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub n_batch: i64,
    pub n_predict: i64,
    pub n_ctx: i64,
    pub spm: bool,
}

/// The model's FIM prefix, suffix and middle tokens, or upstream's refusal naming the missing
/// ones.
pub fn fim_tokens(codec: &dyn TextCodec) -> Result<[u32; 3], TaskError> {
    let ids = codec.special_ids();
    match (ids.fim_pre, ids.fim_suf, ids.fim_mid) {
        (Some(pre), Some(suf), Some(mid)) => Ok([pre, suf, mid]),
        (pre, suf, mid) => {
            let mut missing = String::new();
            for (id, what) in [(pre, "prefix"), (suf, "suffix"), (mid, "middle")] {
                if id.is_none() {
                    missing.push_str(&format!("{what} token is missing. "));
                }
            }
            Err(TaskError::new(
                ErrorKind::NotSupported,
                format!("Infill is not supported by this model: {missing}"),
            ))
        }
    }
}

/// The request's fields checked as upstream checks them: `input_extra`, when present, an array of
/// `{"text": string, "filename"?: string}`. A `prompt` that is not a string is read as empty,
/// and missing `input_prefix` / `input_suffix` fail where they are read (upstream notes both
/// errors but answers from the later steps).
fn check_extra(body: &Value) -> Result<(), TaskError> {
    let Some(extra) = body.get("input_extra") else {
        return Ok(());
    };
    let Some(chunks) = extra.as_array() else {
        return Err(TaskError::invalid(
            "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
        ));
    };
    for chunk in chunks {
        if !chunk.get("text").is_some_and(Value::is_string) {
            return Err(TaskError::invalid(
                "extra_context chunk must contain a \"text\" field with a string value",
            ));
        }
        if chunk.get("filename").is_some_and(|f| !f.is_string()) {
            return Err(TaskError::invalid(
                "extra_context chunk's \"filename\" field must be a string",
            ));
        }
    }
    Ok(())
}

/// A required field, with the error upstream's JSON library raises when it is absent.
fn required<'a>(body: &'a Value, key: &str) -> Result<&'a Value, TaskError> {
    body.get(key).ok_or_else(|| {
        TaskError::invalid(format!(
            "[json.exception.out_of_range.403] key '{key}' not found"
        ))
    })
}

/// The infill prompt's tokens for request `body` (a JSON object).
pub fn prompt_tokens(
    codec: &dyn TextCodec,
    body: &Value,
    layout: Layout,
) -> Result<Vec<u32>, TaskError> {
    check_extra(body)?;
    let prompt = body.get("prompt").and_then(Value::as_str).unwrap_or("");
    let prompt = codec.tokenize(prompt, false, true);
    // upstream's compiler reads the suffix argument before the prefix
    let suffix = required(body, "input_suffix")?;
    let prefix = required(body, "input_prefix")?;
    let extra = body
        .get("input_extra")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut prefix = tokenize_mixed(codec, prefix, false, false)?;
    let mut suffix = tokenize_mixed(codec, suffix, false, false)?;
    let [pre, suf, mid] = fim_tokens(codec)?;
    let ids = codec.special_ids();
    let plain = |text: &str| codec.tokenize(text, false, false);

    let mut extra_tokens = Vec::new();
    if let Some(rep) = ids.fim_rep {
        extra_tokens.push(rep);
        extra_tokens.extend(plain("myproject\n"));
    }
    for chunk in extra {
        let text = chunk.get("text").and_then(Value::as_str).unwrap_or("");
        let name = chunk
            .get("filename")
            .and_then(Value::as_str)
            .unwrap_or("tmp");
        match ids.fim_sep {
            Some(sep) => {
                extra_tokens.push(sep);
                extra_tokens.extend(plain(&format!("{name}\n")));
            }
            None => extra_tokens.extend(plain("\n\n--- snippet ---\n\n")),
        }
        extra_tokens.extend(plain(text));
    }
    if let Some(sep) = ids.fim_sep {
        extra_tokens.push(sep);
        extra_tokens.extend(plain("filename\n"));
    }

    // the FIM part fits a batch: prefix to suffix 3:1
    let quarter = layout.n_batch / 4;
    let take_prefix = (prefix.len() as i64).min(3 * quarter.max(0)) as usize;
    let take_suffix =
        (suffix.len() as i64).min((quarter - (2 + prompt.len() as i64)).max(0)) as usize;
    let take_extra = (layout.n_ctx - layout.n_batch - 2 * layout.n_predict)
        .max(0)
        .min(extra_tokens.len() as i64) as usize;
    prefix.drain(..prefix.len() - take_prefix);
    suffix.truncate(take_suffix);
    prefix.insert(0, pre);
    prefix.extend(prompt);
    suffix.insert(0, suf);

    let (first, last) = if layout.spm {
        (suffix, prefix)
    } else {
        (prefix, suffix)
    };
    let mut out: Vec<u32> = extra_tokens[extra_tokens.len() - take_extra..].to_vec();
    if codec.add_bos() {
        out.extend(ids.bos);
    }
    out.extend(first);
    out.extend(last);
    out.push(mid);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::testing::{ByteCodec, BYTE_BOS};
    use crate::tokenizer::SpecialIds;
    use serde_json::json;

    /// Bytes as tokens, with FIM tokens past the bytes (300 PRE, 301 SUF, 302 MID, 303 REP, 304
    /// SEP); BOS (the byte codec's) is added when `bos`.
    struct Fim {
        bos: bool,
        repo: bool,
    }

    impl TextCodec for Fim {
        fn n_tokens(&self) -> usize {
            310
        }
        fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
            ByteCodec.tokenize(text, add_special, parse_special)
        }
        fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
            ByteCodec.token_to_piece(id, special)
        }
        fn detokenize(&self, tokens: &[u32], special: bool) -> Vec<u8> {
            ByteCodec.detokenize(tokens, special)
        }
        fn is_eog(&self, _: u32) -> bool {
            false
        }
        fn eog_tokens(&self) -> Vec<u32> {
            Vec::new()
        }
        fn add_bos(&self) -> bool {
            self.bos
        }
        fn special_ids(&self) -> SpecialIds {
            SpecialIds {
                bos: Some(BYTE_BOS),
                fim_pre: Some(300),
                fim_suf: Some(301),
                fim_mid: Some(302),
                fim_rep: self.repo.then_some(303),
                fim_sep: self.repo.then_some(304),
                ..SpecialIds::default()
            }
        }
    }

    fn bytes(s: &str) -> Vec<u32> {
        ByteCodec.tokenize(s, false, false)
    }

    /// `[PRE] prefix [SUF] suffix [MID]`.
    fn fim_part(prefix: &str, suffix: &str) -> Vec<u32> {
        [
            vec![300],
            bytes(prefix),
            vec![301],
            bytes(suffix),
            vec![302],
        ]
        .concat()
    }

    const WIDE: Layout = Layout {
        n_batch: 2048,
        n_predict: -1,
        n_ctx: 4096,
        spm: false,
    };

    #[test]
    fn prefix_prompt_suffix_around_the_fim_tokens() {
        let codec = Fim {
            bos: true,
            repo: false,
        };
        let body = json!({"input_prefix": "ab", "prompt": "c", "input_suffix": "de"});
        let got = prompt_tokens(&codec, &body, WIDE).unwrap();
        let want: Vec<u32> = [
            vec![BYTE_BOS, 300],
            bytes("abc"),
            vec![301],
            bytes("de"),
            vec![302],
        ]
        .concat();
        assert_eq!(got, want);
        let spm = prompt_tokens(&codec, &body, Layout { spm: true, ..WIDE }).unwrap();
        let want: Vec<u32> = [
            vec![BYTE_BOS, 301],
            bytes("de"),
            vec![300],
            bytes("abc"),
            vec![302],
        ]
        .concat();
        assert_eq!(spm, want);
    }

    #[test]
    fn extra_files_go_first_in_the_repository_layout() {
        let body = json!({
            "input_prefix": "p", "input_suffix": "s",
            "input_extra": [{"filename": "a.h", "text": "X"}, {"text": "Y"}],
        });
        let repo = Fim {
            bos: false,
            repo: true,
        };
        let got = prompt_tokens(&repo, &body, WIDE).unwrap();
        let want: Vec<u32> = [
            vec![303],
            bytes("myproject\n"),
            vec![304],
            bytes("a.h\nX"),
            vec![304],
            bytes("tmp\nY"),
            vec![304],
            bytes("filename\n"),
            fim_part("p", "s"),
        ]
        .concat();
        assert_eq!(got, want);
        // without a file separator, chunks are set apart by a snippet line
        let plain = Fim {
            bos: false,
            repo: false,
        };
        let got = prompt_tokens(&plain, &body, WIDE).unwrap();
        let snippet = bytes("\n\n--- snippet ---\n\n");
        let want: Vec<u32> = [
            snippet.clone(),
            bytes("X"),
            snippet,
            bytes("Y"),
            fim_part("p", "s"),
        ]
        .concat();
        assert_eq!(got, want);
    }

    #[test]
    fn long_parts_are_cut_to_the_batch_and_context() {
        let codec = Fim {
            bos: false,
            repo: true,
        };
        let prefix = "0123456789".repeat(3);
        let body = json!({
            "input_prefix": prefix, "prompt": "xy", "input_suffix": "abcdefghij",
            "input_extra": [{"filename": "f", "text": "0123456789"}],
        });
        // a batch of 16: 12 prefix tokens (the last), 4 - (2 + 2) = 0 suffix tokens; the
        // context leaves 40 - 16 - 2 * 4 = 16 extra tokens (the last)
        let layout = Layout {
            n_batch: 16,
            n_predict: 4,
            n_ctx: 40,
            spm: false,
        };
        let got = prompt_tokens(&codec, &body, layout).unwrap();
        let mut extra = [
            vec![303],
            bytes("myproject\n"),
            vec![304],
            bytes("f\n0123456789"),
            vec![304],
            bytes("filename\n"),
        ]
        .concat();
        extra.drain(..extra.len() - 16);
        let want: Vec<u32> = [extra, vec![300], bytes("890123456789xy"), vec![301, 302]].concat();
        assert_eq!(got, want);
    }

    #[test]
    fn bad_requests_fail_as_upstream() {
        let codec = Fim {
            bos: false,
            repo: false,
        };
        let err = |body: Value| prompt_tokens(&codec, &body, WIDE).unwrap_err().message;
        for chunk in [json!({}), json!({"filename": "ok"}), json!({"text": 4})] {
            let body = json!({"input_prefix": "", "input_suffix": "", "input_extra": [chunk]});
            assert!(err(body).contains("must contain a \"text\" field"));
        }
        let body = json!({"input_prefix": "", "input_suffix": "",
            "input_extra": [{"filename": 1, "text": "a"}]});
        assert!(err(body).contains("\"filename\" field must be a string"));
        let body = json!({"input_prefix": "", "input_suffix": "", "input_extra": 3});
        assert!(err(body).starts_with("\"input_extra\" must be an array"));
        assert_eq!(
            err(json!({"input_prefix": ""})),
            "[json.exception.out_of_range.403] key 'input_suffix' not found"
        );
        // a prompt that is not a string reads as empty
        let body = json!({"input_prefix": "a", "input_suffix": "b", "prompt": 5});
        assert_eq!(
            prompt_tokens(&codec, &body, WIDE).unwrap(),
            fim_part("a", "b")
        );
        let no_fim = fim_tokens(&ByteCodec).unwrap_err().message;
        assert_eq!(
            no_fim,
            "Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is missing. "
        );
    }
}
