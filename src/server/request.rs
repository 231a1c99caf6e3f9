//! Request bodies to task parameters and prompt tokens, with upstream's field names, aliases,
//! limits (clamped or refused) and error messages (`server-schema.cpp`, `server-common.cpp`).

use serde_json::Value;

use super::codec::TextCodec;
use super::task::{TaskError, TaskParams};
use crate::grammar::schema;
use crate::sampling::{GrammarOrigin, GrammarSource, GrammarTrigger, SamplerType};

/// What a field parser needs besides the body.
pub struct ParseContext<'a> {
    pub codec: &'a dyn TextCodec,
    pub n_vocab: usize,
    pub n_parallel: usize,
}

/// A JSON value's type as nlohmann::json names it in its errors.
pub(super) fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_error(expected: &str, v: &Value) -> String {
    format!(
        "[json.exception.type_error.302] type must be {expected}, but is {}",
        json_type_name(v)
    )
}

fn field_error(name: &str, why: impl std::fmt::Display) -> TaskError {
    TaskError::invalid(format!("Field '{name}': {why}"))
}

/// The first present, non-null name among `names`, with its value.
fn lookup<'a>(body: &'a Value, names: &[&'a str]) -> Option<(&'a str, &'a Value)> {
    names
        .iter()
        .find_map(|&n| body.get(n).filter(|v| !v.is_null()).map(|v| (n, v)))
}

pub fn as_i64(v: &Value) -> Result<i64, String> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|u| u as i64))
            .or_else(|| n.as_f64().map(|f| f as i64))
            .ok_or_else(|| type_error("number", v)),
        Value::Bool(b) => Ok(i64::from(*b)),
        _ => Err(type_error("number", v)),
    }
}

pub fn as_f32(v: &Value) -> Result<f32, String> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .map(|f| f as f32)
            .ok_or_else(|| type_error("number", v)),
        Value::Bool(b) => Ok(f32::from(u8::from(*b))),
        _ => Err(type_error("number", v)),
    }
}

pub fn as_bool(v: &Value) -> Result<bool, String> {
    v.as_bool().ok_or_else(|| type_error("boolean", v))
}

fn as_string(v: &Value) -> Result<String, String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| type_error("string", v))
}

/// An integer field clamped into `[min, max]`.
fn int_soft(
    body: &Value,
    names: &[&str],
    min: i64,
    max: i64,
    out: &mut i32,
) -> Result<(), TaskError> {
    if let Some((n, v)) = lookup(body, names) {
        let x = as_i64(v).map_err(|e| field_error(n, e))?;
        *out = x.clamp(min, max) as i32;
    }
    Ok(())
}

/// An integer field refused outside `[min, max]`.
fn int_hard(
    body: &Value,
    names: &[&str],
    min: i64,
    max: i64,
    out: &mut i32,
) -> Result<(), TaskError> {
    if let Some((n, v)) = lookup(body, names) {
        let x = as_i64(v).map_err(|e| field_error(n, e))?;
        if x < min || x > max {
            return Err(field_error(
                n,
                format!("Value must be between {min} <= value <= {max}, but got {x}"),
            ));
        }
        *out = x as i32;
    }
    Ok(())
}

fn float_soft(
    body: &Value,
    names: &[&str],
    min: f32,
    max: f32,
    out: &mut f32,
) -> Result<(), TaskError> {
    if let Some((n, v)) = lookup(body, names) {
        let x = as_f32(v).map_err(|e| field_error(n, e))?;
        *out = x.clamp(min, max);
    }
    Ok(())
}

fn boolean(body: &Value, names: &[&str], out: &mut bool) -> Result<(), TaskError> {
    if let Some((n, v)) = lookup(body, names) {
        *out = as_bool(v).map_err(|e| field_error(n, e))?;
    }
    Ok(())
}

const I32_MAX: i64 = i32::MAX as i64;

