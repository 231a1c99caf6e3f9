//! Chat templates: picking one from GGUF metadata or the command line, and rendering an
//! OpenAI-style conversation into a prompt exactly as upstream's `/apply-template` does,
//! including the message normalisation and per-family adjustments upstream applies before the
//! template sees the messages.

use serde_json::{json, Map, Value as Json};

use super::caps::{self, Caps};
use super::clock;
use super::jinja;
use super::legacy;
use super::ChatError;

/// Upstream's fallback when a model has no template: ChatML.
pub const CHATML_SOURCE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}";

/// Special tokens a template may print, and whether the tokenizer adds them itself (then a
/// rendered leading BOS / trailing EOS is dropped so it is not doubled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos_token: String,
    pub eos_token: String,
    pub add_bos: bool,
    pub add_eos: bool,
}

/// Everything a render takes besides the template.
#[derive(Debug, Clone)]
pub struct RenderInputs<'a> {
    /// OpenAI `messages`.
    pub messages: &'a Json,
    /// OpenAI `tools` (absent, null or an empty list all mean no tools).
    pub tools: Option<&'a Json>,
    pub add_generation_prompt: bool,
    /// `chat_template_kwargs` (server defaults merged with the request's); become template
    /// variables, `enable_thinking` and `reasoning_effort` included.
    pub kwargs: &'a Map<String, Json>,
    /// False for `--reasoning off`; thinking is then on when the template supports it,
    /// unless the kwargs say otherwise.
    pub enable_thinking: bool,
    /// Clock for `strftime_now`, `datetime` and `date_string`, in seconds since the epoch;
    /// `None` is now.
    pub now: Option<i64>,
}

/// A parsed chat template with the capabilities its probes showed.
pub struct ChatTemplate {
    source: String,
    tokens: SpecialTokens,
    caps: Caps,
    /// How earlier reasoning is wrapped, used to reopen it when continuing a message.
    reasoning_wrapping: Option<(String, String)>,
    env: minijinja::Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("caps", &self.caps)
            .field("tokens", &self.tokens)
            .finish()
    }
}

const TEMPLATE_NAME: &str = "chat_template";

impl ChatTemplate {
    /// Parses `source` (Jinja) and probes what it supports. Refuses a template that does not
    /// parse, naming the parser's complaint.
    pub fn from_source(source: &str, tokens: SpecialTokens) -> Result<Self, ChatError> {
        let source = patch_source(source);
        let mut env = jinja::environment();
        env.add_template_owned(TEMPLATE_NAME, super::plus::rewrite(&source))
            .map_err(|e| ChatError::Template(format!("chat template does not parse: {e:#}")))?;
        let mut template = ChatTemplate {
            source,
            tokens,
            caps: NO_CAPS,
            reasoning_wrapping: None,
            env,
        };
        template.caps = caps::detect(|ctx| template.render_context(jinja::from_json(ctx)).ok());
        template.reasoning_wrapping =
            caps::reasoning_wrapping(|ctx| template.render_context(jinja::from_json(ctx)).ok());
        Ok(template)
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// How the template wraps an assistant message's reasoning: the opening tag with the
    /// whitespace after it, and the closing tag with the whitespace around it (Qwen3:
    /// `<think>\n`, `\n</think>\n\n`); `None` when it shows no reasoning.
    pub fn reasoning_wrapping(&self) -> Option<&(String, String)> {
        self.reasoning_wrapping.as_ref()
    }

    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Whether the server turns thinking on for this template by default (upstream decides
    /// it at load: dedicated family handlers say so, otherwise reasoning markers must show).
    pub fn supports_thinking(&self) -> bool {
        match specialised_family(&self.source) {
            Some(Family::GigaChatV3) => false,
            Some(Family::Qwen3Coder) | None => self.caps.supports_thinking,
            Some(_) => true,
        }
    }

    pub fn tokens(&self) -> &SpecialTokens {
        &self.tokens
    }

    fn render_context(&self, ctx: minijinja::Value) -> Result<String, ChatError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Template(format!("{e:#}")))?;
        template
            .render(ctx)
            .map_err(|e| ChatError::Template(render_error(&e)))
    }

    /// Renders a conversation as upstream's `/apply-template` would.
    /// A trailing assistant message is continued (upstream's default prefill).
    pub fn render(&self, inputs: &RenderInputs) -> Result<String, ChatError> {
        self.render_with_prefill(inputs, true)
    }

