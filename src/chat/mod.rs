//! Chat: templates rendered as upstream renders them (minijinja plus upstream's Python-like
//! methods and value printing), and the parsing of model output back into `content`,
//! `reasoning_content` and `tool_calls`.
//!
//! Owns: template selection from GGUF metadata / flags, message normalisation, rendering,
//! reasoning and tool-call extraction (whole-message and streamed). Must not: read model files
//! (callers pass metadata strings), tokenize, or know about HTTP.

mod caps;
mod clock;
mod jinja;
pub mod legacy;
pub mod markers;
mod output;
mod plus;
mod template;

pub use caps::Caps;
pub use output::{
    Delta, OutputFormat, ParsedMessage, ReasoningFormat, StreamParser, ToolCall, ToolSyntax,
};
pub use template::{
    generation_prompt, ChatTemplate, ChatTemplates, RenderInputs, Renderer, SpecialTokens,
    TemplateChoice, CHATML_SOURCE,
};

/// The `chat_template_kwargs` upstream's server passes when neither the command line nor the
/// request sets them: reasoning of earlier turns is kept (`--reasoning-preserve` is the default).
pub fn server_default_kwargs() -> serde_json::Map<String, serde_json::Value> {
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("preserve_reasoning".into(), serde_json::Value::Bool(true));
    kwargs
}

/// Why a chat request could not be turned into a prompt (or output into a message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatError {
    /// The `messages` array is malformed; names the offending message.
    Messages(String),
    /// The `tools` array is malformed; names the offending tool.
    Tools(String),
    /// The template does not parse, or raised an error while rendering.
    Template(String),
    /// A request the renderer cannot carry, in upstream's words (e.g. tools without Jinja).
    Refused(String),
}

impl std::fmt::Display for ChatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChatError::Messages(m) => write!(f, "Failed to parse messages: {m}"),
            ChatError::Tools(m) => write!(f, "Failed to parse tools: {m}"),
            ChatError::Template(m) => write!(f, "chat template: {m}"),
            ChatError::Refused(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for ChatError {}
