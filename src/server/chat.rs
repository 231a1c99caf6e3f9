//! The one place chat requests become prompt text. The chat-template module plugs in through
//! [`ChatRenderer`]; until a model's template is wired, [`PlainChat`] lays messages out plainly.

use serde_json::{json, Value};

use super::task::{ErrorKind, TaskError};

/// Renders OpenAI-style messages into a prompt (upstream's `common_chat_templates_apply`).
pub trait ChatRenderer: Send + Sync {
    fn render(
        &self,
        messages: &[Value],
        tools: &Value,
        add_generation_prompt: bool,
        kwargs: &Value,
    ) -> Result<String, String>;

    /// The template source, as `/props` reports it.
    fn source(&self) -> String;

    /// (role, marker) pairs that start the template's messages, as upstream's chat handling
    /// passes them on (`message_delimiters`); none by default.
    fn message_delimiters(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Whether prompts come from a Jinja template (upstream's chat parser then shapes JSON
    /// replies) rather than a built-in format (`--no-jinja`).
    fn jinja(&self) -> bool {
        true
    }

    /// The tags that open and close the template's thinking block, when it has one (what a
    /// reasoning budget counts between).
    fn thinking_tags(&self) -> Option<(String, String)> {
        None
    }

    /// A finished reply split into content, reasoning and tool calls as the template's family
    /// writes them (upstream's chat parsing); `prompt` is the rendered prompt the reply follows.
    /// By default everything is content.
    fn parse_reply(
        &self,
        _prompt: &str,
        text: &str,
        _reasoning_format: &str,
        _parse_tools: bool,
    ) -> Result<Reply, String> {
        Ok(Reply {
            content: text.to_string(),
            ..Reply::default()
        })
    }

    /// The same split while a reply streams; `None` (the default) streams the text as content.
    fn reply_stream(
        &self,
        _prompt: &str,
        _reasoning_format: &str,
        _parse_tools: bool,
    ) -> Result<Option<Box<dyn ReplyStream>>, String> {
        Ok(None)
    }

    /// What the template supports (`/props` `chat_template_caps`); by default what a template
    /// of plain string messages supports.
    fn caps(&self) -> Value {
        json!({
            "supports_object_arguments": false,
            "supports_parallel_tool_calls": false,
            "supports_preserve_reasoning": false,
            "supports_reasoning_effort": false,
            "supports_string_content": true,
            "supports_system_role": true,
            "supports_tool_calls": false,
            "supports_tools": false,
            "supports_typed_content": false,
        })
    }
}

/// A reply parsed as it streams: each call returns the `delta` objects of the chunks to send
/// (`{"content": ..}`, `{"reasoning_content": ..}`, `{"tool_calls": [{"index", ..}]}`).
pub trait ReplyStream: Send {
    /// Adds generated text.
    fn push(&mut self, piece: &str) -> Vec<Value>;
    /// Ends the reply: what was held back.
    fn finish(self: Box<Self>) -> Vec<Value>;
}

/// How a chat request's reply is parsed: the rendered prompt it follows, the reasoning format
/// and whether tool calls are looked for. `None` where `--skip-chat-parsing` leaves replies whole.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplyParsing {
    pub prompt: String,
    pub reasoning_format: String,
    pub parse_tools: bool,
    /// The request asked for a JSON response (`response_format`, `json_schema`): the content is
    /// the JSON value alone, without the whitespace or ```json fence the grammar allows around it.
    pub json_reply: bool,
}

/// The content of a reply constrained to a JSON response, as upstream's chat parser extracts
/// it: leading whitespace and an opening ```json fence are dropped; once the value is complete,
/// nothing after it counts (whitespace, the closing fence). While the value is still open,
/// everything so far is content.
pub fn json_reply_content(text: &str) -> &str {
    let mut rest = text.trim_start();
    if let Some(fenced) = rest.strip_prefix("```json") {
        rest = fenced.trim_start();
    }
    &rest[..json_value_end(rest).unwrap_or(rest.len())]
}

/// Where the JSON value at the start of `text` ends, when it is complete. A bare number or
/// literal ends at the first character that cannot continue it.
fn json_value_end(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    match bytes.first()? {
        b'{' | b'[' | b'"' => {
            let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
            for (i, &b) in bytes.iter().enumerate() {
                if in_string {
                    match b {
                        _ if escaped => escaped = false,
                        b'\\' => escaped = true,
                        b'"' => {
                            in_string = false;
                            if depth == 0 {
                                return Some(i + 1);
                            }
                        }
                        _ => {}
                    }
                    continue;
                }
                match b {
                    b'"' => in_string = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
            }
            None
        }
        _ => bytes
            .iter()
            .position(|b| b.is_ascii_whitespace() || *b == b'`'),
    }
}

/// Streams a JSON reply's content (see `json_reply_content`) as it grows.
pub struct JsonReplyStream {
    text: String,
    sent: usize,
}

impl JsonReplyStream {
    pub fn new() -> Self {
        JsonReplyStream {
            text: String::new(),
            sent: 0,
        }
    }
}

impl Default for JsonReplyStream {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplyStream for JsonReplyStream {
    fn push(&mut self, piece: &str) -> Vec<Value> {
        self.text.push_str(piece);
        let content = json_reply_content(&self.text);
        if content.len() <= self.sent {
            return Vec::new();
        }
        let delta = content[self.sent..].to_string();
        self.sent = content.len();
        vec![json!({ "content": delta })]
    }

    fn finish(self: Box<Self>) -> Vec<Value> {
        Vec::new()
    }
}

/// An assistant reply as the OpenAI message carries it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    pub content: String,
    pub reasoning_content: String,
    /// `{"type": "function", "function": {"name", "arguments"}, "id"?}` each.
    pub tool_calls: Vec<Value>,
}

impl Reply {
    /// The `message` object upstream writes: `content` always (empty when there is none), then
    /// `reasoning_content` and `tool_calls` when present.
    pub fn message(&self) -> Value {
        let mut m = json!({"role": "assistant", "content": self.content});
        if !self.reasoning_content.is_empty() {
            m["reasoning_content"] = json!(self.reasoning_content);
        }
        if !self.tool_calls.is_empty() {
            m["tool_calls"] = Value::Array(self.tool_calls.clone());
        }
        m
    }
}

/// `role: content` lines and a trailing `assistant:` when a generation prompt is asked for.
pub struct PlainChat;

impl ChatRenderer for PlainChat {
    fn render(
        &self,
        messages: &[Value],
        _tools: &Value,
        add_generation_prompt: bool,
        _kwargs: &Value,
    ) -> Result<String, String> {
        let mut out = String::new();
        for m in messages {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
            out.push_str(role);
            out.push_str(": ");
            out.push_str(&content_text(m.get("content").unwrap_or(&Value::Null))?);
            out.push('\n');
        }
        if add_generation_prompt {
            out.push_str("assistant:");
        }
        Ok(out)
    }

    fn source(&self) -> String {
        String::new()
    }
}

/// How a media part is refused, after its kind: multimodal input is not built, so every model
/// is served as upstream serves one without a projector.
pub const MEDIA_REFUSED: &str =
    "input is not supported - hint: if this is unexpected, you may need to provide the mmproj";

/// A message's content as text: a string, or the `text` parts of an array.
pub fn content_text(content: &Value) -> Result<String, String> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") | Some("input_text") | Some("output_text") => {
                        out.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                    Some(kind @ ("image_url" | "input_audio" | "input_video" | "video_url")) => {
                        let media = match kind {
                            "image_url" => "image",
                            "input_audio" => "audio",
                            _ => "video",
                        };
                        return Err(format!("{media} {MEDIA_REFUSED}"));
                    }
                    Some(other) => return Err(format!("unsupported content[].type: {other}")),
                    None => return Err("Missing content part type".into()),
                }
            }
            Ok(out)
        }
        _ => Err("Invalid 'content' type".into()),
    }
}

