//! The HTTP surface in-process on loopback, over the mock engine and byte codec.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use bloomery::sampling::SamplingParams;
use bloomery::server::embed::Pooling;
use bloomery::server::testing::{mock_greedy, ByteCodec, MockEngine};
use bloomery::server::{ModelInfo, PlainChat, Server, ServerParams, TaskParams, TextCodec};
use serde_json::{json, Value};

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The JSON payloads of an SSE body, `[DONE]` as a string.
    fn events(&self) -> Vec<Value> {
        self.body
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| serde_json::from_str(d).unwrap_or(Value::String(d.to_string())))
            .collect()
    }
}

fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    parse_reply(&raw)
}

fn parse_reply(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("header end");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn post(addr: SocketAddr, path: &str, body: Value) -> Reply {
    send(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        &body.to_string(),
    )
}

fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, "GET", path, &[], "")
}

fn params() -> ServerParams {
    ServerParams {
        port: 0,
        n_parallel: 4,
        threads_http: 4,
        ..ServerParams::default()
    }
}

fn serve(p: ServerParams, engine: MockEngine) -> (Server, SocketAddr) {
    let server = Server::start(p).expect("start");
    let addr = server.addrs()[0];
    server
        .attach(
            Box::new(engine),
            Arc::new(ByteCodec),
            Arc::new(PlainChat),
            ModelInfo {
                name: "mock.gguf".into(),
                n_vocab: 258,
                ..ModelInfo::default()
            },
        )
        .expect("attach");
    (server, addr)
}

fn text_ref(prompt: &str, n: usize) -> String {
    mock_greedy(&ByteCodec.tokenize(prompt, true, true), n)
}

#[test]
fn loading_then_health() {
    let server = Server::start(params()).expect("start");
    let addr = server.addrs()[0];
    let r = get(addr, "/health");
    assert_eq!(r.status, 503);
    assert_eq!(
        r.json(),
        json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    );
    server
        .attach(
            Box::new(MockEngine::new(512)),
            Arc::new(ByteCodec),
            Arc::new(PlainChat),
            ModelInfo::default(),
        )
        .expect("attach");
    let r = get(addr, "/health");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"status": "ok"}));
    server.stop();
}

#[test]
fn completion_whole_and_streamed() {
    let (server, addr) = serve(params(), MockEngine::new(512));
    let want = text_ref("Hello", 10);
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "Hello", "n_predict": 10, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let j = r.json();
    assert_eq!(j["content"], json!(want));
    assert_eq!(j["tokens_predicted"], json!(10));
    assert_eq!(j["tokens_evaluated"], json!(6));
    assert_eq!(j["stop_type"], json!("limit"));
    assert_eq!(j["generation_settings"]["n_predict"], json!(10));
    assert!(j["timings"]["predicted_n"].is_number());

    let r = post(
        addr,
        "/completion",
        json!({"prompt": "Hello", "n_predict": 10, "temperature": 0, "stream": true}),
    );
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let events = r.events();
    let last = events.last().expect("events");
    assert_eq!(last["stop"], json!(true));
    assert!(last["timings"].is_object());
    let text: String = events
        .iter()
        .filter(|e| e["stop"] == json!(false))
        .filter_map(|e| e["content"].as_str())
        .collect();
    assert_eq!(text, want);

    // Token prompts, mixed prompts, several prompts, return_tokens, response_fields.
    let toks = ByteCodec.tokenize("Hi", true, true);
    let r = post(
        addr,
        "/completion",
        json!({"prompt": toks, "n_predict": 3, "temperature": 0, "return_tokens": true}),
    );
    let j = r.json();
    assert_eq!(j["content"], json!(mock_greedy(&toks, 3)));
    assert_eq!(j["tokens"].as_array().map(Vec::len), Some(3));
    let r = post(
        addr,
        "/completion",
        json!({"prompt": [256, "Hi"], "n_predict": 2, "temperature": 0}),
    );
    assert_eq!(r.json()["content"], json!(mock_greedy(&[256, 72, 105], 2)));
    let r = post(
        addr,
        "/completion",
        json!({"prompt": ["a", "b"], "n_predict": 2, "temperature": 0}),
    );
    let arr = r.json();
    assert_eq!(arr.as_array().map(Vec::len), Some(2));
    assert_eq!(arr[1]["content"], json!(text_ref("b", 2)));
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "a", "n_predict": 2, "response_fields": ["content", "generation_settings/n_predict"]}),
    );
    let j = r.json();
    assert_eq!(j.as_object().map(|o| o.len()), Some(2), "{j}");
    assert_eq!(j["generation_settings/n_predict"], json!(2));
    server.stop();
}