    /// Renders with `prefill_assistant` chosen (false for `--no-prefill-assistant`: a trailing
    /// assistant message is then closed like any other).
    pub fn render_with_prefill(
        &self,
        inputs: &RenderInputs,
        prefill_assistant: bool,
    ) -> Result<String, ChatError> {
        let mut messages = parse_messages(inputs.messages)?;
        let tools = parse_tools(inputs.tools)?;
        let now = inputs.now.unwrap_or_else(clock::now_seconds);
        // a trailing assistant message is continued, not closed (upstream's prefill)
        let continued = match messages.last() {
            Some(last) if prefill_assistant && last.role == "assistant" => {
                if messages.len() >= 2 && messages[messages.len() - 2].role == "assistant" {
                    return Err(ChatError::Messages(
                        "Cannot have 2 or more assistant messages at the end of the list.".into(),
                    ));
                }
                if !last.tool_calls.is_empty() {
                    return Err(ChatError::Messages(
                        "Cannot continue an assistant message that contains tool calls.".into(),
                    ));
                }
                messages.pop()
            }
            _ => None,
        };
        let messages = self.messages_for_template(messages)?;
        let Some(last) = continued else {
            return self.apply(
                messages,
                tools.as_ref(),
                inputs.add_generation_prompt,
                inputs,
                now,
            );
        };
        let closed = self.apply(messages.clone(), tools.as_ref(), false, inputs, now)?;
        let opened = self.apply(messages, tools.as_ref(), true, inputs, now)?;
        let mut generation = generation_prompt(&closed, &opened).to_string();
        let content = last.render_content();
        let reasoning_only =
            !last.reasoning.is_empty() && last.content.is_empty() && last.parts.is_empty();
        // without reasoning shown in history, the family's bare tags
        let wrapping = self.reasoning_wrapping.clone().unwrap_or_else(|| {
            let format = super::output::OutputFormat::for_template(self, "");
            (format.think_start, format.think_end)
        });
        if self.supports_thinking() {
            let (start, end) = (&wrapping.0, &wrapping.1);
            if let Some(at) = generation.find(start.as_str()) {
                generation.truncate(at);
            }
            generation.push_str(start);
            generation.push_str(&last.reasoning);
            if !reasoning_only {
                generation.push_str(end);
            }
        }
        if !reasoning_only {
            generation.push_str(&content);
        }
        Ok(closed + &generation)
    }

    /// Upstream's direct application of the template to prepared messages.
    fn apply(
        &self,
        mut messages: Vec<Json>,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        inputs: &RenderInputs,
        now: i64,
    ) -> Result<String, ChatError> {
        let mut ctx = Map::new();
        ctx.insert("bos_token".into(), json!(self.tokens.bos_token));
        ctx.insert("eos_token".into(), json!(self.tokens.eos_token));
        let thinking = inputs.enable_thinking && self.supports_thinking();
        ctx.insert("enable_thinking".into(), json!(thinking));
        if let Some(tools) = tools {
            ctx.insert("tools".into(), tools.clone());
        }
        ctx.insert("datetime".into(), json!(clock::strftime("%b %d %Y", now)));
        ctx.insert(
            "date_string".into(),
            json!(clock::strftime("%d %b %Y", now)),
        );
        for (key, value) in inputs.kwargs {
            ctx.insert(key.clone(), value.clone());
        }
        // a non-boolean `enable_thinking` kwarg stays as given, like any other kwarg
        if let Some(Json::Bool(enabled)) = inputs.kwargs.get("enable_thinking") {
            ctx.insert("enable_thinking".into(), json!(enabled));
        }
        if add_generation_prompt {
            ctx.insert("add_generation_prompt".into(), json!(true));
        }
        if let Some(Json::Bool(enabled)) = ctx.get("preserve_reasoning").cloned() {
            ctx.insert("preserve_thinking".into(), json!(enabled));
            for key in [
                "clear_thinking",
                "truncate_history_thinking",
                "drop_thinking",
            ] {
                ctx.insert(key.into(), json!(!enabled));
            }
        }
        if let Some(Json::String(effort)) = ctx.get("reasoning_effort").cloned() {
            if !effort.is_empty() {
                ctx.insert("reasoning_strength".into(), json!(effort));
            }
        }
        self.adjust_for_family(&mut messages);
        ctx.insert("messages".into(), Json::Array(messages));

        ctx.insert(jinja::NOW_VAR.into(), json!(now));
        let mut prompt = self.render_context(jinja::from_json(&Json::Object(ctx)))?;

        if self.tokens.add_bos && !self.tokens.bos_token.is_empty() {
            if let Some(rest) = prompt.strip_prefix(self.tokens.bos_token.as_str()) {
                prompt = rest.to_string();
            }
        }
        if self.tokens.add_eos && !self.tokens.eos_token.is_empty() {
            if let Some(rest) = prompt.strip_suffix(self.tokens.eos_token.as_str()) {
                prompt = rest.to_string();
            }
        }
        if add_generation_prompt
            && self.source.contains(GEMMA4_TOOL_CALL)
            && prompt.ends_with("<turn|>\n")
        {
            // Gemma 4 leaves the model turn unopened after a tool call; upstream opens it
            prompt.push_str("<|turn>model\n");
        }
        Ok(prompt)
    }