/// Upstream's completion schema applied over `base` (the server's defaults).
pub fn parse_task_params(
    body: &Value,
    base: &TaskParams,
    ctx: &ParseContext<'_>,
) -> Result<TaskParams, TaskError> {
    if !body.is_object() {
        return Err(TaskError::invalid(type_error("object", body)));
    }
    let mut p = base.clone();
    boolean(body, &["verbose"], &mut p.verbose)?;
    boolean(body, &["timings_per_token"], &mut p.timings_per_token)?;
    boolean(body, &["stream"], &mut p.stream)?;
    if let Some(opts) = body.get("stream_options").filter(|v| v.is_object()) {
        boolean(opts, &["include_usage"], &mut p.include_usage)?;
    }
    boolean(body, &["cache_prompt"], &mut p.cache_prompt)?;
    boolean(body, &["return_tokens"], &mut p.return_tokens)?;
    boolean(body, &["return_progress"], &mut p.return_progress)?;
    int_hard(
        body,
        &["n_predict", "max_completion_tokens", "max_tokens"],
        -1,
        I32_MAX,
        &mut p.n_predict,
    )?;
    int_hard(body, &["n_indent"], 0, I32_MAX, &mut p.n_indent)?;
    int_hard(body, &["n_keep"], -1, I32_MAX, &mut p.n_keep)?;
    int_hard(body, &["n_discard"], 0, I32_MAX, &mut p.n_discard)?;
    int_hard(
        body,
        &["n_cmpl", "n"],
        1,
        ctx.n_parallel as i64,
        &mut p.n_cmpl,
    )?;
    int_hard(body, &["n_cache_reuse"], 0, I32_MAX, &mut p.n_cache_reuse)?;
    if let Some((n, v)) = lookup(body, &["t_max_predict_ms"]) {
        let x = as_i64(v).map_err(|e| field_error(n, e))?;
        if x < -1 {
            return Err(field_error(
                n,
                format!(
                    "Value must be between -1 <= value <= {} , but got {x}",
                    i64::MAX
                ),
            ));
        }
        p.t_max_predict_ms = x;
    }
    if let Some(v) = body.get("response_fields").filter(|v| !v.is_null()) {
        p.response_fields = string_list(v).map_err(|e| field_error("response_fields", e))?;
    }

    let s = &mut p.sampling;
    int_soft(body, &["top_k"], 0, I32_MAX, &mut s.top_k)?;
    float_soft(body, &["top_p"], 0.0, 1.0, &mut s.top_p)?;
    float_soft(body, &["min_p"], 0.0, 1.0, &mut s.min_p)?;
    float_soft(
        body,
        &["top_n_sigma"],
        f32::MIN,
        f32::MAX,
        &mut s.top_n_sigma,
    )?;
    float_soft(body, &["xtc_probability"], 0.0, 1.0, &mut s.xtc_probability)?;
    float_soft(body, &["xtc_threshold"], 0.0, 1.0, &mut s.xtc_threshold)?;
    float_soft(body, &["typical_p"], f32::MIN, f32::MAX, &mut s.typ_p)?;
    float_soft(body, &["temperature"], 0.0, f32::INFINITY, &mut s.temp)?;
    float_soft(
        body,
        &["dynatemp_range"],
        f32::MIN,
        f32::MAX,
        &mut s.dynatemp_range,
    )?;
    float_soft(
        body,
        &["dynatemp_exponent"],
        f32::MIN,
        f32::MAX,
        &mut s.dynatemp_exponent,
    )?;
    int_hard(body, &["repeat_last_n"], 0, I32_MAX, &mut s.penalty_last_n)?;
    float_soft(
        body,
        &["repeat_penalty"],
        f32::MIN,
        f32::MAX,
        &mut s.penalty_repeat,
    )?;
    float_soft(
        body,
        &["frequency_penalty"],
        f32::MIN,
        f32::MAX,
        &mut s.penalty_freq,
    )?;
    float_soft(
        body,
        &["presence_penalty"],
        f32::MIN,
        f32::MAX,
        &mut s.penalty_present,
    )?;
    float_soft(
        body,
        &["dry_multiplier"],
        f32::MIN,
        f32::MAX,
        &mut s.dry_multiplier,
    )?;
    if let Some((n, v)) = lookup(body, &["dry_base"]) {
        let x = as_f32(v).map_err(|e| field_error(n, e))?;
        s.dry_base = if x < 1.0 { base.sampling.dry_base } else { x };
    }
    int_hard(
        body,
        &["dry_allowed_length"],
        0,
        I32_MAX,
        &mut s.dry_allowed_length,
    )?;
    int_hard(
        body,
        &["dry_penalty_last_n"],
        0,
        I32_MAX,
        &mut s.dry_penalty_last_n,
    )?;
    int_soft(body, &["mirostat"], 0, 2, &mut s.mirostat)?;
    float_soft(
        body,
        &["mirostat_tau"],
        f32::MIN,
        f32::MAX,
        &mut s.mirostat_tau,
    )?;
    float_soft(
        body,
        &["mirostat_eta"],
        f32::MIN,
        f32::MAX,
        &mut s.mirostat_eta,
    )?;
    if let Some((n, v)) = lookup(body, &["seed"]) {
        // Upstream reads the seed as a 32-bit integer: -1 wraps to the "random" seed.
        s.seed = as_i64(v).map_err(|e| field_error(n, e))? as u32;
    }
    int_soft(
        body,
        &["n_probs", "logprobs"],
        i64::from(i32::MIN),
        I32_MAX,
        &mut s.n_probs,
    )?;
    int_hard(body, &["min_keep"], 0, I32_MAX, &mut s.min_keep)?;
    boolean(body, &["post_sampling_probs"], &mut p.post_sampling_probs)?;
    let s = &mut p.sampling;
    if let Some(v) = body.get("dry_sequence_breakers").filter(|v| !v.is_null()) {
        let list = string_list(v).map_err(|e| field_error("dry_sequence_breakers", e))?;
        if list.is_empty() {
            return Err(field_error(
                "dry_sequence_breakers",
                "Error: dry_sequence_breakers must be a non-empty array of strings",
            ));
        }
        s.dry_sequence_breakers = list;
    }
    if let Some(v) = body.get("logit_bias").filter(|v| !v.is_null()) {
        s.logit_bias = parse_logit_bias(v, ctx);
    }
    if let Some((n, v)) = lookup(body, &["ignore_eos"]) {
        s.ignore_eos = as_bool(v).map_err(|e| field_error(n, e))?;
        if s.ignore_eos {
            s.logit_bias.extend(
                ctx.codec
                    .eog_tokens()
                    .into_iter()
                    .map(|t| (t, f32::NEG_INFINITY)),
            );
        }
    }
    if let Some(v) = body.get("stop").filter(|v| !v.is_null()) {
        let mut stops = Vec::new();
        match v {
            Value::Array(items) => {
                for w in items {
                    let w = as_string(w).map_err(|e| field_error("stop", e))?;
                    if !w.is_empty() {
                        stops.push(w);
                    }
                }
            }
            Value::String(w) => stops.push(w.clone()),
            _ => {}
        }
        p.stop = if stops.is_empty() {
            base.stop.clone()
        } else {
            stops
        };
    }
    parse_grammar(body, &mut p)?;
    boolean(body, &["grammar_lazy"], &mut p.sampling.grammar_lazy)?;
    if let Some((n, v)) = lookup(body, &["generation_prompt"]) {
        p.generation_prompt = as_string(v).map_err(|e| field_error(n, e))?;
    }
    // what a chat request's template delimits messages with (upstream skips entries that are
    // not objects, and a missing role or text reads as empty)
    if let Some(Value::Array(delims)) = body.get("message_delimiters") {
        p.message_delimiters = delims
            .iter()
            .filter_map(Value::as_object)
            .map(|d| {
                let text = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                (text("role"), text("delimiter"))
            })
            .collect();
    }
    parse_triggers(body, ctx, &mut p)?;
    parse_reasoning_budget(body, ctx, &mut p)?;
    if let Some(v) = body.get("samplers").filter(|v| !v.is_null()) {
        match v {
            Value::Array(_) => {
                let names = string_list(v).map_err(|e| field_error("samplers", e))?;
                p.sampling.samplers = SamplerType::parse_names(&names);
            }
            Value::String(letters) => p.sampling.samplers = SamplerType::parse_letters(letters),
            _ => {}
        }
    }
    if let Some(v) = body.get("lora").filter(|v| !v.is_null()) {
        if !v.is_array() {
            return Err(field_error(
                "lora",
                "Error: 'lora' must be an array of objects with 'id' and 'scale' fields",
            ));
        }
    }
    Ok(p)
}