#[test]
fn n_probs_pre_and_post_sampling() {
    let (server, addr) = serve(params(), MockEngine::new(512));
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "x", "n_predict": 3, "n_probs": 5, "temperature": 0}),
    );
    let j = r.json();
    let probs = j["completion_probabilities"]
        .as_array()
        .expect("probs")
        .clone();
    assert_eq!(probs.len(), 3);
    assert_eq!(probs[0]["top_logprobs"].as_array().map(Vec::len), Some(5));
    assert!(probs[0]["logprob"].as_f64().is_some_and(|l| l <= 0.0));
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "x", "n_predict": 3, "n_probs": 5, "temperature": 0, "post_sampling_probs": true}),
    );
    let j = r.json();
    let first = &j["completion_probabilities"][0];
    assert_eq!(first["prob"], json!(1.0));
    assert_eq!(
        first["top_probs"].as_array().map(Vec::len),
        Some(1),
        "greedy keeps one candidate"
    );
    server.stop();
}

#[test]
fn tokenize_detokenize_props_models() {
    let (server, addr) = serve(params(), MockEngine::new(512));
    let r = post(
        addr,
        "/tokenize",
        json!({"content": "hé", "with_pieces": true}),
    );
    assert_eq!(
        r.json(),
        json!({"tokens": [{"id": 104, "piece": "h"}, {"id": 195, "piece": [195]}, {"id": 169, "piece": [169]}]})
    );
    let r = post(
        addr,
        "/tokenize",
        json!({"content": "ab", "add_special": true}),
    );
    assert_eq!(r.json(), json!({"tokens": [256, 97, 98]}));
    let r = post(addr, "/detokenize", json!({"tokens": [104, 105]}));
    assert_eq!(r.json(), json!({"content": "hi"}));
    let r = get(addr, "/props");
    let j = r.json();
    assert_eq!(j["total_slots"], json!(4));
    assert_eq!(j["default_generation_settings"]["n_ctx"], json!(512));
    assert_eq!(post(addr, "/props", json!({})).status, 501);
    let r = get(addr, "/v1/models");
    let j = r.json();
    assert_eq!(j["object"], json!("list"));
    assert_eq!(j["data"][0]["id"], json!("mock.gguf"));
    assert_eq!(j["data"][0]["meta"]["n_vocab"], json!(258));
    assert_eq!(get(addr, "/models").status, 200);
    server.stop();
}

#[test]
fn openai_completions_and_chat() {
    let (server, addr) = serve(params(), MockEngine::new(1024));
    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": "Hey", "max_tokens": 4, "temperature": 0}),
    );
    let j = r.json();
    assert_eq!(j["object"], json!("text_completion"));
    assert_eq!(j["choices"][0]["text"], json!(text_ref("Hey", 4)));
    assert_eq!(j["choices"][0]["finish_reason"], json!("length"));
    assert_eq!(j["usage"]["completion_tokens"], json!(4));

    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": "Hey", "max_tokens": 4, "temperature": 0, "stream": true}),
    );
    let events = r.events();
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, text_ref("Hey", 4));

    let chat =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0});
    let prompt = PlainChat_render("hi");
    let r = post(addr, "/v1/chat/completions", chat.clone());
    let j = r.json();
    assert_eq!(j["object"], json!("chat.completion"));
    assert_eq!(j["choices"][0]["message"]["role"], json!("assistant"));
    assert_eq!(
        j["choices"][0]["message"]["content"],
        json!(text_ref(&prompt, 5))
    );

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = post(addr, "/chat/completions", streamed);
    let events = r.events();
    assert_eq!(
        events[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": null})
    );
    assert_eq!(events.last(), Some(&json!("[DONE]")));
    let usage = &events[events.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], json!(5));
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, text_ref(&prompt, 5));

    let r = post(
        addr,
        "/apply-template",
        json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.json(), json!({"prompt": prompt}));
    let r = post(
        addr,
        "/v1/chat/completions/input_tokens",
        json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.json()["input_tokens"], json!(prompt.len() + 1));
    let r = post(addr, "/v1/chat/completions", json!({"max_tokens": 1}));
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["message"],
        json!("'messages' is required")
    );
    server.stop();
}