/// An Anthropic image block as an OpenAI `image_url` part (a data URL for base64 sources).
fn anthropic_image(block: &Value) -> Option<Value> {
    let source = block.get("source")?;
    let field = |k: &str| source.get(k).and_then(Value::as_str);
    let url = match field("type")? {
        "base64" => format!(
            "data:{};base64,{}",
            field("media_type").unwrap_or("image/jpeg"),
            field("data").unwrap_or("")
        ),
        "url" => field("url").unwrap_or("").to_string(),
        _ => return None,
    };
    Some(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// Anthropic Messages body to an OpenAI chat body (upstream's
/// `server_chat_convert_anthropic_to_oai`, text and tool blocks).
pub fn anthropic_to_chat(body: &Value) -> Result<Value, TaskError> {
    let mut messages = Vec::new();
    match body.get("system") {
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let text: String = blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            messages.push(json!({"role": "system", "content": text}));
        }
        _ => {}
    }
    let input = body
        .get("messages")
        .ok_or_else(|| TaskError::new(ErrorKind::Server, "'messages' is required"))?;
    for msg in input.as_array().map(Vec::as_slice).unwrap_or_default() {
        let role = msg.get("role").and_then(Value::as_str).unwrap_or("");
        let Some(content) = msg.get("content") else {
            if role != "assistant" {
                messages.push(msg.clone());
            }
            continue;
        };
        let Some(blocks) = content.as_array() else {
            messages.push(msg.clone());
            continue;
        };
        let mut parts = Vec::new();
        let mut tool_calls = Vec::new();
        let mut tool_results = Vec::new();
        let mut reasoning = String::new();
        for block in blocks {
            match block.get("type").and_then(Value::as_str).unwrap_or("") {
                "text" => parts.push(block.clone()),
                "thinking" => {
                    reasoning.push_str(block.get("thinking").and_then(Value::as_str).unwrap_or(""))
                }
                "tool_use" => tool_calls.push(json!({
                    "id": block.get("id").and_then(Value::as_str).unwrap_or(""),
                    "type": "function",
                    "function": {
                        "name": block.get("name").and_then(Value::as_str).unwrap_or(""),
                        "arguments": block.get("input").cloned().unwrap_or(json!({})).to_string(),
                    },
                })),
                "tool_result" => {
                    let id = block
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    let content = match block.get("content") {
                        Some(Value::String(s)) => json!(s),
                        Some(Value::Array(items)) => {
                            // text alone collapses to a string; with images, OpenAI parts
                            let parts: Vec<Value> = items
                                .iter()
                                .filter_map(|c| match c.get("type").and_then(Value::as_str) {
                                    Some("text") => Some(json!({"type": "text",
                                        "text": c.get("text").and_then(Value::as_str).unwrap_or("")})),
                                    Some("image") => anthropic_image(c),
                                    _ => None,
                                })
                                .collect();
                            if parts.iter().any(|p| p["type"] == "image_url") {
                                Value::Array(parts)
                            } else {
                                json!(parts
                                    .iter()
                                    .filter_map(|p| p["text"].as_str())
                                    .collect::<String>())
                            }
                        }
                        _ => json!(""),
                    };
                    tool_results
                        .push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                }
                "image" => parts.extend(anthropic_image(block)),
                _ => {}
            }
        }
        if !parts.is_empty() || !tool_calls.is_empty() || !reasoning.is_empty() {
            let mut m = json!({"role": role});
            m["content"] = if parts.is_empty() {
                json!("")
            } else {
                Value::Array(parts)
            };
            if !tool_calls.is_empty() {
                m["tool_calls"] = Value::Array(tool_calls);
            }
            if !reasoning.is_empty() {
                m["reasoning_content"] = json!(reasoning);
            }
            messages.push(m);
        }
        messages.extend(tool_results);
    }
    let mut out = json!({"messages": messages});
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        out["tools"] = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name").and_then(Value::as_str).unwrap_or(""),
                    "description": t.get("description").and_then(Value::as_str).unwrap_or(""),
                    "parameters": t.get("input_schema").cloned().unwrap_or(json!({})),
                }})
            })
            .collect();
    }
    // Anthropic's choice objects map onto OpenAI's names; anything else is left out
    let choice = body
        .get("tool_choice")
        .and_then(|c| c.get("type"))
        .and_then(Value::as_str);
    match choice {
        Some("auto") => out["tool_choice"] = json!("auto"),
        Some("any" | "tool") => out["tool_choice"] = json!("required"),
        _ => {}
    }
    if let Some(stop) = body.get("stop_sequences") {
        out["stop"] = stop.clone();
    }
    out["max_tokens"] = body.get("max_tokens").cloned().unwrap_or(json!(4096));
    for key in [
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "chat_template_kwargs",
    ] {
        if let Some(v) = body.get(key) {
            out[key] = v.clone();
        }
    }
    Ok(out)
}