/// `json_schema` and `grammar`, one field with an alias upstream: a schema is converted when
/// there is no `grammar` key; otherwise a string `grammar` is GBNF (from a chat template's tool
/// calls when `grammar_type` says so, the user's otherwise) and any other value is ignored.
fn parse_grammar(body: &Value, p: &mut TaskParams) -> Result<(), TaskError> {
    if let Some(text) =
        schema::completion_schema_grammar(body).map_err(|e| field_error("json_schema", e))?
    {
        p.sampling.grammar = Some(GrammarSource {
            text,
            origin: GrammarOrigin::Schema,
        });
        return Ok(());
    }
    let text = body.get("grammar").and_then(Value::as_str).unwrap_or("");
    if !text.is_empty() {
        let tool_calls = body.get("grammar_type").and_then(Value::as_str) == Some("tool_calls");
        p.sampling.grammar = Some(GrammarSource {
            text: text.to_string(),
            origin: if tool_calls {
                GrammarOrigin::ToolCalls
            } else {
                GrammarOrigin::User
            },
        });
    }
    Ok(())
}

/// `preserved_tokens` (texts that are one token each) and `grammar_triggers` (`{"type", "value",
/// "token"}`, upstream's trigger kinds by number); a trigger word that is a single token becomes
/// a token trigger and must be preserved.
fn parse_triggers(
    body: &Value,
    ctx: &ParseContext<'_>,
    p: &mut TaskParams,
) -> Result<(), TaskError> {
    let s = &mut p.sampling;
    if let Some(v) = body.get("preserved_tokens").filter(|v| !v.is_null()) {
        let list = string_list(v).map_err(|e| field_error("preserved_tokens", e))?;
        for t in list.iter().filter_map(|t| ctx.codec.single_token(t)) {
            if !s.preserved_tokens.contains(&t) {
                s.preserved_tokens.push(t);
            }
        }
    }
    let Some(v) = body.get("grammar_triggers").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let fail = |e: String| field_error("grammar_triggers", e);
    let items = v.as_array().ok_or_else(|| fail(type_error("array", v)))?;
    for t in items {
        let key = |k: &str| {
            t.get(k).ok_or_else(|| {
                fail(format!(
                    "[json.exception.out_of_range.403] key '{k}' not found"
                ))
            })
        };
        let kind = as_i64(key("type")?).map_err(fail)?;
        let value = as_string(key("value")?).map_err(fail)?;
        let trigger = match kind {
            0 => GrammarTrigger::Token {
                token: as_i64(key("token")?).map_err(fail)? as u32,
                word: value,
            },
            1 => match ctx.codec.single_token(&value) {
                Some(token) if s.preserved_tokens.contains(&token) => {
                    GrammarTrigger::Token { token, word: value }
                }
                Some(_) => {
                    return Err(fail(format!(
                        "Grammar trigger word should be marked as preserved token: {value}"
                    )))
                }
                None => GrammarTrigger::Word(value),
            },
            2 => GrammarTrigger::Pattern(value),
            3 => GrammarTrigger::PatternFull(value),
            other => return Err(fail(format!("unknown grammar trigger type {other}"))),
        };
        s.grammar_triggers.push(trigger);
    }
    if s.grammar_lazy && s.grammar_triggers.is_empty() {
        return Err(fail("Error: no triggers set for lazy grammar!".into()));
    }
    Ok(())
}