#[allow(non_snake_case)]
fn PlainChat_render(user: &str) -> String {
    format!("user: {user}\nassistant:")
}

#[test]
fn error_shapes() {
    let p = ServerParams {
        api_keys: vec!["secret".into()],
        ..params()
    };
    let (server, addr) = serve(p, MockEngine::new(64));
    let auth = [
        ("Authorization", "Bearer secret"),
        ("Content-Type", "application/json"),
    ];
    let r = send(addr, "POST", "/completion", &[], "{}");
    assert_eq!(r.status, 401);
    assert_eq!(
        r.json(),
        json!({"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}})
    );
    assert_eq!(get(addr, "/health").status, 200);
    let r = send(addr, "GET", "/props", &[("X-Api-Key", "secret")], "");
    assert_eq!(r.status, 200);

    let r = send(addr, "POST", "/completion", &auth, "{not json");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], json!("invalid_request_error"));

    let r = send(
        addr,
        "POST",
        "/completion",
        &auth,
        r#"{"prompt": "a", "n_predict": "many"}"#,
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["message"],
        json!(
            "Field 'n_predict': [json.exception.type_error.302] type must be number, but is string"
        )
    );

    let long = "z".repeat(80);
    let r = send(
        addr,
        "POST",
        "/completion",
        &auth,
        &json!({"prompt": long}).to_string(),
    );
    assert_eq!(r.status, 400);
    let e = &r.json()["error"];
    assert_eq!(e["type"], json!("exceed_context_size_error"));
    assert_eq!(e["n_prompt_tokens"], json!(81));
    assert_eq!(e["n_ctx"], json!(64));

    let r = send(
        addr,
        "POST",
        "/completion",
        &auth,
        &json!({"prompt": long, "stream": true}).to_string(),
    );
    assert_eq!(
        r.status, 400,
        "a stream's first error is a plain error response"
    );

    let r = send(addr, "GET", "/nowhere", &auth, "");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], json!("not_found_error"));

    let r = send(addr, "POST", "/slots/0?action=erase", &auth, "");
    assert_eq!(r.status, 501);
    let r = send(addr, "GET", "/metrics", &auth, "");
    assert_eq!(r.status, 501);
    let r = send(addr, "POST", "/infill", &auth, "{}");
    assert_eq!(r.status, 501);
    server.stop();
}

