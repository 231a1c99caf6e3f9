//! actix-web routes and middleware: CORS, the loading gate (503 until a model is attached), API
//! keys (every route but `/health` and `/v1/health`), and the llama-server endpoints.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use futures_util::stream;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::chat::{
    anthropic_to_chat, content_text, json_reply_content, responses_to_chat, ChatRenderer,
    JsonReplyStream, Reply, ReplyParsing, ReplyStream, MEDIA_REFUSED,
};
use super::codec::TextCodec;
use super::embed::{self, Pooling};
use super::format::{self, ResponseKind, ResponseMeta};
use super::infill;
use super::peer::Peer;
use super::request::{self, json_type_name, ParseContext};
use super::scheduler::{SchedulerHandle, SlotAction, SlotActionResult};
use super::task::{
    EmbdResult, ErrorKind, Event, FinalResult, TaskError, TaskKind, TaskParams, TaskRequest,
};
use super::{ModelInfo, ServerParams};
use crate::grammar::{self, schema};
use crate::sampling::{resolve_seed, Mt19937, DEFAULT_SEED};

/// What exists once the model is loaded.
pub struct Ready {
    pub scheduler: SchedulerHandle,
    pub codec: Arc<dyn TextCodec>,
    pub chat: Arc<dyn ChatRenderer>,
    pub model: ModelInfo,
    /// How embeddings and reranking pool (the scheduler pools the same way).
    pub pooling: Pooling,
}

pub struct AppState {
    pub params: ServerParams,
    pub ready: OnceLock<Ready>,
    pub started: u64,
}

type Shared = web::Data<AppState>;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn json_response(status: StatusCode, body: &Value) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("application/json; charset=utf-8")
        .body(body.to_string())
}

fn ok(body: Value) -> HttpResponse {
    json_response(StatusCode::OK, &body)
}

fn error(err: &TaskError) -> HttpResponse {
    let status = StatusCode::from_u16(err.kind.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &json!({"error": format::error_body(err)}))
}

fn parse_body(body: &Bytes) -> Result<Value, TaskError> {
    serde_json::from_slice(body).map_err(|e| {
        TaskError::invalid(format!(
            "[json.exception.parse_error.101] parse error at line {}, column {}: {e}",
            e.line(),
            e.column()
        ))
    })
}

fn ready(state: &AppState) -> Result<&Ready, TaskError> {
    state
        .ready
        .get()
        .ok_or_else(|| TaskError::new(ErrorKind::Unavailable, "Loading model"))
}

/// Route handler body: errors become upstream's error JSON.
fn respond(result: Result<HttpResponse, TaskError>) -> HttpResponse {
    result.unwrap_or_else(|e| {
        log::warn!("request failed: {}", e.message);
        error(&e)
    })
}

/// CORS, loading gate, API key: upstream's pre-routing handler.
pub async fn gate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let mut res = admit(req, next).await?;
    // header names go out as upstream writes them (`Access-Control-Allow-Origin`): HTTP says
    // case does not matter, but clients that copy headers into a plain map compare it
    res.response_mut().head_mut().set_camel_case_headers(true);
    Ok(res)
}

/// CORS, the loading gate and the API key, in front of every route.
async fn admit(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let Some(state) = req.app_data::<Shared>().cloned() else {
        return Ok(next.call(req).await?.map_into_boxed_body());
    };
    let p = &state.params;
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let allow_origin = if p.cors_credentials && p.cors_origins == "*" {
        origin.clone().unwrap_or_default()
    } else {
        p.cors_origins.clone()
    };
    let with_cors = |mut res: HttpResponse| {
        if let Ok(v) = HeaderValue::from_str(&allow_origin) {
            res.headers_mut()
                .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        }
        res
    };
    if req.method() == Method::OPTIONS {
        let res = HttpResponse::Ok()
            .insert_header((
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                if p.cors_credentials { "true" } else { "false" },
            ))
            .insert_header((
                header::ACCESS_CONTROL_ALLOW_METHODS,
                p.cors_methods.as_str(),
            ))
            .insert_header((
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                p.cors_headers.as_str(),
            ))
            .content_type("text/html")
            .finish();
        return Ok(req.into_response(with_cors(res)));
    }
    if state.ready.get().is_none() {
        let res = error(&TaskError::new(ErrorKind::Unavailable, "Loading model"));
        return Ok(req.into_response(with_cors(res)));
    }
    let path = req.path().to_owned();
    if !p.api_keys.is_empty() && path != "/health" && path != "/v1/health" {
        let header_value = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let mut key = header_value("Authorization");
        if key.is_empty() {
            key = header_value("X-Api-Key");
        }
        let key = key.strip_prefix("Bearer ").unwrap_or(&key);
        if !p.api_keys.iter().any(|k| k == key) {
            log::warn!("unauthorized: Invalid API Key");
            let res = error(&TaskError::new(
                ErrorKind::Authentication,
                "Invalid API Key",
            ));
            return Ok(req.into_response(with_cors(res)));
        }
    }
    let mut res = next.call(req).await?.map_into_boxed_body();
    if let Ok(v) = HeaderValue::from_str(&allow_origin) {
        res.headers_mut()
            .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    Ok(res)
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/health", web::get().to(health))
        .route("/v1/health", web::get().to(health))
        .route("/metrics", web::get().to(metrics))
        .route("/props", web::get().to(get_props))
        .route("/props", web::post().to(post_props))
        .route("/models", web::get().to(models))
        .route("/v1/models", web::get().to(models))
        .route("/completion", web::post().to(completion_native))
        .route("/completions", web::post().to(completion_native))
        .route("/v1/completions", web::post().to(completion_oai))
        .route("/chat/completions", web::post().to(chat_completions))
        .route("/v1/chat/completions", web::post().to(chat_completions))
        .route(
            "/chat/completions/input_tokens",
            web::post().to(chat_input_tokens),
        )
        .route(
            "/v1/chat/completions/input_tokens",
            web::post().to(chat_input_tokens),
        )
        .route("/v1/messages", web::post().to(anthropic_messages))
        .route(
            "/v1/messages/count_tokens",
            web::post().to(anthropic_count_tokens),
        )
        .route("/v1/responses", web::post().to(responses))
        .route("/responses", web::post().to(responses))
        .route(
            "/v1/responses/input_tokens",
            web::post().to(responses_input_tokens),
        )
        .route(
            "/responses/input_tokens",
            web::post().to(responses_input_tokens),
        )
        .route("/infill", web::post().to(infill))
        .route("/embedding", web::post().to(embeddings_native))
        .route("/embeddings", web::post().to(embeddings_native))
        .route("/v1/embeddings", web::post().to(embeddings_oai))
        .route("/rerank", web::post().to(rerank))
        .route("/reranking", web::post().to(rerank))
        .route("/v1/rerank", web::post().to(rerank))
        .route("/v1/reranking", web::post().to(rerank))
        .route("/tokenize", web::post().to(tokenize))
        .route("/detokenize", web::post().to(detokenize))
        .route("/apply-template", web::post().to(apply_template))
        .route("/slots", web::get().to(get_slots))
        .route("/slots/{id_slot}", web::post().to(post_slots));
}

/// What every path no route serves answers (inside `--api-prefix` and outside it).
pub async fn not_found() -> HttpResponse {
    error(&TaskError::new(ErrorKind::NotFound, "File Not Found"))
}

async fn health() -> HttpResponse {
    ok(json!({"status": "ok"}))
}

async fn metrics(state: Shared) -> HttpResponse {
    respond(metrics_inner(&state).await)
}

async fn metrics_inner(state: &AppState) -> Result<HttpResponse, TaskError> {
    if !state.params.endpoint_metrics {
        return Err(TaskError::new(
            ErrorKind::NotSupported,
            "This server does not support metrics endpoint. Start it with `--metrics`",
        ));
    }
    let r = ready(state)?;
    let m = r.scheduler.metrics(true).await;
    let counters: [(&str, &str, f64); 10] = [
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", m.n_prompt_tokens_processed_total as f64),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", m.n_prompt_tokens_cached_total as f64),
        ("prompt_seconds_total", "Total time spent processing prompts", m.t_prompt_processing_total_us as f64 / 1e6),
        ("tokens_predicted_total", "Number of generation tokens processed", m.n_tokens_predicted_total as f64),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", m.t_tokens_generation_total_us as f64 / 1e6),
        ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding", m.n_decode_total as f64),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", m.n_tokens_max as f64),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", 0.0),
        ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model", 0.0),
        ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", 0.0),
    ];
    let gauges: [(&str, &str, f64); 5] = [
        (
            "prompt_tokens_seconds",
            "Average prompt throughput in tokens/s",
            m.prompt_tokens_per_second(),
        ),
        (
            "predicted_tokens_seconds",
            "Average generation throughput in tokens/s",
            m.predicted_tokens_per_second(),
        ),
        (
            "requests_processing",
            "Number of requests processing",
            m.n_processing as f64,
        ),
        (
            "requests_deferred",
            "Number of requests deferred",
            m.n_deferred as f64,
        ),
        (
            "n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call",
            m.n_busy_slots_total as f64 / (m.n_decode_total as f64).max(1.0),
        ),
    ];
    let mut text = String::new();
    for (kind, items) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
        for (name, help, value) in items {
            text.push_str(&format!(
                "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {}\n",
                prom_number(*value)
            ));
        }
    }
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .insert_header(("Process-Start-Time-Unix", state.started.to_string()))
        .body(text))
}