/// `reasoning_control`, `reasoning_budget_tokens`, `reasoning_budget_start_tag`,
/// `reasoning_budget_end_tags` (or one `reasoning_budget_end_tag`) and
/// `reasoning_budget_message`, read in upstream's order: the message goes before the first end
/// tag in what is forced, and nothing is forced unless the message field is present.
fn parse_reasoning_budget(
    body: &Value,
    ctx: &ParseContext<'_>,
    p: &mut TaskParams,
) -> Result<(), TaskError> {
    let s = &mut p.sampling;
    let tokens = |text: &str| ctx.codec.tokenize(text, false, true);
    boolean(body, &["reasoning_control"], &mut s.reasoning_control)?;
    int_hard(
        body,
        &["reasoning_budget_tokens"],
        -1,
        I32_MAX,
        &mut s.reasoning_budget_tokens,
    )?;
    if let Some((n, v)) = lookup(body, &["reasoning_budget_start_tag"]) {
        s.reasoning_start = tokens(&as_string(v).map_err(|e| field_error(n, e))?);
    }
    if let Some((n, _)) = lookup(
        body,
        &["reasoning_budget_end_tags", "reasoning_budget_end_tag"],
    ) {
        s.reasoning_ends.clear();
        // upstream reads the list whenever its key is there, even as null (no tags then)
        let tags = match body.get("reasoning_budget_end_tags") {
            Some(Value::Null) => Vec::new(),
            Some(list @ Value::Array(_)) => string_list(list).map_err(|e| field_error(n, e))?,
            Some(one) => vec![as_string(one).map_err(|e| field_error(n, e))?],
            None => {
                vec![as_string(&body["reasoning_budget_end_tag"]).map_err(|e| field_error(n, e))?]
            }
        };
        s.reasoning_ends = tags
            .iter()
            .filter(|t| !t.is_empty())
            .map(|t| tokens(t))
            .collect();
    }
    if let Some(v) = body
        .get("reasoning_budget_message")
        .filter(|v| !v.is_null())
    {
        // upstream reads it leniently: a value that is not a string counts as ""
        let message = v.as_str().unwrap_or_default();
        if let Some(end) = s.reasoning_ends.first() {
            let mut forced = tokens(message);
            forced.extend_from_slice(end);
            s.reasoning_forced = forced;
        }
    }
    Ok(())
}