    /// Messages in the JSON shape templates read, normalised for this template's
    /// capabilities (upstream's `to_json_oaicompat`, content normaliser and workarounds).
    fn messages_for_template(&self, messages: Vec<Message>) -> Result<Vec<Json>, ChatError> {
        let trim = self
            .source
            .contains("You have access to the following functions in JSONSchema format");
        let only_string = self.caps.supports_string_content && !self.caps.supports_typed_content;
        let only_typed = !self.caps.supports_string_content && self.caps.supports_typed_content;
        let mut out: Vec<Json> = messages
            .into_iter()
            .map(|m| {
                let m = if trim { m.trimmed() } else { m };
                let mut j = m.to_json();
                if let Some(content) = j.get_mut("content") {
                    if only_typed {
                        if let Some(text) = content.as_str() {
                            *content = json!([{"type": "text", "text": text}]);
                        }
                    } else if only_string && content.is_array() {
                        *content = json!(concat_parts(content));
                    }
                }
                j
            })
            .collect();

        if !self.source.contains("<|channel|>") {
            for m in &mut out {
                if m["role"] == "developer" {
                    m["role"] = json!("system");
                }
            }
        }
        if !self.caps.supports_system_role && out.first().is_some_and(|m| m["role"] == "system") {
            let system = out.remove(0);
            if let Some(next) = out.first_mut() {
                let first = system["content"].as_str().unwrap_or_default().to_string();
                let second = next["content"].as_str().unwrap_or_default().to_string();
                next["content"] = json!(format!("{first}\n{second}"));
            }
        }
        if self.caps.supports_object_arguments {
            for m in &mut out {
                let Some(calls) = m.get_mut("tool_calls").and_then(Json::as_array_mut) else {
                    continue;
                };
                for call in calls {
                    let Some(args) = call.pointer_mut("/function/arguments") else {
                        continue;
                    };
                    if let Some(text) = args.as_str() {
                        *args = serde_json::from_str(text).map_err(|e| {
                            ChatError::Messages(format!(
                                "Failed to parse tool call arguments as JSON: {e}: {text}"
                            ))
                        })?;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Per-family message reshaping upstream does in its dedicated handlers.
    fn adjust_for_family(&self, messages: &mut [Json]) {
        let src = &self.source;
        let ministral = src.contains("[SYSTEM_PROMPT]")
            && src.contains("[TOOL_CALLS]")
            && src.contains("[ARGS]")
            && !src.contains("[CALL_ID]");
        let thinking_field = !ministral
            && (src.contains("chat_format=llm-jp-harmony-v1")
                || src.contains("<|channel|>")
                || is_lfm2(src)
                || (src.contains("List of tools: [") && !src.contains("<|tool_list_start|>")));
        let harmony = !ministral
            && (src.contains("<|channel|>") || src.contains("chat_format=llm-jp-harmony-v1"));
        if ministral {
            for m in messages.iter_mut() {
                ministral_blocks(m);
            }
        } else if thinking_field {
            for m in messages.iter_mut() {
                let Some(reasoning) = m
                    .get("reasoning_content")
                    .and_then(Json::as_str)
                    .map(str::to_string)
                else {
                    continue;
                };
                let has_calls = m
                    .get("tool_calls")
                    .and_then(Json::as_array)
                    .is_some_and(|c| !c.is_empty());
                if let Some(obj) = m.as_object_mut() {
                    obj.insert("thinking".into(), json!(reasoning));
                    if harmony && has_calls {
                        obj.shift_remove("content");
                    }
                }
            }
        } else if self.is_deepseek_v4() {
            sort_deepseek_tool_results(messages);
        }
    }

    fn is_deepseek_v4(&self) -> bool {
        let src = &self.source;
        specialised_family(src) == Some(Family::DeepSeekDsml) && !src.contains("function_calls")
    }
}

const NO_CAPS: Caps = Caps {
    supports_string_content: true,
    supports_typed_content: false,
    supports_system_role: true,
    supports_tools: true,
    supports_tool_calls: true,
    supports_parallel_tool_calls: true,
    supports_object_arguments: false,
    supports_preserve_reasoning: false,
    supports_thinking: false,
};

const GEMMA4_TOOL_CALL: &str = "'<|tool_call>call:'";

fn is_lfm2(src: &str) -> bool {
    src.contains("<|tool_list_start|>") && src.contains("<|tool_list_end|>")
}

/// Template families upstream handles with a dedicated (non-generic) handler, in upstream's
/// order of detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Ministral3,
    LlmJpHarmony,
    GptOss,
    MuseGlimmer,
    FunctionaryV32,
    KimiK2,
    KimiK3,
    Ling3,
    Cohere2Moe,
    Lfm2,
    Lfm25,
    GigaChatV3,
    MiniMaxM3,
    DeepSeekDsml,
    Gemma4,
    MiniCpm5,
    Qwen3Coder,
}

pub(crate) fn specialised_family(src: &str) -> Option<Family> {
    let has = |s: &str| src.contains(s);
    Some(
        if has("[SYSTEM_PROMPT]") && has("[TOOL_CALLS]") && has("[ARGS]") && !has("[CALL_ID]") {
            Family::Ministral3
        } else if has("chat_format=llm-jp-harmony-v1") {
            Family::LlmJpHarmony
        } else if has("<|channel|>") {
            Family::GptOss
        } else if has("<atem:function_calls>") && has("<|eom|>") {
            Family::MuseGlimmer
        } else if has(">>>all") && has(">>>${recipient}") {
            Family::FunctionaryV32
        } else if has("<|tool_calls_section_begin|>") && has("<|tool_call_begin|>") {
            Family::KimiK2
        } else if has("<|open|>") && has("<|close|>") && has("<|end_of_msg|>") {
            Family::KimiK3
        } else if has("<role>ASSISTANT</role>") && has("<arg_key>") {
            Family::Ling3
        } else if has("<|START_TEXT|>") && has("<|START_ACTION|>") {
            Family::Cohere2Moe
        } else if is_lfm2(src) {
            Family::Lfm2
        } else if has("List of tools: [") && !has("<|tool_list_start|>") {
            Family::Lfm25
        } else if has("<|role_sep|>") && has("<|message_sep|>") && !has("<|function_call|>") {
            Family::GigaChatV3
        } else if has("]<]minimax[>[") && has("<tool_call>") && has("<invoke name=") {
            Family::MiniMaxM3
        } else if has("dsml_token") && has("DSML") && (has("function_calls") || has("tool_calls")) {
            Family::DeepSeekDsml
        } else if has(GEMMA4_TOOL_CALL) {
            Family::Gemma4
        } else if has("Tool usage guidelines:") && has("<function name=\"") && has("<param name=\"")
        {
            Family::MiniCpm5
        } else if has("<tool_call>")
            && has("<function=")
            && has("<parameter=")
            && !has("'<tool_call><function=' ~ tool_call.name ~ '>'")
        {
            Family::Qwen3Coder
        } else {
            return None;
        },
    )
}

/// Source fixes upstream applies before parsing, for templates that would otherwise refuse
/// ordinary conversations.
fn patch_source(source: &str) -> String {
    let mut src = source.to_string();
    if src.contains("<|channel|>") && src.contains("in message.content or") {
        src = src.replace(
            "{%- if \"<|channel|>analysis<|message|>\" in message.content or \"<|channel|>final<|message|>\" in message.content %}",
            "{%- if false %}",
        );
    }
    if src.contains("[TOOL_CALLS]") && src.contains("if (message['content'] is none or") {
        src = src.replace(
            "{%- if (message['content'] is none or message['content'] == '' or message['content']|length == 0) and (message['tool_calls'] is not defined or message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
            "{%- if false %}",
        );
    }
    // Hugging Face's `{% generation %}` marks the assistant span for training; it renders its
    // body unchanged, which a plain `if true` block does while keeping the trim markers
    let generation =
        regex::Regex::new(r"\{%(-?)\s*(end)?generation\s*(-?)%\}").expect("valid regex");
    let src = generation.replace_all(&src, |c: &regex::Captures| {
        let keyword = if c.get(2).is_some() {
            "endif"
        } else {
            "if true"
        };
        format!("{{%{} {keyword} {}%}}", &c[1], &c[3])
    });
    src.replace("\r\n", "\n").replace('\r', "\n")
}

fn render_error(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        msg.push_str(": ");
        msg.push_str(&inner.to_string());
        source = inner.source();
    }
    msg
}

/// One message after upstream's parsing (`common_chat_msgs_parse_oaicompat`).
#[derive(Debug, Clone, Default)]
struct Message {
    role: String,
    content: String,
    parts: Vec<(String, String)>,
    reasoning: String,
    name: String,
    tool_call_id: String,
    tool_calls: Vec<ToolCallIn>,
}

#[derive(Debug, Clone)]
struct ToolCallIn {
    id: String,
    name: String,
    arguments: String,
}

impl Message {
    /// The text a built-in format sees: the content, then each text or media-marker part, a
    /// newline before each part once there is text.
    fn builtin_content(&self) -> String {
        let mut text = self.content.clone();
        for (_, part) in &self.parts {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(part);
        }
        text
    }

    /// The text of the message as upstream renders a continued one: its content, or its text
    /// parts with a blank line between them (none before the first non-empty text).
    fn render_content(&self) -> String {
        if !self.content.is_empty() {
            return self.content.clone();
        }
        let mut text = String::new();
        for (_, part) in self.parts.iter().filter(|(t, _)| t == "text") {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(part);
        }
        text
    }

    fn trimmed(mut self) -> Self {
        let ws = |c: char| c.is_ascii_whitespace();
        self.content = self.content.trim_matches(ws).to_string();
        self.reasoning = self.reasoning.trim_matches(ws).to_string();
        for (kind, text) in &mut self.parts {
            if kind == "text" {
                *text = text.trim_matches(ws).to_string();
            }
        }
        self
    }

    fn to_json(&self) -> Json {
        let mut m = Map::new();
        m.insert("role".into(), json!(self.role));
        if !self.content.is_empty() {
            m.insert("content".into(), json!(self.content));
        } else if !self.parts.is_empty() {
            let parts: Vec<Json> = self
                .parts
                .iter()
                .map(|(t, x)| json!({"type": t, "text": x}))
                .collect();
            if self.parts.iter().any(|(t, _)| t == "media_marker") {
                m.insert("content".into(), json!(concat_parts(&Json::Array(parts))));
            } else {
                m.insert("content".into(), Json::Array(parts));
            }
        } else {
            m.insert("content".into(), json!(""));
        }
        if !self.reasoning.is_empty() {
            m.insert("reasoning_content".into(), json!(self.reasoning));
        }
        if !self.name.is_empty() {
            m.insert("name".into(), json!(self.name));
        }
        if !self.tool_call_id.is_empty() {
            m.insert("tool_call_id".into(), json!(self.tool_call_id));
        }
        if !self.tool_calls.is_empty() {
            let calls: Vec<Json> = self
                .tool_calls
                .iter()
                .map(|c| {
                    let mut call = json!({"type": "function", "function": {"name": c.name, "arguments": c.arguments}});
                    if !c.id.is_empty() {
                        call["id"] = json!(c.id);
                    }
                    call
                })
                .collect();
            m.insert("tool_calls".into(), Json::Array(calls));
        }
        Json::Object(m)
    }
}

/// Text parts joined by newlines, none added next to a media marker.
fn concat_parts(parts: &Json) -> String {
    let mut text = String::new();
    let mut after_media = false;
    for part in parts.as_array().into_iter().flatten() {
        let kind = part.get("type").and_then(Json::as_str).unwrap_or_default();
        let newline = match kind {
            "text" => {
                let nl = !after_media && !text.is_empty();
                after_media = false;
                nl
            }
            "media_marker" => {
                after_media = true;
                false
            }
            _ => continue,
        };
        if newline {
            text.push('\n');
        }
        text.push_str(part.get("text").and_then(Json::as_str).unwrap_or_default());
    }
    text
}

fn string_field(obj: &Json, key: &str, what: &Json) -> Result<String, ChatError> {
    match obj.get(key) {
        None => Ok(String::new()),
        Some(Json::String(s)) => Ok(s.clone()),
        Some(other) => Err(ChatError::Messages(format!(
            "'{key}' must be a string, got {other} in {what}"
        ))),
    }
}

fn parse_messages(messages: &Json) -> Result<Vec<Message>, ChatError> {
    let list = messages.as_array().ok_or_else(|| {
        ChatError::Messages(format!(
            "Expected 'messages' to be an array, got {messages}"
        ))
    })?;
    let mut out = Vec::with_capacity(list.len());
    for message in list {
        if !message.is_object() {
            return Err(ChatError::Messages(format!(
                "Expected 'message' to be an object, got {message}"
            )));
        }
        let role = match message.get("role") {
            Some(Json::String(r)) => r.clone(),
            Some(other) => {
                return Err(ChatError::Messages(format!(
                    "'role' must be a string, got {other}"
                )))
            }
            None => {
                return Err(ChatError::Messages(format!(
                    "Missing 'role' in message: {message}"
                )))
            }
        };
        let has_content = message.get("content").is_some();
        let has_calls = message.get("tool_calls").is_some();
        if role != "assistant" && !has_content {
            return Err(ChatError::Messages(
                "All non-assistant messages must contain 'content'".into(),
            ));
        }
        if !has_content && !has_calls {
            return Err(ChatError::Messages(
                "Assistant message must contain either 'content' or 'tool_calls'!".into(),
            ));
        }
        let mut msg = Message {
            role,
            ..Message::default()
        };
        match message.get("content") {
            None | Some(Json::Null) => {}
            Some(Json::String(s)) => msg.content = s.clone(),
            Some(Json::Array(parts)) => {
                for part in parts {
                    let kind = match part.get("type") {
                        Some(Json::String(t)) => t.clone(),
                        _ => {
                            return Err(ChatError::Messages(format!(
                                "Missing content part type: {part}"
                            )))
                        }
                    };
                    if kind != "text" && kind != "media_marker" {
                        return Err(ChatError::Messages(format!(
                            "Unsupported content part type: \"{kind}\""
                        )));
                    }
                    msg.parts.push((kind, string_field(part, "text", part)?));
                }
            }
            Some(other) => {
                return Err(ChatError::Messages(format!(
                    "Invalid 'content' type: expected string or array, got {other}"
                )))
            }
        }
        if let Some(calls) = message.get("tool_calls") {
            for call in calls.as_array().into_iter().flatten() {
                match call.get("type") {
                    Some(Json::String(t)) if t == "function" => {}
                    Some(_) => {
                        return Err(ChatError::Messages(format!(
                            "Unsupported tool call type: {call}"
                        )))
                    }
                    None => {
                        return Err(ChatError::Messages(format!(
                            "Missing tool call type: {call}"
                        )))
                    }
                }
                let function = call.get("function").ok_or_else(|| {
                    ChatError::Messages(format!("Missing tool call function: {call}"))
                })?;
                if function.get("name").is_none() {
                    return Err(ChatError::Messages(format!(
                        "Missing tool call name: {call}"
                    )));
                }
                let arguments = match function.get("arguments") {
                    Some(Json::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => {
                        return Err(ChatError::Messages(format!(
                            "Missing tool call arguments: {call}"
                        )))
                    }
                };
                msg.tool_calls.push(ToolCallIn {
                    id: string_field(call, "id", call)?,
                    name: string_field(function, "name", call)?,
                    arguments,
                });
            }
        }
        msg.reasoning = string_field(message, "reasoning_content", message)?;
        msg.name = string_field(message, "name", message)?;
        msg.tool_call_id = string_field(message, "tool_call_id", message)?;
        out.push(msg);
    }
    Ok(out)
}

/// Tools re-serialised the way upstream passes them to templates: `type`, then `function`
/// with `name`, `description` (empty when absent) and `parameters` (`{}` when absent).
fn parse_tools(tools: Option<&Json>) -> Result<Option<Json>, ChatError> {
    let list = match tools {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Array(list)) => list,
        Some(other) => {
            return Err(ChatError::Tools(format!(
                "Expected 'tools' to be an array, got {other}"
            )))
        }
    };
    if list.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(list.len());
    for tool in list {
        match tool.get("type") {
            Some(Json::String(t)) if t == "function" => {}
            Some(_) => return Err(ChatError::Tools(format!("Unsupported tool type: {tool}"))),
            None => return Err(ChatError::Tools(format!("Missing tool type: {tool}"))),
        }
        let function = tool
            .get("function")
            .ok_or_else(|| ChatError::Tools(format!("Missing tool function: {tool}")))?;
        let name = match function.get("name") {
            Some(Json::String(n)) => n.clone(),
            _ => {
                return Err(ChatError::Tools(format!(
                    "Missing or invalid tool name: {tool}"
                )))
            }
        };
        let description = match function.get("description") {
            Some(Json::String(d)) => d.clone(),
            _ => String::new(),
        };
        let parameters = function
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({}));
        out.push(json!({
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }));
    }
    Ok(Some(Json::Array(out)))
}

/// Ministral 3 templates read reasoning and text as typed content blocks.
fn ministral_blocks(m: &mut Json) {
    let role = m["role"].as_str().unwrap_or_default();
    if role != "system" && role != "assistant" {
        return;
    }
    let mut blocks = Vec::new();
    if let Some(reasoning) = m.get("reasoning_content").and_then(Json::as_str) {
        blocks.push(json!({"type": "thinking", "thinking": reasoning}));
    }
    match m.get("content") {
        Some(Json::String(text)) => blocks.push(json!({"type": "text", "text": text})),
        Some(Json::Array(parts)) => blocks.extend(parts.iter().cloned()),
        _ => {}
    }
    if let Some(obj) = m.as_object_mut() {
        obj.insert("content".into(), Json::Array(blocks));
        obj.shift_remove("reasoning_content");
    }
}

/// DeepSeek V4 renders a run of tool results in the order of the calls that asked for them.
fn sort_deepseek_tool_results(messages: &mut [Json]) {
    let mut order: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while i < messages.len() {
        let role = messages[i]["role"].as_str().unwrap_or_default().to_string();
        if role == "assistant" {
            if let Some(calls) = messages[i]
                .get("tool_calls")
                .and_then(Json::as_array)
                .filter(|c| !c.is_empty())
            {
                order = calls
                    .iter()
                    .enumerate()
                    .filter_map(|(k, c)| {
                        c.get("id")
                            .and_then(Json::as_str)
                            .filter(|id| !id.is_empty())
                            .map(|id| (id.to_string(), k))
                    })
                    .collect();
            }
            i += 1;
            continue;
        }
        if role != "user" && role != "tool" {
            i += 1;
            continue;
        }
        let mut end = i;
        let mut tool_positions = Vec::new();
        while end < messages.len() {
            match messages[end]["role"].as_str() {
                Some("tool") => tool_positions.push(end),
                Some("user") => {}
                _ => break,
            }
            end += 1;
        }
        if tool_positions.len() > 1 && !order.is_empty() {
            let rank = |m: &Json| {
                let id = m
                    .get("tool_call_id")
                    .and_then(Json::as_str)
                    .unwrap_or_default();
                order
                    .iter()
                    .find(|(x, _)| x == id)
                    .map(|(_, k)| *k)
                    .unwrap_or(0)
            };
            let mut results: Vec<Json> = tool_positions
                .iter()
                .map(|&p| messages[p].clone())
                .collect();
            results.sort_by_key(rank);
            for (p, r) in tool_positions.iter().zip(results) {
                messages[*p] = r;
            }
        }
        i = end;
    }
}

/// Upstream's rendering without Jinja: tools are refused, a trailing assistant message is
/// closed like the others (the built-in formats cannot continue one), and the format sees only
/// roles and text.
fn render_builtin(
    format: Option<legacy::Format>,
    inputs: &RenderInputs,
) -> Result<String, ChatError> {
    if inputs
        .tools
        .and_then(Json::as_array)
        .is_some_and(|t| !t.is_empty())
    {
        return Err(ChatError::Refused(
            "tools param requires --jinja flag".into(),
        ));
    }
    let messages = parse_messages(inputs.messages)?;
    let mut add_generation_prompt = inputs.add_generation_prompt;
    if let Some(last) = messages.last().filter(|m| m.role == "assistant") {
        if messages.len() >= 2 && messages[messages.len() - 2].role == "assistant" {
            return Err(ChatError::Refused(
                "Cannot have 2 or more assistant messages at the end of the list.".into(),
            ));
        }
        if !last.tool_calls.is_empty() {
            return Err(ChatError::Refused(
                "Cannot continue an assistant message that contains tool calls.".into(),
            ));
        }
        add_generation_prompt = false;
    }
    let format = format.ok_or_else(|| ChatError::Refused(legacy::UNSUPPORTED.into()))?;
    let contents: Vec<String> = messages.iter().map(Message::builtin_content).collect();
    let turns: Vec<(&str, &str)> = messages
        .iter()
        .zip(&contents)
        .map(|(m, text)| (m.role.as_str(), text.as_str()))
        .collect();
    Ok(format.render(&turns, add_generation_prompt))
}

/// What a rendering with the generation prompt adds to the same rendering without it: the text
/// after their common prefix (upstream's generation prompt), cut at a character boundary.
pub fn generation_prompt<'a>(without: &str, with: &'a str) -> &'a str {
    let common = without
        .bytes()
        .zip(with.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let mut at = common;
    while !with.is_char_boundary(at) {
        at -= 1;
    }
    &with[at..]
}

/// The templates a model serves with: its default and, when the model ships one, a separate
/// template for requests with tools.
#[derive(Debug)]
pub struct ChatTemplates {
    pub default: ChatTemplate,
    pub tool_use: Option<ChatTemplate>,
    /// False when neither the model nor the command line gave a template (ChatML fallback).
    pub explicit: bool,
    /// Jinja, or under `--no-jinja` the built-in format in use.
    pub renderer: Renderer,
}

/// How requests become prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renderer {
    /// The Jinja template (`--jinja`, the default).
    Jinja,
    /// `--no-jinja`: the built-in format upstream recognises in the default template's text
    /// (a name such as `gemma`, or a family's markers in Jinja source); `None` where it
    /// recognises none, and every request is then refused.
    Builtin(Option<legacy::Format>),
}