/// Numbers as C++ streams print them by default (six significant digits).
fn prom_number(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e6 {
        return format!("{}", x as i64);
    }
    let s = format!("{x:.6e}");
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-5..6).contains(&exp) {
        let decimals = (5 - exp).max(0) as usize;
        let v = format!("{x:.decimals$}");
        let v = if v.contains('.') {
            v.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            v
        };
        return v;
    }
    let m: f64 = mantissa.parse().unwrap_or(0.0);
    let m = format!("{m:.5}");
    let m = m.trim_end_matches('0').trim_end_matches('.');
    format!("{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
}

fn props_json(state: &AppState, r: &Ready) -> Value {
    let p = &state.params;
    let mut params = format::params_json(&p.defaults, true);
    // upstream reports a fresh task's parser settings here, whatever --reasoning-format says
    params["reasoning_format"] = json!("none");
    json!({
        "default_generation_settings": {
            "params": params,
            "n_ctx": r.scheduler.n_ctx_slot,
        },
        "total_slots": r.scheduler.n_slots,
        "model_alias": r.model.name,
        "model_ftype": r.model.ftype,
        "model_path": r.model.path,
        "modalities": {"vision": false, "video": false, "audio": false},
        "media_marker": media_marker(),
        "endpoint_slots": p.endpoint_slots,
        "endpoint_props": p.endpoint_props,
        "endpoint_metrics": p.endpoint_metrics,
        "ui": false,
        "ui_settings": {},
        "chat_template": r.chat.source(),
        "chat_template_caps": r.chat.caps(),
        "bos_token": r.model.bos_token,
        "eos_token": r.model.eos_token,
        "build_info": p.build_info,
        "is_sleeping": false,
        "cors_proxy_enabled": false,
    })
}

async fn get_props(state: Shared) -> HttpResponse {
    respond(ready(&state).map(|r| ok(props_json(&state, r))))
}

async fn post_props(state: Shared) -> HttpResponse {
    if !state.params.endpoint_props {
        return error(&TaskError::new(
            ErrorKind::NotSupported,
            "This server does not support changing global properties. Start it with `--props`",
        ));
    }
    ok(json!({"success": true}))
}

async fn models(state: Shared) -> HttpResponse {
    respond(ready(&state).map(|r| {
        let m = &r.model;
        ok(json!({
            "models": [{
                "name": m.name,
                "model": m.name,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": ["completion"],
                "parameters": "",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "",
                    "families": [""],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }],
            "object": "list",
            "data": [{
                "id": m.name,
                "aliases": m.aliases,
                "tags": m.tags,
                "object": "model",
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "created": now_secs(),
                "owned_by": "llamacpp",
                "meta": {
                    "vocab_type": m.vocab_type,
                    "n_vocab": m.n_vocab,
                    "n_ctx": r.scheduler.n_ctx_slot,
                    "n_ctx_train": m.n_ctx_train,
                    "n_embd": m.n_embd,
                    "n_params": m.n_params,
                    "size": m.size,
                    "ftype": m.ftype,
                },
            }],
        }))
    }))
}

async fn tokenize(state: Shared, body: Bytes) -> HttpResponse {
    respond((|| {
        let r = ready(&state)?;
        let body = parse_body(&body)?;
        let mut tokens = Vec::new();
        if let Some(content) = body.get("content") {
            let flag = |name: &str, default: bool| -> Result<bool, TaskError> {
                body.get(name)
                    .filter(|v| !v.is_null())
                    .map_or(Ok(default), |v| {
                        request::as_bool(v).map_err(TaskError::invalid)
                    })
            };
            let add_special = flag("add_special", false)?;
            let parse_special = flag("parse_special", true)?;
            let with_pieces = flag("with_pieces", false)?;
            let ids =
                request::tokenize_mixed(r.codec.as_ref(), content, add_special, parse_special)?;
            for id in ids {
                if with_pieces {
                    let piece = r.codec.token_to_piece(id, true);
                    let piece = match String::from_utf8(piece) {
                        Ok(s) => json!(s),
                        Err(e) => json!(e.into_bytes()),
                    };
                    tokens.push(json!({"id": id, "piece": piece}));
                } else {
                    tokens.push(json!(id));
                }
            }
        }
        Ok(ok(json!({"tokens": tokens})))
    })())
}

