//! Results to JSON in upstream's shapes: native `/completion`, OpenAI completions and chat
//! (whole and streamed chunks), errors, timings and token probabilities.

use crate::sampling::GrammarTrigger;
use serde_json::{json, Map, Value};

use super::chat::Reply;

use super::task::{
    ErrorKind, FinalResult, StopType, TaskError, TaskParams, Timings, TokenOutput, TokenProb,
};

/// How a completion's results are rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseKind {
    Native,
    OaiCompletion,
    OaiChat,
    Anthropic,
    OaiResponses,
}

/// Identity of one request's response, shared by all its chunks.
pub struct ResponseMeta<'a> {
    pub model: &'a str,
    pub id: &'a str,
    pub created: u64,
    pub fingerprint: &'a str,
}

pub fn error_body(err: &TaskError) -> Value {
    let mut inner = json!({
        "code": err.kind.code(),
        "message": err.message,
        "type": err.kind.type_name(),
    });
    if let ErrorKind::ExceedContextSize {
        n_prompt_tokens,
        n_ctx,
    } = err.kind
    {
        inner["n_prompt_tokens"] = json!(n_prompt_tokens);
        inner["n_ctx"] = json!(n_ctx);
    }
    inner
}

pub fn timings_json(t: &Timings) -> Value {
    json!({
        "cache_n": t.n_prompt_cached,
        "prompt_n": t.n_prompt_processed,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": t.prompt_per_token_ms(),
        "prompt_per_second": t.prompt_per_second(),
        "predicted_n": t.n_gen,
        "predicted_ms": t.gen_ms,
        "predicted_per_token_ms": t.gen_per_token_ms(),
        "predicted_per_second": t.gen_per_second(),
    })
}

/// A float as the JSON value upstream writes: finite values as numbers, others as null.
fn num(x: f32) -> Value {
    serde_json::Number::from_f64(f64::from(x)).map_or(Value::Null, Value::Number)
}

fn logarithm(p: f32) -> f32 {
    if p == 0.0 {
        f32::MIN
    } else {
        p.ln()
    }
}

/// Text of a piece up to a cut multi-byte character.
fn piece_text(bytes: &[u8]) -> String {
    let valid = match std::str::from_utf8(bytes) {
        Ok(s) => return s.to_owned(),
        Err(e) => e.valid_up_to(),
    };
    String::from_utf8_lossy(&bytes[..valid]).into_owned()
}

fn top_probs_json(probs: &[TokenProb], post: bool) -> Value {
    Value::Array(
        probs
            .iter()
            .map(|p| {
                let mut o = Map::new();
                o.insert("id".into(), json!(p.id));
                o.insert("token".into(), json!(piece_text(&p.piece)));
                o.insert("bytes".into(), json!(p.piece));
                if post {
                    o.insert("prob".into(), num(p.p));
                } else {
                    o.insert("logprob".into(), num(logarithm(p.p)));
                }
                Value::Object(o)
            })
            .collect(),
    )
}

pub fn probs_json(tokens: &[TokenOutput], post: bool) -> Value {
    Value::Array(
        tokens
            .iter()
            .map(|t| {
                let mut o = Map::new();
                o.insert("id".into(), json!(t.id));
                o.insert("token".into(), json!(piece_text(t.text.as_bytes())));
                o.insert("bytes".into(), json!(t.text.as_bytes()));
                if post {
                    o.insert("prob".into(), num(t.prob));
                    o.insert("top_probs".into(), top_probs_json(&t.probs, true));
                } else {
                    o.insert("logprob".into(), num(logarithm(t.prob)));
                    o.insert("top_logprobs".into(), top_probs_json(&t.probs, false));
                }
                Value::Object(o)
            })
            .collect(),
    )
}