/// Where the template text comes from, in upstream's order of precedence.
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateChoice<'a> {
    /// `--chat-template NAME|TEMPLATE` or the contents of `--chat-template-file`.
    pub override_source: Option<&'a str>,
    /// GGUF `tokenizer.chat_template`.
    pub model_default: Option<&'a str>,
    /// GGUF `tokenizer.chat_template.tool_use`.
    pub model_tool_use: Option<&'a str>,
}

impl ChatTemplates {
    /// Picks and parses the templates as upstream does: an override wins; otherwise the
    /// model's own; a missing default (or the name `chatml`) falls back to the tool-use
    /// template or ChatML. As upstream with `--jinja`, an override is always Jinja source.
    pub fn load(choice: TemplateChoice, tokens: SpecialTokens) -> Result<Self, ChatError> {
        let (mut default_src, tool_use_src, explicit) =
            match choice.override_source.filter(|s| !s.is_empty()) {
                Some(src) => (src.to_string(), None, true),
                None => (
                    choice.model_default.unwrap_or_default().to_string(),
                    choice.model_tool_use.map(str::to_string),
                    choice.model_default.is_some() || choice.model_tool_use.is_some(),
                ),
            };
        if default_src.is_empty() || default_src == "chatml" {
            default_src = tool_use_src
                .clone()
                .unwrap_or_else(|| CHATML_SOURCE.to_string());
        }
        let default = ChatTemplate::from_source(&default_src, tokens.clone())?;
        let tool_use = match tool_use_src {
            Some(src) => ChatTemplate::from_source(&src, tokens).ok(),
            None => None,
        };
        Ok(ChatTemplates {
            default,
            tool_use,
            explicit,
            renderer: Renderer::Jinja,
        })
    }