async fn detokenize(state: Shared, body: Bytes) -> HttpResponse {
    respond((|| {
        let r = ready(&state)?;
        let body = parse_body(&body)?;
        let mut content = Vec::new();
        if let Some(tokens) = body.get("tokens") {
            let ids = tokens.as_array().ok_or_else(|| {
                TaskError::invalid(
                    "[json.exception.type_error.302] type must be array, but is ".to_owned()
                        + json_type_name(tokens),
                )
            })?;
            for t in ids {
                let id = request::as_i64(t).map_err(TaskError::invalid)?;
                let n = r.codec.n_tokens();
                if id < 0 || id as usize >= n {
                    // upstream indexes its token table with a checked lookup that throws; the
                    // id is read as an unsigned index, so -1 reads as 2^64 - 1
                    return Err(TaskError::new(
                        ErrorKind::Server,
                        format!(
                            "vector::_M_range_check: __n (which is {}) >= this->size() (which is {n})",
                            id as u64
                        ),
                    ));
                }
                content.extend(r.codec.token_to_piece(id as u32, true));
            }
        }
        Ok(ok(json!({"content": String::from_utf8_lossy(&content)})))
    })())
}

/// How the chat module words a message list it could not read (`chat::ChatError::Messages`).
const MESSAGES_ERROR: &str = "Failed to parse messages:";

/// Chat body to a completion body: the rendered prompt plus the OpenAI fields mapped.
fn chat_to_completion(
    body: &Value,
    chat: &dyn ChatRenderer,
    server: &ServerParams,
) -> Result<Value, TaskError> {
    if !chat.jinja() {
        // upstream's first check of a chat body, thrown as runtime errors (500); a tool_choice
        // that is not a string reads as the default
        let has_tools = body
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty());
        let tool_choice = body.get("tool_choice").and_then(Value::as_str);
        if has_tools {
            return Err(TaskError::new(
                ErrorKind::Server,
                "tools param requires --jinja flag",
            ));
        }
        if tool_choice.is_some_and(|c| c != "auto") {
            return Err(TaskError::new(
                ErrorKind::Server,
                "tool_choice param requires --jinja flag",
            ));
        }
    }
    let response_schema = schema::chat_request_schema(body).map_err(|e| {
        // upstream throws the two-fields conflict as a runtime error (a 500), the rest as
        // invalid arguments
        let message = e.to_string();
        let kind = if message == BOTH_SCHEMA_AND_GRAMMAR {
            ErrorKind::Server
        } else {
            ErrorKind::InvalidRequest
        };
        TaskError::new(kind, message)
    })?;
    let messages = body
        .get("messages")
        .ok_or_else(|| TaskError::invalid("'messages' is required"))?;
    let messages = messages
        .as_array()
        .ok_or_else(|| TaskError::invalid("Expected 'messages' to be an array"))?;
    for m in messages {
        if let Some(role) = m.get("role").filter(|r| !r.is_string()) {
            // upstream's JSON library refuses it while parsing the messages: a server error
            return Err(TaskError::new(
                ErrorKind::Server,
                format!(
                    "Failed to parse messages: [json.exception.type_error.302] type must be string, but is {}",
                    json_type_name(role)
                ),
            ));
        }
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role != "assistant" && m.get("content").is_none() {
            return Err(TaskError::invalid(
                "All non-assistant messages must contain 'content'",
            ));
        }
        if role == "assistant" && m.get("content").is_none() && m.get("tool_calls").is_none() {
            return Err(TaskError::invalid(
                "Assistant message must contain either 'content' or 'tool_calls'!",
            ));
        }
        if let Some(c) = m.get("content") {
            if !(c.is_string() || c.is_null() || c.is_array()) {
                return Err(TaskError::invalid(
                    "Expected 'content' to be a string or an array",
                ));
            }
            content_text(c).map_err(|e| {
                // upstream throws the media refusal as a runtime error (500)
                let kind = if e.ends_with(MEDIA_REFUSED) {
                    ErrorKind::Server
                } else {
                    ErrorKind::InvalidRequest
                };
                TaskError::new(kind, e)
            })?;
        }
    }
    let tools = body.get("tools").cloned().unwrap_or(Value::Null);
    let add_generation_prompt = body
        .get("add_generation_prompt")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    // upstream reads `true`, "content" and "reasoning_content" as asking to continue
    let continue_final = matches!(body.get("continue_final_message"), Some(Value::Bool(true)))
        || matches!(
            body.get("continue_final_message").and_then(Value::as_str),
            Some("content" | "reasoning_content")
        );
    if continue_final && add_generation_prompt {
        return Err(TaskError::invalid(
            "Cannot set both add_generation_prompt and continue_final_message to true.",
        ));
    }
    let calls_tools = tools.as_array().is_some_and(|t| !t.is_empty())
        && body.get("tool_choice").and_then(Value::as_str) != Some("none");
    if calls_tools && body.get("grammar").is_some() {
        return Err(TaskError::invalid(
            "Cannot use custom grammar constraints with tools.",
        ));
    }
    // the server's defaults, then the request's own entries over them
    let mut kwargs = server.chat_template_kwargs.clone();
    if let Some(Value::Object(own)) = body.get("chat_template_kwargs") {
        kwargs.extend(own.clone());
    }
    let kwargs = Value::Object(kwargs);
    let prompt = chat
        .render(messages, &tools, add_generation_prompt, &kwargs)
        .map_err(|e| {
            // upstream rethrows a failure to read the messages as a runtime error: a 500, as
            // are the refusals of what only Jinja templates can do; template errors are the
            // request's (400)
            let kind = if e.starts_with(MESSAGES_ERROR) || e.contains("--jinja") {
                ErrorKind::Server
            } else {
                ErrorKind::InvalidRequest
            };
            TaskError::new(kind, e)
        })?;
    let mut out = body.as_object().cloned().unwrap_or_default();
    let thinking = chat.thinking_tags();
    let json_schema = response_schema
        .as_ref()
        .filter(|s| chat.jinja() && s.as_object().is_some_and(|o| !o.is_empty()));
    // What the template appends to start the reply (upstream's generation prompt), needed by
    // a response grammar and a reasoning budget.
    let generation_prompt =
        if add_generation_prompt && (json_schema.is_some() || thinking.is_some()) {
            let without = chat
                .render(messages, &tools, false, &kwargs)
                .map_err(TaskError::invalid)?;
            crate::chat::generation_prompt(&without, &prompt).to_string()
        } else {
            String::new()
        };
    match response_schema {
        // Upstream's chat parser builds the reply's grammar from an object schema: the
        // generation prompt, then the schema's JSON alone or in a ```json fence, with
        // whitespace around it (other schemas constrain nothing there).
        Some(schema) if json_schema.is_some() => {
            let schema_rules = grammar::schema_rules(&schema, RESPONSE_SCHEMA_RULE).map_err(|e| {
                TaskError::invalid(format!(
                    "Unable to generate parser for this template. Automatic parser generation failed: {}",
                    e.to_string()
                        .trim_start_matches("JSON schema conversion failed:\n")
                ))
            })?;
            out.insert(
                "grammar".into(),
                json!(grammar::response_format_grammar(
                    &schema_rules,
                    RESPONSE_SCHEMA_RULE,
                    &generation_prompt
                )),
            );
            out.insert("grammar_type".into(), json!("tool_calls"));
        }
        // Built-in formats take the schema's grammar as it is.
        Some(schema) if !chat.jinja() => {
            let text = schema::schema_to_grammar(&schema)
                .map_err(|e| TaskError::invalid(e.to_string()))?;
            out.insert("grammar".into(), json!(text));
            out.insert("grammar_type".into(), json!("tool_calls"));
        }
        _ => {}
    }
    if let Some((start, end)) = thinking {
        // Upstream hands the template's thinking tags to the reasoning budget; the budget is
        // the request's (`thinking_budget_tokens` is an alias), else the server's.
        let asked = ["reasoning_budget_tokens", "thinking_budget_tokens"]
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_i64))
            .filter(|&n| n != -1);
        let budget = asked.unwrap_or(i64::from(server.defaults.sampling.reasoning_budget_tokens));
        out.insert("reasoning_budget_tokens".into(), json!(budget));
        out.insert("reasoning_budget_start_tag".into(), json!(start));
        out.insert("reasoning_budget_end_tags".into(), json!([end]));
        let message = body
            .get("reasoning_budget_message")
            .and_then(Value::as_str)
            .unwrap_or(&server.reasoning_budget_message);
        out.insert("reasoning_budget_message".into(), json!(message));
    }
    if !generation_prompt.is_empty() {
        out.insert("generation_prompt".into(), json!(generation_prompt));
    }
    out.insert("prompt".into(), json!(prompt));
    let delimiters = chat.message_delimiters();
    if !delimiters.is_empty() {
        let list: Vec<Value> = delimiters
            .iter()
            .map(|(role, text)| json!({"role": role, "delimiter": text}))
            .collect();
        out.insert("message_delimiters".into(), Value::Array(list));
    }
    match body.get("stop") {
        Some(Value::String(s)) => {
            out.insert("stop".into(), json!([s]));
        }
        None | Some(Value::Null) => {
            out.insert("stop".into(), json!([]));
        }
        _ => {}
    }
    if body
        .get("logprobs")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        let n = body
            .get("top_logprobs")
            .and_then(Value::as_i64)
            .unwrap_or(20);
        out.insert("n_probs".into(), json!(n));
    } else if body.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return Err(TaskError::invalid(
            "top_logprobs requires logprobs to be set to true",
        ));
    } else {
        out.remove("logprobs");
    }
    Ok(Value::Object(out))
}