/// `generation_settings` / slot `params` (upstream's `task_params::to_json`).
pub fn params_json(p: &TaskParams, only_metrics: bool) -> Value {
    let s = &p.sampling;
    let samplers: Vec<&str> = s.samplers.iter().map(|t| t.name()).collect();
    let mut o = json!({
        "seed": s.seed,
        "temperature": num(s.temp),
        "dynatemp_range": num(s.dynatemp_range),
        "dynatemp_exponent": num(s.dynatemp_exponent),
        "top_k": s.top_k,
        "top_p": num(s.top_p),
        "min_p": num(s.min_p),
        "top_n_sigma": num(s.top_n_sigma),
        "xtc_probability": num(s.xtc_probability),
        "xtc_threshold": num(s.xtc_threshold),
        "typical_p": num(s.typ_p),
        "repeat_last_n": s.penalty_last_n,
        "repeat_penalty": num(s.penalty_repeat),
        "presence_penalty": num(s.penalty_present),
        "frequency_penalty": num(s.penalty_freq),
        "dry_multiplier": num(s.dry_multiplier),
        "dry_base": num(s.dry_base),
        "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": s.dry_penalty_last_n,
        "mirostat": s.mirostat,
        "mirostat_tau": num(s.mirostat_tau),
        "mirostat_eta": num(s.mirostat_eta),
        "adaptive_target": -1.0,
        "adaptive_decay": num(0.9),
    });
    let rest = json!({
        "max_tokens": p.n_predict,
        "n_predict": p.n_predict,
        "n_keep": p.n_keep,
        "n_discard": p.n_discard,
        "ignore_eos": s.ignore_eos,
        "stream": p.stream,
        "n_probs": s.n_probs,
        "min_keep": s.min_keep,
        "chat_format": "Content-only",
        "reasoning_format": "deepseek",
        "reasoning_in_content": false,
        "generation_prompt": p.generation_prompt,
        "samplers": samplers,
        "speculative.types": "none",
        "timings_per_token": p.timings_per_token,
        "post_sampling_probs": p.post_sampling_probs,
        "backend_sampling": false,
        "lora": [],
    });
    if let (Some(o), Value::Object(rest)) = (o.as_object_mut(), rest) {
        o.extend(rest);
    }
    if !only_metrics {
        o["dry_sequence_breakers"] = json!(s.dry_sequence_breakers);
        o["stop"] = json!(p.stop);
        o["logit_bias"] = Value::Array(
            s.logit_bias
                .iter()
                .map(|&(t, b)| json!({"bias": num(b), "token": t}))
                .collect(),
        );
        o["grammar"] = json!(s.grammar.as_ref().map_or("", |g| g.text.as_str()));
        o["grammar_lazy"] = json!(s.grammar_lazy);
        o["grammar_triggers"] = Value::Array(
            s.grammar_triggers
                .iter()
                .map(|t| {
                    let mut j = json!({"type": t.type_code(), "value": t.value()});
                    if let GrammarTrigger::Token { token, .. } = t {
                        j["token"] = json!(token);
                    }
                    j
                })
                .collect(),
        );
        o["preserved_tokens"] = json!(s.preserved_tokens);
    }
    o
}

/// Picks `paths` (slash-separated) out of `js`, as `response_fields` asks.
fn nested_values(paths: &[String], js: &Value) -> Value {
    let mut out = Map::new();
    for path in paths {
        let mut cur = Some(js);
        for key in path.split('/') {
            cur = cur.and_then(|c| c.as_object()).and_then(|o| o.get(key));
        }
        if let Some(v) = cur {
            out.insert(path.clone(), v.clone());
        }
    }
    Value::Object(out)
}

pub fn final_native(r: &FinalResult, p: &TaskParams, model: &str) -> Value {
    let mut o = json!({
        "index": r.index,
        "content": r.content,
        "tokens": r.tokens,
        "id_slot": r.id_slot,
        "stop": true,
        "model": model,
        "tokens_predicted": r.n_decoded,
        "tokens_evaluated": r.n_prompt_tokens,
        "generation_settings": params_json(p, false),
        "prompt": r.prompt,
        "has_new_line": r.has_new_line,
        "truncated": r.truncated,
        "stop_type": r.stop.as_str(),
        "stopping_word": r.stopping_word,
        "tokens_cached": r.n_tokens_cached,
        "timings": timings_json(&r.timings),
    });
    if !p.stream && !r.probs.is_empty() {
        o["completion_probabilities"] = probs_json(&r.probs, p.post_sampling_probs);
    }
    if p.response_fields.is_empty() {
        o
    } else {
        nested_values(&p.response_fields, &o)
    }
}

