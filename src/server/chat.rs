//! The one place chat requests become prompt text. The chat-template module plugs in through
//! [`ChatRenderer`]; until a model's template is wired, [`PlainChat`] lays messages out plainly.

use serde_json::Value;

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
                    Some(other) => return Err(format!("unsupported content[].type: {other}")),
                    None => return Err("Missing content part type".into()),
                }
            }
            Ok(out)
        }
        _ => Err("Invalid 'content' type".into()),
    }
}