/// Upstream's refusal of a chat request that sets both, which it raises as a server error.
const BOTH_SCHEMA_AND_GRAMMAR: &str = "Cannot use both json_schema and grammar";

/// The name the response schema's rules take in a chat reply's grammar, as upstream names them.
const RESPONSE_SCHEMA_RULE: &str = "response-format-schema";

/// How a chat request's reply is parsed: the request's `reasoning_format` (else
/// `--reasoning-format`), tool calls looked for when the request offers tools; `None` under
/// `--skip-chat-parsing`.
fn reply_parsing(state: &AppState, data: &Value, json_reply: bool) -> Option<ReplyParsing> {
    let default_format = state.params.reasoning_format.as_ref()?;
    Some(ReplyParsing {
        prompt: data
            .get("prompt")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        reasoning_format: data
            .get("reasoning_format")
            .and_then(Value::as_str)
            .unwrap_or(default_format)
            .to_string(),
        parse_tools: data
            .get("tools")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty())
            && data.get("tool_choice").and_then(Value::as_str) != Some("none"),
        json_reply,
    })
}

/// A finished chat reply split as the model's chat family writes it; a reply the parser cannot
/// take (or no parsing) leaves everything in `content`.
fn parse_reply(chat: &dyn ChatRenderer, parsing: Option<&ReplyParsing>, text: &str) -> Reply {
    let plain = || Reply {
        content: text.to_string(),
        ..Reply::default()
    };
    let Some(rp) = parsing else {
        return plain();
    };
    if rp.json_reply {
        return Reply {
            content: json_reply_content(text).to_string(),
            ..Reply::default()
        };
    }
    chat.parse_reply(&rp.prompt, text, &rp.reasoning_format, rp.parse_tools)
        .unwrap_or_else(|e| {
            log::warn!("chat reply left unparsed: {e}");
            plain()
        })
}

async fn apply_template(state: Shared, body: Bytes) -> HttpResponse {
    respond((|| {
        let r = ready(&state)?;
        let body = parse_body(&body)?;
        let data = chat_to_completion(&body, r.chat.as_ref(), &state.params)?;
        Ok(ok(json!({"prompt": data["prompt"]})))
    })())
}

/// Token count of a chat-like request after conversion to a chat body.
fn count_input_tokens(
    state: &AppState,
    body: &Bytes,
    convert: fn(&Value) -> Result<Value, TaskError>,
    oai: bool,
) -> Result<HttpResponse, TaskError> {
    let r = ready(state)?;
    let body = convert(&parse_body(body)?)?;
    let data = chat_to_completion(&body, r.chat.as_ref(), &state.params)?;
    let n = request::tokenize_mixed(r.codec.as_ref(), &data["prompt"], true, true)?.len();
    let mut out = json!({"input_tokens": n});
    if oai {
        out["object"] = json!("response.input_tokens");
    }
    Ok(ok(out))
}

fn as_is(body: &Value) -> Result<Value, TaskError> {
    Ok(body.clone())
}

async fn chat_input_tokens(state: Shared, body: Bytes) -> HttpResponse {
    respond(count_input_tokens(&state, &body, as_is, true))
}

async fn responses_input_tokens(state: Shared, body: Bytes) -> HttpResponse {
    respond(count_input_tokens(&state, &body, responses_to_chat, true))
}

async fn anthropic_count_tokens(state: Shared, body: Bytes) -> HttpResponse {
    respond(count_input_tokens(&state, &body, anthropic_to_chat, false))
}

async fn anthropic_messages(state: Shared, req: HttpRequest, body: Bytes) -> HttpResponse {
    respond(handle_completion(&state, &req, body, ResponseKind::Anthropic).await)
}

async fn responses(state: Shared, req: HttpRequest, body: Bytes) -> HttpResponse {
    respond(handle_completion(&state, &req, body, ResponseKind::OaiResponses).await)
}