#[allow(clippy::too_many_arguments)]
/// One streamed `/completion` token. Its `id_slot` is -1 as upstream's partial results carry
/// (only the final result names the slot).
pub fn partial_native(
    index: usize,
    token: &TokenOutput,
    n_decoded: usize,
    n_prompt_tokens: usize,
    timings: Option<&Timings>,
    p: &TaskParams,
) -> Value {
    let mut o = json!({
        "index": index,
        "content": token.text,
        "tokens": [token.id],
        "stop": false,
        "id_slot": -1,
        "tokens_predicted": n_decoded,
        "tokens_evaluated": n_prompt_tokens,
    });
    if let Some(t) = timings {
        o["timings"] = timings_json(t);
    }
    if !token.probs.is_empty() {
        o["completion_probabilities"] =
            probs_json(std::slice::from_ref(token), p.post_sampling_probs);
    }
    o
}

fn finish_reason(stop: StopType) -> &'static str {
    match stop {
        StopType::Word | StopType::Eos => "stop",
        _ => "length",
    }
}

pub fn usage_json(r: &FinalResult) -> Value {
    json!({
        "completion_tokens": r.n_decoded,
        "prompt_tokens": r.n_prompt_tokens,
        "total_tokens": r.n_decoded + r.n_prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": r.n_prompt_cached},
    })
}

pub fn final_oai_completion(r: &FinalResult, p: &TaskParams, meta: &ResponseMeta<'_>) -> Value {
    let logprobs = if !p.stream && !r.probs.is_empty() {
        json!({"content": probs_json(&r.probs, p.post_sampling_probs)})
    } else {
        Value::Null
    };
    let choice = json!({
        "text": r.content,
        "index": r.index,
        "logprobs": logprobs,
        "finish_reason": finish_reason(r.stop),
    });
    final_oai("text_completion", choice, r, p, meta)
}

/// The envelope of a finished OpenAI completion or chat reply around its one `choice`.
fn final_oai(
    object: &str,
    choice: Value,
    r: &FinalResult,
    p: &TaskParams,
    meta: &ResponseMeta<'_>,
) -> Value {
    let mut o = json!({
        "choices": [choice],
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.fingerprint,
        "object": object,
        "usage": usage_json(r),
        "id": meta.id,
    });
    if p.verbose {
        o["__verbose"] = final_native(r, p, meta.model);
    }
    o["timings"] = timings_json(&r.timings);
    o
}

pub fn partial_oai_completion(
    index: usize,
    token: &TokenOutput,
    timings: Option<&Timings>,
    p: &TaskParams,
    meta: &ResponseMeta<'_>,
) -> Value {
    let logprobs = if token.probs.is_empty() {
        Value::Null
    } else {
        json!({"content": probs_json(std::slice::from_ref(token), p.post_sampling_probs)})
    };
    let mut o = json!({
        "choices": [{
            "text": token.text,
            "index": index,
            "logprobs": logprobs,
            "finish_reason": null,
        }],
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.fingerprint,
        "object": "text_completion",
        "id": meta.id,
    });
    if let Some(t) = timings {
        o["timings"] = timings_json(t);
    }
    o
}

/// A finished chat reply; `reply` is `r.content` parsed as the model's chat family writes it.
pub fn final_oai_chat(
    r: &FinalResult,
    reply: &Reply,
    p: &TaskParams,
    meta: &ResponseMeta<'_>,
) -> Value {
    let finish = if reply.tool_calls.is_empty() {
        finish_reason(r.stop)
    } else {
        "tool_calls"
    };
    let mut choice = json!({
        "finish_reason": finish,
        "index": r.index,
        "message": reply.message(),
    });
    if !p.stream && !r.probs.is_empty() {
        choice["logprobs"] = json!({"content": probs_json(&r.probs, p.post_sampling_probs)});
    }
    final_oai("chat.completion", choice, r, p, meta)
}

fn chat_chunk(index: usize, delta: Value, finish: Value, meta: &ResponseMeta<'_>) -> Value {
    json!({
        "choices": [{"finish_reason": finish, "index": index, "delta": delta}],
        "created": meta.created,
        "id": meta.id,
        "model": meta.model,
        "system_fingerprint": meta.fingerprint,
        "object": "chat.completion.chunk",
    })
}