fn string_list(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::Array(items) => items.iter().map(as_string).collect(),
        other => Err(type_error("array", other)),
    }
}

/// `[[token or text, bias], ...]` or `{"token or text": bias}`; `false` bans. Entries that do not
/// parse are skipped, as upstream does.
fn parse_logit_bias(v: &Value, ctx: &ParseContext<'_>) -> Vec<(u32, f32)> {
    let bias_of = |b: &Value| match b {
        Value::Number(n) => n.as_f64().map(|f| f as f32),
        Value::Bool(false) => Some(f32::NEG_INFINITY),
        _ => None,
    };
    let mut out = Vec::new();
    let add_text = |text: &str, bias: f32, out: &mut Vec<(u32, f32)>| {
        for t in ctx.codec.tokenize(text, false, false) {
            out.push((t, bias));
        }
    };
    match v {
        Value::Array(items) => {
            for el in items {
                let Some([key, b]) = el
                    .as_array()
                    .map(Vec::as_slice)
                    .and_then(|s| <&[Value; 2]>::try_from(s).ok())
                else {
                    continue;
                };
                let Some(bias) = bias_of(b) else { continue };
                if let Some(tok) = key.as_i64() {
                    if tok >= 0 && (tok as usize) < ctx.n_vocab {
                        out.push((tok as u32, bias));
                    }
                } else if let Some(text) = key.as_str() {
                    add_text(text, bias, &mut out);
                }
            }
        }
        Value::Object(map) => {
            for (key, b) in map {
                let Some(bias) = bias_of(b) else { continue };
                match key.parse::<i64>() {
                    Ok(tok) => {
                        if tok >= 0 && (tok as usize) < ctx.n_vocab {
                            out.push((tok as u32, bias));
                        }
                    }
                    Err(_) => add_text(key, bias, &mut out),
                }
            }
        }
        _ => {}
    }
    out
}