/// OpenAI Responses body to a chat body (upstream's
/// `server_chat_convert_responses_to_chatcmpl`, text messages).
pub fn responses_to_chat(body: &Value) -> Result<Value, TaskError> {
    let input = body
        .get("input")
        .ok_or_else(|| TaskError::invalid("'input' is required"))?;
    if body
        .get("previous_response_id")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return Err(TaskError::invalid(
            "llama.cpp does not support 'previous_response_id'.",
        ));
    }
    let mut out = body.as_object().cloned().unwrap_or_default();
    out.remove("input");
    let mut messages = Vec::new();
    if let Some(instructions) = out.remove("instructions") {
        messages.push(json!({"role": "system", "content": instructions.as_str().unwrap_or("")}));
    }
    match input {
        Value::String(s) => messages.push(json!({"role": "user", "content": s})),
        Value::Array(items) => {
            for item in items {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                let parts: Vec<Value> = match item.get("content") {
                    Some(Value::String(s)) => vec![json!({"type": "input_text", "text": s})],
                    Some(Value::Array(p)) => p.clone(),
                    _ => return Err(TaskError::invalid("Cannot determine type of 'item'")),
                };
                let mut text = String::new();
                for p in &parts {
                    match p.get("type").and_then(Value::as_str).unwrap_or("") {
                        "input_text" | "output_text" => {
                            let t = p.get("text").and_then(Value::as_str).ok_or_else(|| {
                                TaskError::invalid("'Input text' requires 'text'")
                            })?;
                            text.push_str(t);
                        }
                        "input_file" => {
                            return Err(TaskError::invalid(
                                "'input_file' is not supported by llamacpp at this moment",
                            ))
                        }
                        _ => return Err(TaskError::invalid(
                            "'type' must be one of 'input_text', 'input_image', or 'input_file'",
                        )),
                    }
                }
                match role {
                    "user" | "system" | "developer" | "assistant" => {
                        messages.push(json!({"role": role, "content": text}))
                    }
                    _ => return Err(TaskError::invalid("Cannot determine type of 'item'")),
                }
            }
        }
        _ => {
            return Err(TaskError::invalid(
                "'input' must be a string or array of objects",
            ))
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(max) = out.remove("max_output_tokens") {
        out.insert("max_tokens".into(), max);
    }
    out.remove("reasoning");
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_reply_is_the_value_alone() {
        assert_eq!(
            json_reply_content("\n {\"a\": \"}\\\"\"}\n"),
            "{\"a\": \"}\\\"\"}"
        );
        assert_eq!(json_reply_content("```json\n[1, [2]]\n```"), "[1, [2]]");
        assert_eq!(json_reply_content("{\n  \"a\": 1,\n"), "{\n  \"a\": 1,\n");
        assert_eq!(json_reply_content("  42\n"), "42");
        assert_eq!(json_reply_content("\"x\" "), "\"x\"");
    }

    #[test]
    fn a_json_reply_streams_without_the_whitespace_around_it() {
        let mut s: Box<dyn ReplyStream> = Box::new(JsonReplyStream::new());
        let mut out = String::new();
        for piece in ["\n", "{", "\n", "  \"a\"", ": 1", "\n", "}", "\n"] {
            for d in s.push(piece) {
                out.push_str(d["content"].as_str().unwrap());
            }
        }
        assert!(s.finish().is_empty());
        assert_eq!(out, "{\n  \"a\": 1\n}");
    }

    #[test]
    fn reply_messages_have_upstreams_shape() {
        let plain = Reply {
            content: "hi".into(),
            ..Reply::default()
        };
        assert_eq!(
            plain.message(),
            json!({"role": "assistant", "content": "hi"})
        );
        let full = Reply {
            content: String::new(),
            reasoning_content: "think".into(),
            tool_calls: vec![
                json!({"type": "function", "function": {"name": "f", "arguments": "{}"}}),
            ],
        };
        let m = full.message();
        assert_eq!(m["content"], "", "content stays, empty, beside tool calls");
        assert_eq!(m["reasoning_content"], "think");
        assert_eq!(m["tool_calls"][0]["function"]["name"], "f");
        // the default renderer leaves a reply whole
        let r = PlainChat
            .parse_reply("", "<think>x</think>y", "deepseek", true)
            .unwrap();
        assert_eq!(
            r,
            Reply {
                content: "<think>x</think>y".into(),
                ..Reply::default()
            }
        );
    }
}