/// The chunks of one streamed chat token: a role-only chunk before the first, then one chunk per
/// `delta` the token made visible (see `chat::ReplyStream`).
pub fn partial_oai_chat(
    index: usize,
    deltas: Vec<Value>,
    token: &TokenOutput,
    n_decoded: usize,
    timings: Option<&Timings>,
    p: &TaskParams,
    meta: &ResponseMeta<'_>,
) -> Vec<Value> {
    let mut chunks = Vec::new();
    if n_decoded == 1 {
        chunks.push(chat_chunk(
            index,
            json!({"role": "assistant", "content": null}),
            Value::Null,
            meta,
        ));
    }
    chunks.extend(
        deltas
            .into_iter()
            .map(|d| chat_chunk(index, d, Value::Null, meta)),
    );
    if let Some(last) = chunks.last_mut() {
        if !token.probs.is_empty() {
            last["choices"][0]["logprobs"] =
                json!({"content": probs_json(std::slice::from_ref(token), p.post_sampling_probs)});
        }
        if let Some(t) = timings {
            last["timings"] = timings_json(t);
        }
    }
    chunks
}

/// The end of a streamed chat reply: chunks for what the parser held back (`tail`), then the
/// finish chunk (`tool_calls` when the reply made any), usage and timings.
pub fn final_oai_chat_stream(
    r: &FinalResult,
    tail: Vec<Value>,
    made_tool_calls: bool,
    p: &TaskParams,
    meta: &ResponseMeta<'_>,
) -> Vec<Value> {
    let mut chunks: Vec<Value> = tail
        .into_iter()
        .map(|d| chat_chunk(r.index, d, Value::Null, meta))
        .collect();
    let finish = chunks.len();
    let reason = if made_tool_calls {
        "tool_calls"
    } else {
        finish_reason(r.stop)
    };
    chunks.push(chat_chunk(r.index, json!({}), json!(reason), meta));
    if p.include_usage {
        chunks.push(json!({
            "choices": [],
            "created": meta.created,
            "id": meta.id,
            "model": meta.model,
            "system_fingerprint": meta.fingerprint,
            "object": "chat.completion.chunk",
            "usage": usage_json(r),
        }));
    }
    if let Some(last) = chunks.last_mut() {
        last["timings"] = timings_json(&r.timings);
    }
    if p.verbose {
        chunks[finish]["__verbose"] = final_native(r, p, meta.model);
    }
    chunks
}

/// One SSE event per value, as upstream's `format_oai_sse`.
pub fn sse(values: &[Value]) -> String {
    values.iter().map(|v| format!("data: {v}\n\n")).collect()
}

/// Named SSE events (`event:` then `data:`), as upstream's Anthropic and Responses streams.
pub fn sse_events(events: &[(&str, Value)]) -> String {
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

fn anthropic_stop_reason(stop: StopType) -> &'static str {
    match stop {
        StopType::Word | StopType::Eos => "end_turn",
        _ => "max_tokens",
    }
}

fn stop_sequence(r: &FinalResult) -> Value {
    if r.stopping_word.is_empty() {
        Value::Null
    } else {
        json!(r.stopping_word)
    }
}

pub fn final_anthropic(r: &FinalResult, meta: &ResponseMeta<'_>) -> Value {
    let content: Vec<Value> = if r.content.is_empty() {
        Vec::new()
    } else {
        vec![json!({"type": "text", "text": r.content})]
    };
    json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": meta.model,
        "stop_reason": anthropic_stop_reason(r.stop),
        "stop_sequence": stop_sequence(r),
        "usage": {
            "cache_read_input_tokens": r.n_prompt_cached,
            "input_tokens": r.n_prompt_tokens - r.n_prompt_cached.min(r.n_prompt_tokens),
            "output_tokens": r.n_decoded,
        },
    })
}