async fn completion_native(state: Shared, req: HttpRequest, body: Bytes) -> HttpResponse {
    respond(handle_completion(&state, &req, body, ResponseKind::Native).await)
}

async fn completion_oai(state: Shared, req: HttpRequest, body: Bytes) -> HttpResponse {
    respond(handle_completion(&state, &req, body, ResponseKind::OaiCompletion).await)
}

async fn chat_completions(state: Shared, req: HttpRequest, body: Bytes) -> HttpResponse {
    respond(handle_completion(&state, &req, body, ResponseKind::OaiChat).await)
}

/// Fill-in-the-middle (`server::infill`): the prompt is built around the model's FIM tokens,
/// then served as a `/completion` over those tokens.
async fn infill(state: Shared, req: HttpRequest, body: Bytes) -> HttpResponse {
    let result = async {
        let data = infill_body(&state, &body)?;
        complete(&state, &req, data, ResponseKind::Native, true).await
    };
    respond(result.await)
}

/// An `/infill` body as the `/completion` body it becomes: its `prompt` the infill's tokens.
fn infill_body(state: &AppState, body: &Bytes) -> Result<Value, TaskError> {
    let r = ready(state)?;
    // the model's FIM tokens are checked first, as upstream does, before the body is read
    infill::fim_tokens(r.codec.as_ref())?;
    let mut data = parse_body(body)?;
    // upstream writes `input_extra` into the body by key: null becomes an object, anything
    // else that is no object fails there
    if data.is_null() {
        data = json!({});
    }
    if !data.is_object() {
        return Err(TaskError::invalid(format!(
            "[json.exception.type_error.305] cannot use operator[] with a string argument with {}",
            json_type_name(&data)
        )));
    }
    let layout = infill::Layout {
        n_batch: state.params.n_batch as i64,
        n_predict: state.params.defaults.n_predict as i64,
        n_ctx: r.scheduler.n_ctx_slot as i64,
        spm: state.params.spm_infill,
    };
    let tokens = infill::prompt_tokens(r.codec.as_ref(), &data, layout)?;
    data["prompt"] = json!(tokens);
    Ok(data)
}

async fn embeddings_native(state: Shared, req: HttpRequest, body: Bytes) -> HttpResponse {
    respond(embeddings(&state, &req, &body, false).await)
}

async fn embeddings_oai(state: Shared, req: HttpRequest, body: Bytes) -> HttpResponse {
    respond(embeddings(&state, &req, &body, true).await)
}

/// Runs one embedding or reranking task per prompt; their results in prompt order.
async fn embd_tasks(
    r: &Ready,
    req: &HttpRequest,
    prompts: Vec<Vec<u32>>,
    params: TaskParams,
) -> Result<Vec<EmbdResult>, TaskError> {
    let params = Arc::new(params);
    let (tx, mut rx) = unbounded_channel();
    let n = prompts.len();
    for (index, tokens) in prompts.into_iter().enumerate() {
        r.scheduler.submit(TaskRequest {
            tokens,
            params: params.clone(),
            id_slot: -1,
            index,
            events: tx.clone(),
        });
    }
    let peer = req.conn_data::<Arc<Peer>>().cloned();
    let mut results = Vec::with_capacity(n);
    while results.len() < n {
        match next_event(&mut rx, peer.as_deref()).await? {
            Some(Event::Embd(e)) => results.push(*e),
            Some(Event::Error(e)) => return Err(e),
            Some(_) => {}
            None => return Err(TaskError::new(ErrorKind::Server, "task dropped")),
        }
    }
    results.sort_by_key(|e| e.index);
    Ok(results)
}

/// `/embedding`, `/embeddings` (llama.cpp's shape) and `/v1/embeddings` (OpenAI's).
async fn embeddings(
    state: &AppState,
    req: &HttpRequest,
    body: &Bytes,
    mut oai: bool,
) -> Result<HttpResponse, TaskError> {
    let r = ready(state)?;
    if !state.params.embedding {
        return Err(TaskError::new(
            ErrorKind::NotSupported,
            "This server does not support embeddings. Start it with `--embeddings`",
        ));
    }
    if oai && r.pooling == Pooling::None {
        return Err(TaskError::invalid(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
        ));
    }
    let body = parse_body(body)?;
    let prompt = match (body.get("input"), body.get("content")) {
        (Some(p), _) => p,
        (None, Some(p)) => {
            // "content" is not OpenAI's: the answer takes llama.cpp's shape
            oai = false;
            p
        }
        _ => {
            return Err(TaskError::invalid(
                "\"input\" or \"content\" must be provided",
            ))
        }
    };
    let base64 = match body.get("encoding_format") {
        None => false,
        Some(f) if f == "base64" => true,
        Some(f) if f == "float" => false,
        Some(_) => {
            return Err(TaskError::invalid(
                "The format to return the embeddings in. Can be either float or base64",
            ))
        }
    };
    let prompts = embed::embedding_inputs(r.codec.as_ref(), prompt)?;
    let embd_normalize = match body.get("embd_normalize") {
        Some(v) => request::as_i64(v)
            .map_err(|e| TaskError::invalid(format!("Field 'embd_normalize': {e}")))?
            as i32,
        None => state.params.defaults.embd_normalize,
    };
    let params = TaskParams {
        kind: TaskKind::Embedding,
        embd_normalize,
        ..TaskParams::default()
    };
    let results = embd_tasks(r, req, prompts, params).await?;
    Ok(ok(if oai {
        embed::oai_embeddings(&body, &r.model.name, &results, base64)
    } else {
        embed::native_embeddings(&results)
    }))
}

async fn rerank(state: Shared, req: HttpRequest, body: Bytes) -> HttpResponse {
    respond(rerank_inner(&state, &req, &body).await)
}