#[test]
fn cors_headers() {
    let (server, addr) = serve(params(), MockEngine::new(64));
    let r = send(
        addr,
        "GET",
        "/health",
        &[("Origin", "http://example.com")],
        "",
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://example.com")
    );
    let r = send(
        addr,
        "OPTIONS",
        "/completion",
        &[("Origin", "http://a.b")],
        "",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-methods"),
        Some("GET, POST, DELETE, OPTIONS")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    server.stop();
}

#[test]
fn slots_metrics_and_slot_files() {
    let dir = std::env::temp_dir().join(format!("bloomery-http-slots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let p = ServerParams {
        slot_save_path: Some(dir.clone()),
        endpoint_metrics: true,
        n_parallel: 1,
        ..params()
    };
    let (server, addr) = serve(p, MockEngine::new(256));
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "keep", "n_predict": 2, "temperature": 0}),
    );
    assert_eq!(r.status, 200);
    let r = get(addr, "/slots");
    let slots = r.json();
    assert_eq!(slots[0]["id"], json!(0));
    assert_eq!(slots[0]["is_processing"], json!(false));
    assert_eq!(slots[0]["n_ctx"], json!(256));
    let r = post(addr, "/slots/0?action=save", json!({"filename": "s.bin"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["n_saved"],
        json!(6),
        "prompt (5) and the first generated token"
    );
    let r = post(addr, "/slots/0?action=save", json!({"filename": "../evil"}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["message"], json!("Invalid filename"));
    let r = post(addr, "/slots/0?action=erase", json!({}));
    assert_eq!(r.json(), json!({"id_slot": 0, "n_erased": 6}));
    let r = post(
        addr,
        "/slots/0?action=restore",
        json!({"filename": "s.bin"}),
    );
    assert_eq!(r.json()["n_restored"], json!(6));
    let r = post(addr, "/slots/abc?action=erase", json!({}));
    assert_eq!(r.json()["error"]["message"], json!("Invalid slot ID"));
    let r = post(addr, "/slots/0?action=fly", json!({}));
    assert_eq!(r.json()["error"]["message"], json!("Invalid action"));
    let r = get(addr, "/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.body
            .contains("# TYPE llamacpp:prompt_tokens_total counter"),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("llamacpp:tokens_predicted_total 2\n"),
        "{}",
        r.body
    );
    server.stop();
    let _ = std::fs::remove_dir_all(dir);
}

/// A server with one slot, and a connection whose request never ends by itself (`stream` as
/// asked).
fn endless_request(stream: bool) -> (Server, SocketAddr, TcpStream) {
    let mut engine = MockEngine::new(100_000);
    engine.step_delay = Duration::from_millis(5);
    let p = ServerParams {
        n_parallel: 1,
        ..params()
    };
    let (server, addr) = serve(p, engine);
    let mut s = TcpStream::connect(addr).expect("connect");
    let body = json!({"prompt": "forever", "n_predict": -1, "stream": stream}).to_string();
    let req = format!(
        "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    (server, addr, s)
}

/// Whether the only slot's `is_processing` became `busy` within `tries` looks 20 ms apart.
fn slot_becomes(addr: SocketAddr, busy: bool, tries: usize) -> bool {
    for _ in 0..tries {
        if get(addr, "/slots").json()[0]["is_processing"] == json!(busy) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_client_leaving_mid_stream_frees_its_slot() {
    let (server, addr, mut s) = endless_request(true);
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).expect("read");
    assert!(n > 0);
    drop(s);
    assert!(
        slot_becomes(addr, false, 200),
        "the slot stayed busy after the client left"
    );
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "next", "n_predict": 2, "temperature": 0}),
    );
    assert_eq!(r.json()["content"], json!(text_ref("next", 2)));
    server.stop();
}

#[test]
fn a_client_leaving_before_a_whole_answer_frees_its_slot() {
    // upstream's test_cancel_request: a non-streamed request whose client times out
    let (server, addr, s) = endless_request(false);
    assert!(slot_becomes(addr, true, 100), "the request never started");
    drop(s);
    assert!(
        slot_becomes(addr, false, 200),
        "the slot stayed busy after the client left"
    );
    server.stop();
}

#[test]
fn sixteen_concurrent_streams_on_four_slots_match_solo_runs() {
    let mut engine = MockEngine::new(512);
    engine.step_delay = Duration::from_millis(1);
    let p = ServerParams {
        n_parallel: 4,
        threads_http: 8,
        defaults: TaskParams {
            sampling: SamplingParams {
                temp: 0.0,
                ..SamplingParams::default()
            },
            ..TaskParams::default()
        },
        ..params()
    };
    let (server, addr) = serve(p, engine);
    let handles: Vec<_> = (0..16)
        .map(|i| {
            std::thread::spawn(move || {
                let prompt = format!("stream {i}: {}", "q".repeat(i));
                let r = post(
                    addr,
                    "/completion",
                    json!({"prompt": prompt, "n_predict": 16, "stream": true}),
                );
                let text: String = r
                    .events()
                    .iter()
                    .filter(|e| e["stop"] == json!(false))
                    .filter_map(|e| e["content"].as_str().map(str::to_owned))
                    .collect();
                (prompt, text)
            })
        })
        .collect();
    for h in handles {
        let (prompt, text) = h.join().expect("thread");
        assert_eq!(text, text_ref(&prompt, 16), "{prompt}");
    }
    server.stop();
}

#[test]
fn anthropic_messages_and_responses() {
    let (server, addr) = serve(params(), MockEngine::new(1024));
    let prompt = "system: be brief\nuser: hi\nassistant:";
    let want = text_ref(prompt, 4);
    let body = json!({"system": "be brief", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                      "max_tokens": 4, "temperature": 0});
    let r = post(addr, "/v1/messages", body.clone());
    let j = r.json();
    assert_eq!(j["type"], json!("message"));
    assert_eq!(j["content"], json!([{"type": "text", "text": want}]));
    assert_eq!(j["stop_reason"], json!("max_tokens"));
    assert_eq!(j["usage"]["output_tokens"], json!(4));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(addr, "/v1/messages", streamed);
    let names: Vec<&str> = r
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names[1], "content_block_start");
    assert_eq!(
        &names[names.len() - 3..],
        &["content_block_stop", "message_delta", "message_stop"]
    );
    let text: String = r
        .events()
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, want);

    let r = post(
        addr,
        "/v1/messages/count_tokens",
        json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(
        r.json(),
        json!({"input_tokens": "user: hi\nassistant:".len() + 1})
    );

    let r = post(
        addr,
        "/v1/responses",
        json!({"input": "hi", "max_output_tokens": 3, "temperature": 0}),
    );
    let j = r.json();
    assert_eq!(j["object"], json!("response"));
    assert_eq!(
        j["output"][0]["content"][0]["text"],
        json!(text_ref("user: hi\nassistant:", 3))
    );
    assert_eq!(j["usage"]["output_tokens"], json!(3));
    let r = post(
        addr,
        "/v1/responses",
        json!({"input": "hi", "max_output_tokens": 3, "temperature": 0, "stream": true}),
    );
    let names: Vec<&str> = r
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(&names[..2], &["response.created", "response.in_progress"]);
    assert_eq!(names.last(), Some(&"response.completed"));
    let r = post(addr, "/v1/responses", json!({"max_output_tokens": 3}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["message"], json!("'input' is required"));
    server.stop();
}

/// `--host 127.0.0.1,::1,/path/x.sock`: one server answers on every address; a second TCP address
/// needs a fixed port, as upstream says.
#[test]
fn every_host_address_is_served() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let dir = std::env::temp_dir().join(format!("bloomery-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("server.sock");
    let ipv6 = std::net::TcpListener::bind("[::1]:0").is_ok();
    let mut hosts = vec!["127.0.0.1".to_string(), sock.display().to_string()];
    if ipv6 {
        hosts.push("::1".into());
    }
    let (server, _) = serve(
        ServerParams {
            hosts,
            port,
            ..params()
        },
        MockEngine::new(4096),
    );
    let mut addrs: Vec<SocketAddr> = vec![SocketAddr::from(([127, 0, 0, 1], port))];
    if ipv6 {
        addrs.push(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)));
    }
    assert_eq!(server.addrs().len(), addrs.len());
    for addr in addrs {
        assert_eq!(get(addr, "/health").status, 200, "{addr}");
    }
    let mut unix = std::os::unix::net::UnixStream::connect(&sock).expect("unix socket");
    unix.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    unix.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(server);
    std::fs::remove_dir_all(&dir).ok();

    let refused = Server::start(ServerParams {
        hosts: vec!["127.0.0.1".into(), "::1".into()],
        port: 0,
        ..params()
    });
    let err = refused.err().expect("port 0 with two TCP addresses");
    assert!(
        err.to_string().contains("--port 0 is not supported"),
        "{err}"
    );
}