fn is_array_of_numbers(v: &Value) -> bool {
    v.as_array()
        .is_some_and(|a| a.iter().all(|e| e.is_i64() || e.is_u64()))
}

fn is_mixed(v: &Value) -> bool {
    v.as_array().is_some_and(|a| {
        a.iter().any(Value::is_string) && a.iter().any(|e| e.is_i64() || e.is_u64())
    })
}

fn token_of(v: &Value) -> Result<u32, TaskError> {
    v.as_i64()
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| TaskError::invalid("Prompt contains invalid tokens"))
}

/// A string, or a list of strings and token ids; only the first string gets BOS.
pub fn tokenize_mixed(
    codec: &dyn TextCodec,
    prompt: &Value,
    add_special: bool,
    parse_special: bool,
) -> Result<Vec<u32>, TaskError> {
    match prompt {
        Value::Array(items) => {
            let mut out = Vec::new();
            let mut first = true;
            for p in items {
                if let Some(s) = p.as_str() {
                    out.extend(codec.tokenize(s, add_special && first, parse_special));
                } else {
                    out.push(token_of(p)?);
                }
                first = false;
            }
            Ok(out)
        }
        Value::String(s) => Ok(codec.tokenize(s, add_special, parse_special)),
        other => Err(TaskError::invalid(type_error("string", other))),
    }
}

/// One or several prompts (`tokenize_input_prompts`).
pub fn tokenize_prompts(
    codec: &dyn TextCodec,
    prompt: &Value,
    add_special: bool,
    parse_special: bool,
) -> Result<Vec<Vec<u32>>, TaskError> {
    let subprompts = subprompts(prompt);
    if subprompts.is_empty() {
        return Err(TaskError::invalid("\"prompt\" must not be empty"));
    }
    subprompts
        .into_iter()
        .map(|p| tokenize_subprompt(codec, p, add_special, parse_special))
        .collect()
}

/// The prompts a request's prompt field holds: each item of a list, unless the list holds a
/// token id (then it is one prompt of ids, or of strings and ids mixed).
pub fn subprompts(prompt: &Value) -> Vec<&Value> {
    let contains_numbers = prompt
        .as_array()
        .is_some_and(|a| a.iter().any(|e| e.is_i64() || e.is_u64()));
    match prompt {
        Value::Array(items) if !contains_numbers => items.iter().collect(),
        other => vec![other],
    }
}

/// One prompt (`tokenize_input_subprompt`): a string, a list of token ids, a list of strings
/// and ids, or an object with `prompt_string`.
pub fn tokenize_subprompt(
    codec: &dyn TextCodec,
    p: &Value,
    add_special: bool,
    parse_special: bool,
) -> Result<Vec<u32>, TaskError> {
    if p.is_string() || is_mixed(p) {
        tokenize_mixed(codec, p, add_special, parse_special)
    } else if is_array_of_numbers(p) {
        p.as_array()
            .map(|a| a.iter().map(token_of).collect())
            .unwrap_or_else(|| Ok(Vec::new()))
    } else if let Some(inner) = p.get("prompt_string") {
        if p.get("multimodal_data").is_some() {
            return Err(TaskError::invalid(
                "Multimodal data provided, but model does not support multimodal requests.",
            ));
        }
        tokenize_mixed(codec, inner, add_special, parse_special)
    } else {
        Err(TaskError::invalid("\"prompt\" elements must be a string, a list of tokens, a JSON object containing a prompt string, or a list of mixed strings & tokens."))
    }
}