/// `/rerank` and its aliases: a score per document against the query, in Jina's shape or
/// (with `texts`) TEI's.
async fn rerank_inner(
    state: &AppState,
    req: &HttpRequest,
    body: &Bytes,
) -> Result<HttpResponse, TaskError> {
    let r = ready(state)?;
    if !state.params.embedding || r.pooling != Pooling::Rank {
        return Err(TaskError::new(
            ErrorKind::NotSupported,
            "This server does not support reranking. Start it with `--reranking`",
        ));
    }
    let body = parse_body(body)?;
    let tei = body.get("texts").is_some();
    let query = match body.get("query") {
        Some(Value::String(q)) => q.clone(),
        Some(_) => return Err(TaskError::invalid("\"query\" must be a string")),
        None => return Err(TaskError::invalid("\"query\" must be provided")),
    };
    // `documents` (else `texts`): a non-empty list of strings
    let docs: Vec<String> = body
        .get("documents")
        .filter(|v| !v.is_null())
        .or_else(|| body.get("texts"))
        .and_then(Value::as_array)
        .and_then(|items| {
            items
                .iter()
                .map(|d| d.as_str().map(str::to_string))
                .collect()
        })
        .filter(|docs: &Vec<String>| !docs.is_empty())
        .ok_or_else(|| TaskError::invalid("\"documents\" must be a non-empty string array"))?;
    let top_n = match body.get("top_n") {
        Some(v) => request::as_i64(v)
            .map_err(|e| TaskError::invalid(format!("Field 'top_n': {e}")))?
            .max(0) as usize,
        None => docs.len(),
    };
    let template = r.model.rerank_template.as_deref();
    let prompts: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| embed::rerank_prompt(r.codec.as_ref(), template, &query, d))
        .collect();
    let params = TaskParams {
        kind: TaskKind::Rerank,
        ..TaskParams::default()
    };
    let results = embd_tasks(r, req, prompts, params).await?;
    let scores: Vec<(usize, f32, usize)> = results
        .iter()
        .map(|e| {
            let score = e
                .rows
                .first()
                .and_then(|v| v.first())
                .copied()
                .unwrap_or(-1e6);
            (e.index, score, e.n_tokens)
        })
        .collect();
    Ok(ok(embed::rerank_response(
        &body,
        &r.model.name,
        &scores,
        tei,
        &docs,
        top_n,
    )))
}

/// A per-process marker for media placeholders, as upstream draws one at start.
fn media_marker() -> &'static str {
    static MARKER: OnceLock<String> = OnceLock::new();
    MARKER.get_or_init(|| format!("<__media_{}__>", gen_id("")))
}

fn gen_id(prefix: &str) -> String {
    const CHARS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut rng = Mt19937::new(resolve_seed(DEFAULT_SEED));
    let s: String = (0..32)
        .map(|_| CHARS[(rng.next_u32() as usize) % CHARS.len()] as char)
        .collect();
    format!("{prefix}{s}")
}

/// How often a non-streamed request asks whether its client is still there.
const PEER_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// The next event of a non-streamed request; an error once its client has closed the
/// connection, which drops the request's tasks (the scheduler frees their slots).
async fn next_event(
    rx: &mut UnboundedReceiver<Event>,
    peer: Option<&Peer>,
) -> Result<Option<Event>, TaskError> {
    let Some(peer) = peer else {
        return Ok(rx.recv().await);
    };
    loop {
        tokio::select! {
            ev = rx.recv() => return Ok(ev),
            _ = tokio::time::sleep(PEER_POLL) => {
                if peer.gone() {
                    log::info!("the client closed the connection: its request is cancelled");
                    return Err(TaskError::new(ErrorKind::Server, "the client closed the connection"));
                }
            }
        }
    }
}

struct Submitted {
    rx: UnboundedReceiver<Event>,
    params: Arc<TaskParams>,
    n_tasks: usize,
}

fn submit_all(
    r: &Ready,
    state: &AppState,
    data: &Value,
    infill: bool,
) -> Result<Submitted, TaskError> {
    if !data.is_object() {
        // upstream's first keyed read of a body that is not an object
        return Err(TaskError::invalid(format!(
            "[json.exception.type_error.304] cannot use at() with {}",
            json_type_name(data)
        )));
    }
    let prompt = data.get("prompt").ok_or_else(|| {
        TaskError::invalid("[json.exception.out_of_range.403] key 'prompt' not found")
    })?;
    let prompts = request::tokenize_prompts(r.codec.as_ref(), prompt, true, true)?;
    let ctx = ParseContext {
        codec: r.codec.as_ref(),
        n_vocab: r.scheduler.n_vocab,
        n_parallel: r.scheduler.n_slots,
    };
    let mut params = request::parse_task_params(data, &state.params.defaults, &ctx)?;
    params.infill = infill;
    let params = Arc::new(params);
    let id_slot = match data.get("id_slot").filter(|v| !v.is_null()) {
        Some(v) => request::as_i64(v)
            .map_err(|e| TaskError::invalid(format!("Field 'id_slot': {e}")))?
            as i32,
        None => -1,
    };
    let (tx, rx) = unbounded_channel();
    let n_cmpl = params.n_cmpl.max(1) as usize;
    let mut index = 0;
    for tokens in prompts {
        for _ in 0..n_cmpl {
            r.scheduler.submit(TaskRequest {
                tokens: tokens.clone(),
                params: params.clone(),
                id_slot,
                index,
                events: tx.clone(),
            });
            index += 1;
        }
    }
    Ok(Submitted {
        rx,
        params,
        n_tasks: index,
    })
}

async fn handle_completion(
    state: &AppState,
    req: &HttpRequest,
    body: Bytes,
    kind: ResponseKind,
) -> Result<HttpResponse, TaskError> {
    ready(state)?;
    complete(state, req, parse_body(&body)?, kind, false).await
}