    /// Renders with upstream's built-in formats instead of Jinja (`--no-jinja`), the format
    /// picked from the default template's text (after the ChatML fallback).
    pub fn without_jinja(self) -> Self {
        let format = legacy::Format::detect(self.default.source());
        ChatTemplates {
            renderer: Renderer::Builtin(format),
            ..self
        }
    }

    /// Loads from a GGUF key lookup (`tokenizer.chat_template`, `tokenizer.chat_template.NAME`).
    pub fn from_metadata<'a>(
        lookup: impl Fn(&str) -> Option<&'a str>,
        override_source: Option<&'a str>,
        tokens: SpecialTokens,
    ) -> Result<Self, ChatError> {
        let choice = TemplateChoice {
            override_source,
            model_default: lookup("tokenizer.chat_template"),
            model_tool_use: lookup("tokenizer.chat_template.tool_use"),
        };
        Self::load(choice, tokens)
    }

    /// The template a request uses: the tool-use one when tools are given and it exists.
    pub fn pick(&self, tools: Option<&Json>) -> &ChatTemplate {
        let has_tools = tools
            .and_then(Json::as_array)
            .is_some_and(|t| !t.is_empty());
        match (&self.tool_use, has_tools) {
            (Some(t), true) => t,
            _ => &self.default,
        }
    }

    /// Renders a request with the template it picks, or its built-in format without Jinja.
    pub fn render(&self, inputs: &RenderInputs) -> Result<String, ChatError> {
        match self.renderer {
            Renderer::Jinja => self.pick(inputs.tools).render(inputs),
            Renderer::Builtin(format) => render_builtin(format, inputs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generation_prompt_is_what_follows_the_common_prefix() {
        assert_eq!(generation_prompt("<u>hi", "<u>hi<a>\n"), "<a>\n");
        // "é" and "è" share their first byte: the cut keeps the whole character
        assert_eq!(generation_prompt("x é", "x è!"), "è!");
        assert_eq!(generation_prompt("same", "same"), "");
    }

    #[test]
    fn a_continued_message_s_text_parts_are_joined_by_a_blank_line() {
        // upstream's test_chat_template_assistant_prefill: parts "Wh" and "ill" continue as
        // "Wh\n\nill"; an empty first part adds no separator
        let source =
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}\
                      {% if add_generation_prompt %}<assistant>{% endif %}";
        let t = ChatTemplate::from_source(source, SpecialTokens::default()).expect("parses");
        let prompt = |parts: Json| {
            let messages = json!([
                {"role": "user", "content": "What is the best book"},
                {"role": "assistant", "content": parts},
            ]);
            let kwargs = Map::new();
            t.render(&RenderInputs {
                messages: &messages,
                tools: None,
                add_generation_prompt: true,
                kwargs: &kwargs,
                enable_thinking: true,
                now: Some(0),
            })
            .expect("renders")
        };
        let two = json!([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]);
        assert!(prompt(two).ends_with("<assistant>Wh\n\nill"));
        let empty_first = json!([{"type": "text", "text": ""}, {"type": "text", "text": "ill"}]);
        assert!(prompt(empty_first).ends_with("<assistant>ill"));
        assert!(prompt(json!("Whill")).ends_with("<assistant>Whill"));
    }
}