/// `--api-prefix /api`: every route moves under the prefix, anything else is upstream's 404.
#[test]
fn routes_move_under_the_api_prefix() {
    let (_server, addr) = serve(
        ServerParams {
            api_prefix: "/api".into(),
            ..params()
        },
        MockEngine::new(4096),
    );
    assert_eq!(get(addr, "/api/health").status, 200);
    let moved = get(addr, "/health");
    assert_eq!(moved.status, 404);
    assert!(moved.body.contains("File Not Found"), "{}", moved.body);
    assert_eq!(get(addr, "/api/nothing").status, 404);
}

fn embedding_server(pooling: Pooling, n_ubatch: usize) -> (Server, SocketAddr) {
    serve(
        ServerParams {
            embedding: true,
            pooling: Some(pooling),
            n_ubatch,
            n_parallel: 2,
            ..params()
        },
        MockEngine::new(64),
    )
}

fn norm2(v: &Value) -> f64 {
    v.as_array()
        .expect("a vector")
        .iter()
        .map(|x| x.as_f64().expect("a number").powi(2))
        .sum()
}

#[test]
fn embeddings_are_refused_unless_enabled() {
    let (server, addr) = serve(params(), MockEngine::new(64));
    for path in ["/embedding", "/embeddings", "/v1/embeddings"] {
        let r = post(addr, path, json!({"input": "hi"}));
        assert_eq!(r.status, 501, "{path}");
        assert_eq!(r.json()["error"]["type"], "not_supported_error");
    }
    let r = post(addr, "/rerank", json!({"query": "q", "documents": ["d"]}));
    assert_eq!(r.status, 501);
    server.stop();
    // embeddings without rank pooling still refuse reranking
    let (server, addr) = embedding_server(Pooling::Last, 512);
    assert_eq!(
        post(
            addr,
            "/v1/rerank",
            json!({"query": "q", "documents": ["d"]})
        )
        .status,
        501
    );
    server.stop();
}