/// A completion-shaped request, already parsed, answered in the shape `kind` names; `infill`
/// for `/infill`'s (its tasks take no context checkpoints).
async fn complete(
    state: &AppState,
    req: &HttpRequest,
    body: Value,
    kind: ResponseKind,
    infill: bool,
) -> Result<HttpResponse, TaskError> {
    let r = ready(state)?;
    // A chat request asking for a JSON response (checked on the request as sent: the body
    // passed on carries the grammar built for it).
    let json_reply = r.chat.jinja()
        && schema::chat_request_schema(&body).is_ok_and(|s| {
            s.as_ref()
                .and_then(Value::as_object)
                .is_some_and(|o| !o.is_empty())
        });
    let data = match kind {
        ResponseKind::OaiChat => chat_to_completion(&body, r.chat.as_ref(), &state.params)?,
        ResponseKind::Anthropic => {
            chat_to_completion(&anthropic_to_chat(&body)?, r.chat.as_ref(), &state.params)?
        }
        ResponseKind::OaiResponses => {
            chat_to_completion(&responses_to_chat(&body)?, r.chat.as_ref(), &state.params)?
        }
        ResponseKind::OaiCompletion => {
            if body.get("echo").and_then(Value::as_bool).unwrap_or(false) {
                return Err(TaskError::new(
                    ErrorKind::Server,
                    "Only no echo is supported",
                ));
            }
            body
        }
        ResponseKind::Native => body,
    };
    let parsing = (kind == ResponseKind::OaiChat)
        .then(|| reply_parsing(state, &data, json_reply))
        .flatten();
    let mut submitted = submit_all(r, state, &data, infill)?;
    let meta_id = gen_id(match kind {
        ResponseKind::OaiResponses => "resp_",
        ResponseKind::OaiCompletion => "cmpl-",
        _ => "chatcmpl-",
    });
    let msg_id = gen_id("msg_");
    let model = r.model.name.clone();
    let fingerprint = state.params.build_info.clone();
    let created = now_secs();
    let params = submitted.params.clone();
    let meta = ResponseMeta {
        model: &model,
        id: &meta_id,
        created,
        fingerprint: &fingerprint,
    };

    if !params.stream {
        let mut results: Vec<FinalResult> = Vec::new();
        let peer = req.conn_data::<Arc<Peer>>().cloned();
        while results.len() < submitted.n_tasks {
            match next_event(&mut submitted.rx, peer.as_deref()).await? {
                Some(Event::Final(f)) => results.push(*f),
                Some(Event::Error(e)) => return Err(e),
                Some(Event::Token { .. } | Event::Embd(_)) => {}
                None => return Err(TaskError::new(ErrorKind::Server, "task dropped")),
            }
        }
        results.sort_by_key(|f| f.index);
        let rendered: Vec<Value> = results
            .iter()
            .map(|f| match kind {
                ResponseKind::Native => format::final_native(f, &params, &model),
                ResponseKind::OaiCompletion => format::final_oai_completion(f, &params, &meta),
                ResponseKind::OaiChat => {
                    let reply = parse_reply(r.chat.as_ref(), parsing.as_ref(), &f.content);
                    format::final_oai_chat(f, &reply, &params, &meta)
                }
                ResponseKind::Anthropic => format::final_anthropic(f, &meta),
                ResponseKind::OaiResponses => format::final_responses(f, &meta, &msg_id),
            })
            .collect();
        if rendered.len() == 1 {
            return Ok(ok(rendered.into_iter().next().unwrap_or(Value::Null)));
        }
        if !matches!(kind, ResponseKind::OaiCompletion | ResponseKind::OaiChat) {
            return Ok(ok(Value::Array(rendered)));
        }
        let mut merged = rendered[0].clone();
        let choices: Vec<Value> = rendered
            .iter()
            .filter_map(|v| v["choices"].get(0).cloned())
            .collect();
        merged["choices"] = Value::Array(choices);
        return Ok(ok(merged));
    }

    // The first event decides between an error response and a stream.
    let first = submitted
        .rx
        .recv()
        .await
        .ok_or_else(|| TaskError::new(ErrorKind::Server, "task dropped"))?;
    if let Event::Error(e) = first {
        return Err(e);
    }
    let mut renderer = StreamRenderer {
        kind,
        params,
        model,
        id: meta_id,
        created,
        fingerprint,
        remaining: submitted.n_tasks,
        msg_id,
        text: String::new(),
        text_started: false,
        created_sent: false,
        chat: r.chat.clone(),
        parsing,
        replies: HashMap::new(),
        tool_calls: HashSet::new(),
    };
    let first_chunk = renderer.render(&first);
    let state = (renderer, submitted.rx, Some(first_chunk), false);
    let body = stream::unfold(state, |(mut renderer, mut rx, pending, done)| async move {
        if let Some(chunk) = pending {
            return Some((
                Ok::<_, actix_web::Error>(Bytes::from(chunk)),
                (renderer, rx, None, done),
            ));
        }
        if done {
            return None;
        }
        if renderer.remaining == 0 {
            let tail = match renderer.kind {
                ResponseKind::OaiCompletion | ResponseKind::OaiChat => {
                    "data: [DONE]\n\n".to_string()
                }
                _ => return None,
            };
            return Some((Ok(Bytes::from(tail)), (renderer, rx, None, true)));
        }
        match rx.recv().await {
            Some(ev) => {
                let chunk = renderer.render(&ev);
                let done = matches!(ev, Event::Error(_));
                Some((Ok(Bytes::from(chunk)), (renderer, rx, None, done)))
            }
            None => None,
        }
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .streaming(body))
}

struct StreamRenderer {
    kind: ResponseKind,
    params: Arc<TaskParams>,
    model: String,
    id: String,
    created: u64,
    fingerprint: String,
    remaining: usize,
    msg_id: String,
    /// Text streamed so far (the Anthropic and Responses closers repeat or check it).
    text: String,
    text_started: bool,
    created_sent: bool,
    chat: Arc<dyn ChatRenderer>,
    /// Chat replies are parsed as they stream, one parser per choice.
    parsing: Option<ReplyParsing>,
    replies: HashMap<usize, Option<Box<dyn ReplyStream>>>,
    /// Choices that made tool calls (their finish reason is `tool_calls`).
    tool_calls: HashSet<usize>,
}

impl StreamRenderer {
    /// The chunks' deltas for more text of choice `index`.
    fn chat_deltas(&mut self, index: usize, text: &str) -> Vec<Value> {
        let (chat, parsing) = (&self.chat, &self.parsing);
        let parser = self.replies.entry(index).or_insert_with(|| {
            let rp = parsing.as_ref()?;
            if rp.json_reply {
                return Some(Box::new(JsonReplyStream::new()) as Box<dyn ReplyStream>);
            }
            chat.reply_stream(&rp.prompt, &rp.reasoning_format, rp.parse_tools)
                .unwrap_or_else(|e| {
                    log::warn!("chat reply streamed unparsed: {e}");
                    None
                })
        });
        let deltas = match parser {
            Some(p) => p.push(text),
            None if text.is_empty() => Vec::new(),
            None => vec![json!({ "content": text })],
        };
        self.note_tool_calls(index, &deltas);
        deltas
    }

    /// The deltas choice `index` held back until its end.
    fn chat_tail(&mut self, index: usize) -> Vec<Value> {
        let deltas = match self.replies.remove(&index).flatten() {
            Some(p) => p.finish(),
            None => Vec::new(),
        };
        self.note_tool_calls(index, &deltas);
        deltas
    }

    fn note_tool_calls(&mut self, index: usize, deltas: &[Value]) {
        if deltas.iter().any(|d| d.get("tool_calls").is_some()) {
            self.tool_calls.insert(index);
        }
    }

    fn render(&mut self, ev: &Event) -> String {
        // chat parsing first: the response metadata below borrows the rest of `self`
        let (deltas, tail) = match (ev, self.kind) {
            (Event::Token { index, token, .. }, ResponseKind::OaiChat) => {
                (self.chat_deltas(*index, &token.text), Vec::new())
            }
            (Event::Final(f), ResponseKind::OaiChat) => (Vec::new(), self.chat_tail(f.index)),
            _ => (Vec::new(), Vec::new()),
        };
        let meta = ResponseMeta {
            model: &self.model,
            id: &self.id,
            created: self.created,
            fingerprint: &self.fingerprint,
        };
        let p = &self.params;
        match ev {
            Event::Token {
                index,
                token,
                n_decoded,
                n_prompt_tokens,
                n_prompt_cached,
                timings,
            } => match self.kind {
                ResponseKind::Native => format::sse(&[format::partial_native(
                    *index,
                    token,
                    *n_decoded,
                    *n_prompt_tokens,
                    timings.as_ref(),
                    p,
                )]),
                ResponseKind::OaiCompletion => format::sse(&[format::partial_oai_completion(
                    *index,
                    token,
                    timings.as_ref(),
                    p,
                    &meta,
                )]),
                ResponseKind::OaiChat => format::sse(&format::partial_oai_chat(
                    *index,
                    deltas,
                    token,
                    *n_decoded,
                    timings.as_ref(),
                    p,
                    &meta,
                )),
                ResponseKind::Anthropic => {
                    self.text.push_str(&token.text);
                    format::sse_events(&format::partial_anthropic(
                        &token.text,
                        *n_decoded,
                        *n_prompt_tokens,
                        *n_prompt_cached,
                        &mut self.text_started,
                        &meta,
                    ))
                }
                ResponseKind::OaiResponses => {
                    self.text.push_str(&token.text);
                    format::sse_events(&format::partial_responses(
                        &token.text,
                        &mut self.created_sent,
                        &mut self.text_started,
                        &meta,
                        &self.msg_id,
                    ))
                }
            },
            Event::Final(f) => {
                self.remaining = self.remaining.saturating_sub(1);
                match self.kind {
                    ResponseKind::Native => format::sse(&[format::final_native(f, p, &self.model)]),
                    ResponseKind::OaiCompletion => {
                        format::sse(&[format::final_oai_completion(f, p, &meta)])
                    }
                    ResponseKind::OaiChat => {
                        let made_calls = self.tool_calls.contains(&f.index);
                        format::sse(&format::final_oai_chat_stream(
                            f, tail, made_calls, p, &meta,
                        ))
                    }
                    ResponseKind::Anthropic => {
                        format::sse_events(&format::final_anthropic_stream(f, self.text_started))
                    }
                    ResponseKind::OaiResponses => format::sse_events(
                        &format::final_responses_stream(f, &self.text, &meta, &self.msg_id),
                    ),
                }
            }
            Event::Error(e) => {
                self.remaining = 0;
                match self.kind {
                    ResponseKind::Anthropic => {
                        format::sse_events(&[("error", format::error_body(e))])
                    }
                    _ => format::sse(&[json!({"error": format::error_body(e)})]),
                }
            }
            // completion tasks never end this way
            Event::Embd(_) => String::new(),
        }
    }
}

async fn get_slots(state: Shared, req: HttpRequest) -> HttpResponse {
    respond(get_slots_inner(&state, &req).await)
}

async fn get_slots_inner(state: &AppState, req: &HttpRequest) -> Result<HttpResponse, TaskError> {
    if !state.params.endpoint_slots {
        return Err(TaskError::new(
            ErrorKind::NotSupported,
            "This server does not support slots endpoint. Start it with `--slots`",
        ));
    }
    let r = ready(state)?;
    let slots = r.scheduler.slots().await;
    let fail_on_no_slot =
        web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
            .map(|q| q.get("fail_on_no_slot").is_some_and(|v| !v.is_empty()))
            .unwrap_or(false);
    if fail_on_no_slot && slots.iter().all(|s| s.is_processing) {
        return Err(TaskError::new(ErrorKind::Unavailable, "no slot available"));
    }
    let list: Vec<Value> = slots
        .iter()
        .map(|s| {
            let mut o = json!({
                "id": s.id,
                "n_ctx": s.n_ctx,
                "speculative": false,
                "is_processing": s.is_processing,
            });
            if let (Some(id_task), Some(params)) = (s.id_task, &s.params) {
                o["id_task"] = json!(id_task);
                o["n_prompt_tokens"] = json!(s.n_prompt_tokens);
                o["n_prompt_tokens_processed"] = json!(s.n_prompt_tokens_processed);
                o["n_prompt_tokens_cache"] = json!(s.n_prompt_tokens_cache);
                o["params"] = format::params_json(params, !state.params.slots_debug);
                o["next_token"] = json!([{
                    "has_next_token": s.has_next_token,
                    "has_new_line": s.has_new_line,
                    "n_remain": s.n_remain,
                    "n_decoded": s.n_decoded,
                }]);
                if state.params.slots_debug {
                    o["prompt"] = json!(s.prompt);
                    o["generated"] = json!(s.generated);
                }
            }
            o
        })
        .collect();
    Ok(ok(Value::Array(list)))
}

async fn post_slots(
    state: Shared,
    req: HttpRequest,
    path: web::Path<String>,
    body: Bytes,
) -> HttpResponse {
    respond(post_slots_inner(&state, &req, &path, &body).await)
}

async fn post_slots_inner(
    state: &AppState,
    req: &HttpRequest,
    id_slot: &str,
    body: &Bytes,
) -> Result<HttpResponse, TaskError> {
    if state.params.slot_save_path.is_none() {
        return Err(TaskError::new(
            ErrorKind::NotSupported,
            "This server does not support slots action. Start it with `--slot-save-path`",
        ));
    }
    let r = ready(state)?;
    let id: i64 = leading_int(id_slot).ok_or_else(|| TaskError::invalid("Invalid slot ID"))?;
    let query =
        web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
            .map(|q| q.into_inner())
            .unwrap_or_default();
    let action = query.get("action").map(String::as_str).unwrap_or("");
    let filename = || -> Result<String, TaskError> {
        let body = parse_body(body)?;
        let name = body
            .get("filename")
            .ok_or_else(|| {
                TaskError::invalid("[json.exception.out_of_range.403] key 'filename' not found")
            })?
            .as_str()
            .ok_or_else(|| {
                TaskError::invalid("[json.exception.type_error.302] type must be string")
            })?
            .to_owned();
        if !request::valid_filename(&name) {
            return Err(TaskError::invalid("Invalid filename"));
        }
        Ok(name)
    };
    let action = match action {
        "save" => SlotAction::Save(filename()?),
        "restore" => SlotAction::Restore(filename()?),
        "erase" => SlotAction::Erase,
        _ => return Err(TaskError::invalid("Invalid action")),
    };
    let result = r.scheduler.slot_action(id, action).await?;
    Ok(ok(match result {
        SlotActionResult::Saved {
            id_slot,
            filename,
            n_saved,
            n_written,
            ms,
        } => {
            json!({"id_slot": id_slot, "filename": filename, "n_saved": n_saved, "n_written": n_written, "timings": {"save_ms": ms}})
        }
        SlotActionResult::Restored {
            id_slot,
            filename,
            n_restored,
            n_read,
            ms,
        } => {
            json!({"id_slot": id_slot, "filename": filename, "n_restored": n_restored, "n_read": n_read, "timings": {"restore_ms": ms}})
        }
        SlotActionResult::Erased { id_slot, n_erased } => {
            json!({"id_slot": id_slot, "n_erased": n_erased})
        }
    }))
}

/// `std::stoi`: optional sign and leading digits, the rest ignored.
fn leading_int(s: &str) -> Option<i64> {
    let t = s.trim_start();
    let (sign, digits) = match t.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, t.strip_prefix('+').unwrap_or(t)),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse::<i64>().ok().map(|v| v * sign)
}