/// Upstream's `fs_validate_filename` without subdirectories.
pub fn valid_filename(name: &str) -> bool {
    if name.is_empty() || name.len() > 255 {
        return false;
    }
    let forbidden = |c: char| {
        let u = c as u32;
        u <= 0x1F
            || u == 0x7F
            || (0x80..=0x9F).contains(&u)
            || matches!(u, 0xFF0E | 0x2215 | 0x2216 | 0xFFFD | 0xFEFF)
            || matches!(c, ':' | '*' | '?' | '"' | '<' | '>' | '|' | '/' | '\\')
    };
    if name.chars().any(forbidden) {
        return false;
    }
    !(name.starts_with(' ')
        || name.ends_with(' ')
        || name.ends_with('.')
        || name.contains("..")
        || name == ".")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::testing::ByteCodec;
    use serde_json::json;

    fn ctx() -> ParseContext<'static> {
        ParseContext {
            codec: &ByteCodec,
            n_vocab: 258,
            n_parallel: 4,
        }
    }

    #[test]
    fn aliases_limits_and_types() {
        let base = TaskParams::default();
        let p = parse_task_params(
            &json!({"max_tokens": 7, "top_p": 3.0, "temperature": -1}),
            &base,
            &ctx(),
        )
        .expect("valid");
        assert_eq!(p.n_predict, 7);
        assert_eq!(p.sampling.top_p, 1.0);
        assert_eq!(p.sampling.temp, 0.0);
        let err = parse_task_params(&json!({"n_predict": -5}), &base, &ctx()).expect_err("refused");
        assert_eq!(
            err.message,
            "Field 'n_predict': Value must be between -1 <= value <= 2147483647, but got -5"
        );
        let err = parse_task_params(&json!({"top_k": "many"}), &base, &ctx()).expect_err("refused");
        assert_eq!(
            err.message,
            "Field 'top_k': [json.exception.type_error.302] type must be number, but is string"
        );
        let p =
            parse_task_params(&json!({"seed": -1, "n_probs": null}), &base, &ctx()).expect("valid");
        assert_eq!(p.sampling.seed, u32::MAX);
    }

    #[test]
    fn logit_bias_forms_and_ignore_eos() {
        let base = TaskParams::default();
        let p = parse_task_params(
            &json!({"logit_bias": [[65, 1.5], ["B", false], [9999, 1.0]], "ignore_eos": true}),
            &base,
            &ctx(),
        )
        .expect("valid");
        assert_eq!(
            p.sampling.logit_bias,
            vec![(65, 1.5), (66, f32::NEG_INFINITY), (257, f32::NEG_INFINITY)]
        );
        let p = parse_task_params(&json!({"logit_bias": {"67": -2, "D": 1}}), &base, &ctx())
            .expect("valid");
        assert_eq!(p.sampling.logit_bias, vec![(67, -2.0), (68, 1.0)]);
    }

    #[test]
    fn prompts_single_multiple_tokens_and_mixed() {
        let c = &ByteCodec;
        assert_eq!(
            tokenize_prompts(c, &json!("ab"), true, true).ok(),
            Some(vec![vec![256, 97, 98]])
        );
        assert_eq!(
            tokenize_prompts(c, &json!([1, 2]), true, true).ok(),
            Some(vec![vec![1, 2]])
        );
        assert_eq!(
            tokenize_prompts(c, &json!(["a", "b"]), true, true).ok(),
            Some(vec![vec![256, 97], vec![256, 98]])
        );
        assert_eq!(
            tokenize_prompts(c, &json!([5, "a", 6]), true, true).ok(),
            Some(vec![vec![5, 97, 6]])
        );
        assert!(tokenize_prompts(c, &json!([]), true, true).is_err());
        assert!(tokenize_prompts(c, &json!([{}]), true, true).is_err());
    }

    #[test]
    fn filenames() {
        assert!(valid_filename("slot0.bin"));
        for bad in ["", "../x", "a/b", "a\\b", "x.", " x", "a:b", ".", "a\u{0}b"] {
            assert!(!valid_filename(bad), "{bad:?}");
        }
    }
}