#[test]
fn embeddings_pool_normalize_and_keep_input_order() {
    let (server, addr) = embedding_server(Pooling::Last, 512);
    let inputs = json!(["first prompt", "second", [65, 66, 67], {"content": [{"type": "text", "text": "sec"}, {"type": "text", "text": "ond"}]}]);
    let r = post(
        addr,
        "/v1/embeddings",
        json!({"input": inputs, "model": "m"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "m");
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), 4);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["embedding"].as_array().map(Vec::len), Some(8));
        assert!((norm2(&d["embedding"]) - 1.0).abs() < 1e-5);
    }
    // BOS + bytes: 13 + 7 + 3 (token ids as given) + 7
    assert_eq!(v["usage"], json!({"prompt_tokens": 30, "total_tokens": 30}));
    assert_eq!(
        data[1]["embedding"], data[3]["embedding"],
        "text parts join"
    );
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    // llama.cpp's shape, unnormalized on request
    let r = post(
        addr,
        "/embeddings",
        json!({"content": "second", "embd_normalize": -1}),
    );
    let raw = &r.json()[0];
    assert_eq!(raw["index"], 0);
    let row = &raw["embedding"][0];
    let n = norm2(row).sqrt();
    for (a, b) in row
        .as_array()
        .unwrap()
        .iter()
        .zip(data[1]["embedding"].as_array().unwrap())
    {
        assert!((a.as_f64().unwrap() / n - b.as_f64().unwrap()).abs() < 1e-5);
    }
    // base64 of the little-endian floats
    let r = post(
        addr,
        "/v1/embeddings",
        json!({"input": "second", "encoding_format": "base64"}),
    );
    let d = &r.json()["data"][0];
    assert_eq!(d["encoding_format"], "base64");
    assert_eq!(d["embedding"].as_str().map(str::len), Some(44));
    for (body, why) in [
        (json!({"input": []}), "an empty list"),
        (
            json!({"input": {"content": "s"}}),
            "content that is not a list of parts",
        ),
        (
            json!({"input": {"content": [{"type": "image_url"}]}}),
            "media",
        ),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "an unknown format",
        ),
        (json!({"prompt": "x"}), "no input"),
    ] {
        let r = post(addr, "/v1/embeddings", body);
        assert_eq!(r.status, 400, "{why}: {}", r.body);
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    }
    // completions still run beside embeddings
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "ab", "n_predict": 3, "temperature": 0}),
    );
    assert_eq!(r.json()["content"], json!(text_ref("ab", 3)));
    server.stop();
}