/// Events of one streamed Anthropic token; `text_started` tracks the open text block.
pub fn partial_anthropic(
    token_text: &str,
    n_decoded: usize,
    n_prompt_tokens: usize,
    n_prompt_cached: usize,
    text_started: &mut bool,
    meta: &ResponseMeta<'_>,
) -> Vec<(&'static str, Value)> {
    let mut events = Vec::new();
    if n_decoded == 1 {
        events.push((
            "message_start",
            json!({"type": "message_start", "message": {
                "id": meta.id,
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": meta.model,
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {
                    "cache_read_input_tokens": n_prompt_cached,
                    "input_tokens": n_prompt_tokens - n_prompt_cached.min(n_prompt_tokens),
                    "output_tokens": 0,
                },
            }}),
        ));
    }
    if !token_text.is_empty() {
        if !*text_started {
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            *text_started = true;
        }
        events.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": token_text}}),
        ));
    }
    events
}

pub fn final_anthropic_stream(r: &FinalResult, text_started: bool) -> Vec<(&'static str, Value)> {
    let mut events = Vec::new();
    if text_started {
        events.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ));
    }
    events.push((
        "message_delta",
        json!({"type": "message_delta",
            "delta": {"stop_reason": anthropic_stop_reason(r.stop), "stop_sequence": stop_sequence(r)},
            "usage": {"output_tokens": r.n_decoded}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
}

fn responses_usage(r: &FinalResult) -> Value {
    json!({
        "input_tokens": r.n_prompt_tokens,
        "output_tokens": r.n_decoded,
        "total_tokens": r.n_decoded + r.n_prompt_tokens,
        "input_tokens_details": {"cached_tokens": r.n_prompt_cached},
    })
}

fn responses_message(msg_id: &str, text: &str) -> Value {
    json!({
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
        "id": msg_id,
        "role": "assistant",
        "status": "completed",
        "type": "message",
    })
}

pub fn final_responses(r: &FinalResult, meta: &ResponseMeta<'_>, msg_id: &str) -> Value {
    let output: Vec<Value> = if r.content.is_empty() {
        Vec::new()
    } else {
        vec![responses_message(msg_id, &r.content)]
    };
    json!({
        "completed_at": meta.created,
        "created_at": meta.created,
        "id": meta.id,
        "model": meta.model,
        "object": "response",
        "output": output,
        "status": "completed",
        "usage": responses_usage(r),
    })
}

pub fn partial_responses(
    token_text: &str,
    created: &mut bool,
    text_started: &mut bool,
    meta: &ResponseMeta<'_>,
    msg_id: &str,
) -> Vec<(&'static str, Value)> {
    let mut events = Vec::new();
    let in_progress = json!({"id": meta.id, "object": "response", "status": "in_progress"});
    if !*created {
        events.push((
            "response.created",
            json!({"type": "response.created", "response": in_progress}),
        ));
        events.push((
            "response.in_progress",
            json!({"type": "response.in_progress", "response": in_progress}),
        ));
        *created = true;
    }
    if !token_text.is_empty() {
        if !*text_started {
            events.push((
                "response.output_item.added",
                json!({"type": "response.output_item.added", "item": {
                    "content": [], "id": msg_id, "role": "assistant", "status": "in_progress", "type": "message"}}),
            ));
            events.push((
                "response.content_part.added",
                json!({"type": "response.content_part.added", "item_id": msg_id,
                    "part": {"type": "output_text", "text": ""}}),
            ));
            *text_started = true;
        }
        events.push((
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": msg_id, "delta": token_text}),
        ));
    }
    events
}

pub fn final_responses_stream(
    r: &FinalResult,
    text: &str,
    meta: &ResponseMeta<'_>,
    msg_id: &str,
) -> Vec<(&'static str, Value)> {
    let mut events = Vec::new();
    let mut output = Vec::new();
    if !text.is_empty() {
        let part = json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
        events.push((
            "response.output_text.done",
            json!({"type": "response.output_text.done", "item_id": msg_id, "text": text}),
        ));
        events.push((
            "response.content_part.done",
            json!({"type": "response.content_part.done", "item_id": msg_id, "part": part}),
        ));
        let item = responses_message(msg_id, text);
        events.push((
            "response.output_item.done",
            json!({"type": "response.output_item.done", "item": item}),
        ));
        output.push(item);
    }
    events.push((
        "response.completed",
        json!({"type": "response.completed", "response": {
            "id": meta.id,
            "object": "response",
            "created_at": meta.created,
            "status": "completed",
            "model": meta.model,
            "output": output,
            "usage": responses_usage(r),
        }, "timings": timings_json(&r.timings)}),
    ));
    events
}