#[test]
fn last_token_pooling_splits_long_prompts_and_other_poolings_refuse_them() {
    let prompt = "a prompt longer than one small ubatch of tokens";
    let (server, addr) = embedding_server(Pooling::Last, 512);
    let whole = post(addr, "/v1/embeddings", json!({"input": prompt})).json()["data"][0].clone();
    server.stop();
    let (server, addr) = embedding_server(Pooling::Last, 8);
    let split = post(addr, "/v1/embeddings", json!({"input": prompt})).json()["data"][0].clone();
    assert_eq!(whole["embedding"], split["embedding"]);
    server.stop();
    let (server, addr) = embedding_server(Pooling::Mean, 8);
    let r = post(addr, "/v1/embeddings", json!({"input": prompt}));
    assert_eq!(r.status, 500);
    assert!(r.json()["error"]["message"].as_str().unwrap().starts_with(
        "input (48 tokens) is too large to process. increase the physical batch size"
    ));
    assert_eq!(
        post(addr, "/v1/embeddings", json!({"input": "short"})).status,
        200
    );
    server.stop();
}

#[test]
fn pooling_none_gives_every_token_on_the_native_route_only() {
    let (server, addr) = embedding_server(Pooling::None, 512);
    let r = post(addr, "/v1/embeddings", json!({"input": "abc"}));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("Pooling type 'none' is not OAI compatible"));
    let r = post(addr, "/embeddings", json!({"input": ["abc", "de"]}));
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v[0]["embedding"].as_array().map(Vec::len), Some(4));
    assert_eq!(v[1]["embedding"].as_array().map(Vec::len), Some(3));
    // unnormalized, and a token's row depends only on the tokens up to it
    assert!((norm2(&v[0]["embedding"][1]) - 1.0).abs() > 1e-3);
    assert_eq!(v[0]["embedding"][0], v[1]["embedding"][0]);
    server.stop();
}

#[test]
fn rerank_scores_sort_and_cut_in_both_shapes() {
    let (server, addr) = embedding_server(Pooling::Rank, 512);
    let docs = ["alpha", "beta", "gamma", "delta"];
    let r = post(addr, "/rerank", json!({"query": "q", "documents": docs}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 4);
    let scores: Vec<f64> = results
        .iter()
        .map(|e| e["relevance_score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let mut seen: Vec<u64> = results
        .iter()
        .map(|e| e["index"].as_u64().unwrap())
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3]);
    // each score is the document's own: the same asked alone
    let best = results[0]["index"].as_u64().unwrap() as usize;
    let alone = post(
        addr,
        "/v1/rerank",
        json!({"query": "q", "documents": [docs[best]]}),
    )
    .json();
    assert_eq!(
        alone["results"][0]["relevance_score"],
        results[0]["relevance_score"]
    );
    let tei = post(
        addr,
        "/reranking",
        json!({"query": "q", "texts": docs, "top_n": 2, "return_text": true}),
    )
    .json();
    assert_eq!(tei.as_array().map(Vec::len), Some(2));
    assert_eq!(tei[0]["score"], results[0]["relevance_score"]);
    assert_eq!(tei[0]["text"], docs[best]);
    for (body, why) in [
        (json!({"query": "q", "documents": []}), "no documents"),
        (json!({"query": "q", "documents": null}), "null documents"),
        (json!({"query": "q", "documents": 123}), "a number"),
        (json!({"query": "q", "documents": [1, 2]}), "numbers"),
        (
            json!({"query": 5, "documents": ["a"]}),
            "a query that is not a string",
        ),
        (json!({"documents": ["a"]}), "no query"),
    ] {
        assert_eq!(post(addr, "/rerank", body).status, 400, "{why}");
    }
    server.stop();
}
