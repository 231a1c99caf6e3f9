//! Model output back into an OpenAI message: reasoning split from content by the family's
//! thinking tags, and tool calls recognised in the family's syntax, both for a whole message
//! and incrementally while it streams (deltas of `reasoning_content`, `content` and tool-call
//! arguments). Text that may still become a tag is held back while streaming, and a tool call
//! that is cut short or malformed is dropped rather than leaked into `content`.

use serde_json::Value as Json;

use super::template::{specialised_family, ChatTemplate, Family};
use super::ChatError;

/// `--reasoning-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// Thinking stays in `content`, tags included.
    None,
    /// Thinking goes to `reasoning_content`.
    #[default]
    Deepseek,
    /// Accepted as upstream accepts it; upstream b11434's server splits it as `deepseek`
    /// (recorded in `tests/data/reasoning-split.json`).
    DeepseekLegacy,
    /// Like `deepseek`.
    Auto,
}

impl ReasoningFormat {
    /// Parses a `--reasoning-format` / request `reasoning_format` value.
    pub fn from_name(name: &str) -> Result<Self, ChatError> {
        Ok(match name {
            "none" => ReasoningFormat::None,
            "deepseek" => ReasoningFormat::Deepseek,
            "deepseek-legacy" => ReasoningFormat::DeepseekLegacy,
            "auto" => ReasoningFormat::Auto,
            other => {
                return Err(ChatError::Messages(format!(
                    "Unknown reasoning format: {other}"
                )))
            }
        })
    }

    fn extracts(self) -> bool {
        self != ReasoningFormat::None
    }
}

/// One parsed tool call. `arguments` is the JSON text the model wrote (for XML-style families,
/// the JSON object built from its parameters).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// An assistant message as parsed from model output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedMessage {
    pub content: String,
    pub reasoning_content: String,
    pub tool_calls: Vec<ToolCall>,
}

/// How a family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// No tool calls are recognised.
    None,
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5/3, Granite 4).
    Hermes,
    /// `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
    Qwen3Coder,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]` (Mistral Nemo).
    MistralJson,
    /// `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}` (Mistral Small 3.2, Devstral, Ministral 3).
    MistralArgs,
    /// `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>` (Llama 3.x).
    Llama3Json,
    /// Harmony channels: `<|channel|>commentary to=functions.NAME<|message|>{...}` (gpt-oss).
    Harmony,
    /// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`.
    DeepSeekR1,
    /// `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (DeepSeek V3.1).
    DeepSeekV31,
    /// `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>`
    /// (Kimi K2; the `functions.NAME:IDX` is the call's id).
    KimiK2,
    /// `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>` (GLM 4.x).
    Glm,
    /// `<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n</invoke>\n</minimax:tool_call>`
    /// (MiniMax M2).
    MiniMaxM2,
    /// `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}]<|END_ACTION|>`,
    /// content wrapped in `<|START_RESPONSE|>` (Command R7B) or `<|START_TEXT|>` (Cohere2 MoE);
    /// the `tool_call_id` is the call's id.
    CommandR7B,
    /// `<function=NAME>{...}</function>` (Functionary v3.1).
    FunctionaryV31,
    /// `>>>RECIPIENT\n...` after a prompt ending in `>>>`: `all` is content, any other recipient
    /// a tool call with JSON arguments (Functionary v3.2).
    FunctionaryV32,
    /// `<TOOLCALL>[{"name": ..., "arguments": {...}}]</TOOLCALL>` (Nemotron Nano v2).
    Nemotron,
    /// `<tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls>` (Apriel 1.5 / 1.6).
    Apriel,
    /// ` functools[{"name": ..., "arguments": {...}}]` (FireFunction v2).
    FireFunction,
    /// `<|tools_prefix|>[{"NAME": {...}}]<|tools_suffix|>` (Apertus).
    Apertus,
    /// `<seed:tool_call>\n<function=NAME>\n<parameter=K>V</parameter>\n</function>\n</seed:tool_call>`
    /// (Seed-OSS; values kept as written).
    SeedOss,
    /// `<|tool_call_start|>[NAME(K=V, ...)]<|tool_call_end|>` with Python literals (LFM2, LFM2.5).
    Lfm2,
    /// `Action:\n```json\n[{"tool_name": ..., "parameters": {...}}]\n```` (Command R+).
    CommandRPlus,
    /// `]<]minimax[>[<tool_call>` blocks of `]<]minimax[>[<invoke name="NAME">` calls whose
    /// parameters are elements named after them, nested objects and `<item>` lists expanded
    /// (MiniMax M3; thinking in `<mm:think>`).
    MiniMaxM3,
    /// `<｜DSML｜function_calls>` blocks of `<｜DSML｜invoke name="NAME">` calls with
    /// `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>` (DeepSeek V3.2).
    Dsml,
    /// As `Dsml`, the block named `<｜DSML｜tool_calls>` (DeepSeek V4).
    DsmlV4,
    /// Messages `<|start|>assistant to=RECIPIENT<|message|>...<|eom|>`: `self` is reasoning,
    /// `user` content, any other recipient an `<atem:function_calls>` tool call (muse-glimmer).
    MuseGlimmer,
    /// `<|open|>TAG<|sep|>` ... `<|close|>TAG<|sep|>` sections: `think`, `response`, and `tools`
    /// of `call tool="NAME"` with `argument key="K" type="T"` (Kimi K3).
    KimiK3,
    /// `<|channel>thought\n...<channel|>` reasoning, `<|tool_call>call:NAME{key:VALUE}<tool_call|>`
    /// calls with `<|"|>`-quoted strings (Gemma 4).
    Gemma4,
    /// `<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": ..., "arguments": {...}}`, one call,
    /// no reasoning (GigaChat 3).
    GigaChat3,
    /// `<|function_call|>{"name": ..., "arguments": {...}}`, one call (GigaChat 3.1).
    GigaChat31,
    /// `<function name="NAME"><param name="K">V</param></function>`, string values possibly in
    /// `<![CDATA[...]]>` (MiniCPM 5).
    MiniCpm5,
    /// Harmony-like messages `<|channel|> CHANNEL<|message|> TEXT<|end|>` after
    /// `<|start|> assistant`, the recipient ` to=functions.NAME` in the role or channel header
    /// (LLM-jp 4.1).
    LlmJpHarmony,
    /// GLM-style calls, with text after the last call kept as content and `<|role_end|>` dropped
    /// (Ling 3).
    Ling3,
}

/// What to look for in one family's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFormat {
    pub think_start: String,
    pub think_end: String,
    /// When the prompt already opened the thinking block (so output starts inside it), what
    /// the prompt ends with from its opening tag on (`<think>\n`): the parser reads the output
    /// after it, as upstream does. Empty otherwise.
    pub opened: String,
    /// The whitespace the template writes after the opening tag and after the closing one (Qwen3:
    /// `\n` and `\n\n`); the parser takes it as part of the tags, one character at a time.
    pub start_ws: String,
    pub end_ws: String,
    pub tools: ToolSyntax,
}

const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const KIMI_SECTION: &str = "<|tool_calls_section_begin|>";
const KIMI_CALL: &str = "<|tool_call_begin|>";
const KIMI_ARGS: &str = "<|tool_call_argument_begin|>";
const KIMI_CALL_END: &str = "<|tool_call_end|>";
const MINIMAX_OPEN: &str = "<minimax:tool_call>";
const MINIMAX_CLOSE: &str = "</minimax:tool_call>";
const ACTION_START: &str = "<|START_ACTION|>";
const ACTION_END: &str = "<|END_ACTION|>";
/// Command R7B's and Cohere2 MoE's content wrappers: (start, end).
const COHERE_CONTENT: [(&str, &str); 2] = [
    ("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    ("<|START_TEXT|>", "<|END_TEXT|>"),
];
const K3_THINK_START: &str = "<|open|>think<|sep|>";
const K3_THINK_END: &str = "<|close|>think<|sep|>";
const K3_RESP_START: &str = "<|open|>response<|sep|>";
const K3_RESP_END: &str = "<|close|>response<|sep|>";
const K3_TOOLS_START: &str = "<|open|>tools<|sep|>";
const K3_TOOLS_END: &str = "<|close|>tools<|sep|>";
const K3_MSG_START: &str = "<|open|>message role=\"assistant\"<|sep|>";
const K3_MSG_END: &str = "<|close|>message<|sep|>";
/// Apriel 1.6: the prompt opens the thinking with this phrase (which upstream keeps as part of
/// the reasoning) and the model ends it with the marker.
const APRIEL16_START: &str = "Here are my reasoning steps:";
const APRIEL16_END: &str = "[BEGIN FINAL RESPONSE]";
const GIGACHAT3_CALL: &str = "<|message_sep|>\n\nfunction call<|role_sep|>\n";
const GIGACHAT31_CALL: &str = "<|function_call|>";
const MM_NS: &str = "]<]minimax[>[";
const MM_BLOCK_OPEN: &str = "]<]minimax[>[<tool_call>";
const MM_BLOCK_CLOSE: &str = "]<]minimax[>[</tool_call>";
const MM_INVOKE_OPEN: &str = "]<]minimax[>[<invoke name=\"";
const MM_INVOKE_CLOSE: &str = "]<]minimax[>[</invoke>";
const DSML_BLOCK: [(&str, &str); 2] = [
    ("<｜DSML｜function_calls>", "</｜DSML｜function_calls>"),
    ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"),
];
const DSML_INVOKE_OPEN: &str = "<｜DSML｜invoke name=\"";
const DSML_INVOKE_CLOSE: &str = "</｜DSML｜invoke>";
const DSML_PARAM_OPEN: &str = "<｜DSML｜parameter name=\"";
const DSML_PARAM_CLOSE: &str = "</｜DSML｜parameter>";
const LFM2_OPEN: &str = "<|tool_call_start|>";
const LFM2_CLOSE: &str = "<|tool_call_end|>";

impl OutputFormat {
    /// The format of a template's family; `prompt` is the rendered prompt the output follows
    /// (it tells whether thinking was opened by the template).
    pub fn for_template(template: &ChatTemplate, prompt: &str) -> Self {
        let mut format = Self::from_source(template.source(), prompt);
        if let Some((start, end)) = template.reasoning_wrapping() {
            let after = |wrapped: &str, tag: &str| {
                wrapped
                    .find(tag)
                    .map(|at| wrapped[at + tag.len()..].to_string())
                    .filter(|ws| ws.chars().all(is_ws))
                    .unwrap_or_default()
            };
            format.start_ws = after(start, &format.think_start);
            format.end_ws = after(end, &format.think_end);
        }
        format
    }

    fn from_source(src: &str, prompt: &str) -> Self {
        let family = specialised_family(src);
        let (think_start, think_end) =
            if family == Some(Family::Ministral3) || src.contains("[THINK]") {
                ("[THINK]", "[/THINK]")
            } else if family == Some(Family::MiniMaxM3) {
                ("<mm:think>", "</mm:think>")
            } else if family == Some(Family::KimiK3) {
                (K3_THINK_START, K3_THINK_END)
            } else if family == Some(Family::Gemma4) {
                ("<|channel>thought", "<channel|>")
            } else if src.contains(APRIEL16_END) {
                (APRIEL16_START, APRIEL16_END)
            } else if src.contains("<|START_THINKING|>") {
                ("<|START_THINKING|>", "<|END_THINKING|>")
            } else if src.contains("<seed:think>") {
                ("<seed:think>", "</seed:think>")
            } else {
                ("<think>", "</think>")
            };
        let tools = if family == Some(Family::GptOss) {
            ToolSyntax::Harmony
        } else if family == Some(Family::MuseGlimmer) {
            ToolSyntax::MuseGlimmer
        } else if family == Some(Family::KimiK3) {
            ToolSyntax::KimiK3
        } else if family == Some(Family::MiniMaxM3) {
            ToolSyntax::MiniMaxM3
        } else if family == Some(Family::DeepSeekDsml) {
            // upstream: V4's template never names `function_calls`
            if src.contains("function_calls") {
                ToolSyntax::Dsml
            } else {
                ToolSyntax::DsmlV4
            }
        } else if family == Some(Family::Gemma4) {
            ToolSyntax::Gemma4
        } else if family == Some(Family::Ling3) {
            ToolSyntax::Ling3
        } else if family == Some(Family::LlmJpHarmony) {
            ToolSyntax::LlmJpHarmony
        } else if family == Some(Family::GigaChatV3) {
            ToolSyntax::GigaChat3
        } else if family == Some(Family::MiniCpm5) {
            ToolSyntax::MiniCpm5
        } else if src.contains(GIGACHAT31_CALL) && src.contains("<|role_sep|>") {
            // upstream generates a parser for GigaChat 3.1's template
            ToolSyntax::GigaChat31
        } else if family == Some(Family::FunctionaryV32) {
            ToolSyntax::FunctionaryV32
        } else if family == Some(Family::KimiK2) {
            ToolSyntax::KimiK2
        } else if matches!(family, Some(Family::Lfm2 | Family::Lfm25)) {
            ToolSyntax::Lfm2
        } else if src.contains(ACTION_START) {
            ToolSyntax::CommandR7B
        } else if src.contains("Action:\\n```json") {
            ToolSyntax::CommandRPlus
        } else if src.contains(MINIMAX_OPEN) {
            ToolSyntax::MiniMaxM2
        } else if src.contains("<seed:tool_call>") {
            ToolSyntax::SeedOss
        } else if src.contains("<arg_key>") {
            ToolSyntax::Glm
        } else if matches!(family, Some(Family::Ministral3)) || src.contains("[ARGS]") {
            ToolSyntax::MistralArgs
        } else if src.contains("[TOOL_CALLS]") {
            ToolSyntax::MistralJson
        } else if family == Some(Family::Qwen3Coder) {
            ToolSyntax::Qwen3Coder
        } else if src.contains(DS_SEP) && src.contains("```json") {
            ToolSyntax::DeepSeekR1
        } else if src.contains(DS_SEP) {
            ToolSyntax::DeepSeekV31
        } else if src.contains("<function=")
            && src.contains("</function>")
            && !src.contains("<parameter=")
        {
            ToolSyntax::FunctionaryV31
        } else if src.contains("<TOOLCALL>") {
            ToolSyntax::Nemotron
        } else if src.contains("<tool_calls>[") {
            ToolSyntax::Apriel
        } else if src.contains("functools[") {
            ToolSyntax::FireFunction
        } else if src.contains("<|tools_prefix|>") {
            ToolSyntax::Apertus
        } else if src.contains("<tool_call>") {
            ToolSyntax::Hermes
        } else if src.contains("<|python_tag|>") || src.contains("\"parameters\": ") {
            ToolSyntax::Llama3Json
        } else {
            ToolSyntax::None
        };
        let forced_open = !matches!(
            tools,
            ToolSyntax::Harmony | ToolSyntax::MuseGlimmer | ToolSyntax::LlmJpHarmony
        ) && prompt.trim_end().ends_with(think_start);
        let opened = match prompt.rfind(think_start) {
            Some(at) if forced_open => prompt[at..].to_string(),
            // Kimi K3's prompt opens the response section when thinking is off; upstream parses
            // the output after it
            _ if tools == ToolSyntax::KimiK3 && prompt.ends_with(K3_RESP_START) => {
                K3_RESP_START.to_string()
            }
            _ => String::new(),
        };
        // Apriel 1.6 writes the marker on a line of its own
        let end_ws = if think_end == APRIEL16_END { "\n" } else { "" };
        OutputFormat {
            think_start: think_start.to_string(),
            think_end: think_end.to_string(),
            opened,
            start_ws: String::new(),
            end_ws: end_ws.to_string(),
            tools,
        }
    }

    /// Whether the prompt already opened the thinking block, so output starts inside it.
    pub fn thinking_forced_open(&self) -> bool {
        !self.opened.is_empty()
    }

    /// Parses the whole output (`partial`: more is coming, so hold back what may still
    /// become a tag and keep an unfinished tool call with the arguments seen so far).
    pub fn parse(
        &self,
        text: &str,
        reasoning: ReasoningFormat,
        parse_tools: bool,
        partial: bool,
    ) -> ParsedMessage {
        if self.tools == ToolSyntax::Harmony {
            return parse_harmony(text, reasoning, parse_tools, partial);
        }
        if self.tools == ToolSyntax::FunctionaryV32 {
            return parse_functionary_v32(text, parse_tools, partial);
        }
        if self.tools == ToolSyntax::LlmJpHarmony {
            return parse_llm_jp_harmony(text, reasoning, parse_tools, partial);
        }
        if self.tools == ToolSyntax::MuseGlimmer {
            return parse_muse_glimmer(text, reasoning, parse_tools, partial);
        }
        if self.tools == ToolSyntax::KimiK3 {
            return parse_kimi_k3(
                &format!("{}{text}", self.opened),
                reasoning,
                parse_tools,
                partial,
            );
        }
        if self.tools == ToolSyntax::Gemma4 {
            return parse_gemma4(text, reasoning, parse_tools, partial);
        }
        let mut msg = ParsedMessage::default();
        if matches!(self.tools, ToolSyntax::GigaChat3 | ToolSyntax::GigaChat31) {
            // no thinking: all of it is content and calls
            return self.parse_after_reasoning(text, msg, parse_tools, partial);
        }
        // thinking the prompt opened is read from its opening tag on; otherwise whitespace before
        // an opening tag is skipped (and held back while it may still precede one)
        let joined;
        let text = if self.thinking_forced_open() {
            joined = format!("{}{text}", self.opened);
            joined.as_str()
        } else {
            let trimmed = text.trim_start_matches(is_ws);
            if partial && trimmed.is_empty() {
                return msg;
            }
            let tag = self.think_start.as_str();
            if self.tools == ToolSyntax::MiniMaxM3 && reasoning.extracts() {
                // a turn without reasoning starts with a bare closing tag
                let end = self.think_end.as_str();
                if let Some(after) = trimmed.strip_prefix(end) {
                    return self.parse_after_reasoning(after, msg, parse_tools, partial);
                }
                if partial && end.starts_with(trimmed) {
                    return msg;
                }
            }
            if trimmed.starts_with(tag) || (partial && tag.starts_with(trimmed)) {
                trimmed
            } else {
                text
            }
        };
        let (thinking, rest) = self.split_reasoning(text, parse_tools, partial);
        if let Some(thinking) = thinking {
            if reasoning.extracts() {
                // upstream's parsers drop reasoning that is only whitespace
                if self.think_end == APRIEL16_END {
                    // upstream's generated parser keeps the opening phrase, not the newline
                    // before the marker
                    let end = thinking.as_ptr() as usize - text.as_ptr() as usize + thinking.len();
                    let closed = text[end..].starts_with(APRIEL16_END);
                    let thinking = if closed || partial {
                        thinking.strip_suffix('\n').unwrap_or(thinking)
                    } else {
                        thinking
                    };
                    msg.reasoning_content = format!("{}{thinking}", self.think_start);
                } else if !thinking.chars().all(is_ws) {
                    msg.reasoning_content = thinking.to_string();
                }
            } else if self.tools == ToolSyntax::Ling3 {
                // upstream keeps the thinking as content, without its tags
                msg.content.push_str(thinking);
            } else {
                // the tags as written; while the block is open, only what the thinking shows
                let thinking_end =
                    thinking.as_ptr() as usize - text.as_ptr() as usize + thinking.len();
                let closed = text[thinking_end..].starts_with(self.think_end.as_str());
                let shown_end = if rest.is_empty() && !closed {
                    thinking_end
                } else {
                    text.len() - rest.len()
                };
                msg.content.push_str(&text[..shown_end]);
            }
        }
        self.parse_after_reasoning(rest, msg, parse_tools, partial)
    }

    /// Content and tool calls after the thinking block.
    fn parse_after_reasoning(
        &self,
        rest: &str,
        mut msg: ParsedMessage,
        parse_tools: bool,
        partial: bool,
    ) -> ParsedMessage {
        if self.tools == ToolSyntax::CommandR7B {
            if let Some(content) = cohere_content(rest, partial) {
                msg.content.push_str(content);
                return msg;
            }
        }
        if self.tools == ToolSyntax::Ling3 {
            return parse_ling3_rest(rest, msg, parse_tools, partial);
        }
        if parse_tools && self.tools != ToolSyntax::None {
            let (content, calls) = parse_tool_calls(self.tools, rest, partial);
            msg.content.push_str(content);
            msg.tool_calls = calls;
        } else {
            msg.content.push_str(hold_back(rest, partial, &[]));
        }
        msg
    }

    /// Splits off the thinking block at the start of `text`: (thinking, rest). The whitespace
    /// the template writes after each tag goes with the tag; the thinking keeps the rest.
    fn split_reasoning<'a>(
        &self,
        text: &'a str,
        parse_tools: bool,
        partial: bool,
    ) -> (Option<&'a str>, &'a str) {
        let openers = if parse_tools {
            openers(self.tools)
        } else {
            &[]
        };
        let body = if let Some(after) = text.strip_prefix(self.think_start.as_str()) {
            skip_chars(after, &self.start_ws)
        } else if partial && !text.is_empty() && self.think_start.starts_with(text) {
            return (None, "");
        } else {
            return (None, text);
        };
        match body.find(self.think_end.as_str()) {
            Some(end) => (
                Some(&body[..end]),
                skip_chars(&body[end + self.think_end.len()..], &self.end_ws),
            ),
            // thinking the model never closed ends where a tool call starts (when the request
            // has tools)
            None if let Some(call) = openers.iter().filter_map(|m| body.find(m)).min() => {
                let thinking = &body[..call];
                // DSML: the blank line before the call block is not part of the thinking
                let thinking = match self.tools {
                    ToolSyntax::Dsml | ToolSyntax::DsmlV4 => {
                        thinking.strip_suffix("\n\n").unwrap_or(thinking)
                    }
                    _ => thinking,
                };
                (Some(thinking), &body[call..])
            }
            None => {
                let shown = if partial {
                    let mut markers = vec![self.think_end.as_str()];
                    markers.extend(openers);
                    let shown = hold_back(body, true, &markers);
                    if matches!(self.tools, ToolSyntax::Dsml | ToolSyntax::DsmlV4) && parse_tools {
                        // a blank line may still turn out to precede a call block
                        let once = shown.strip_suffix('\n').unwrap_or(shown);
                        once.strip_suffix('\n').unwrap_or(once)
                    } else {
                        shown
                    }
                } else {
                    body
                };
                (Some(shown), "")
            }
        }
    }
}

/// `text` after as many of `chars`' characters, in order, as it starts with.
fn skip_chars<'a>(mut text: &'a str, chars: &str) -> &'a str {
    for c in chars.chars() {
        match text.strip_prefix(c) {
            Some(rest) => text = rest,
            None => break,
        }
    }
    text
}

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\n' | '\r' | '\t')
}

/// While streaming, the end of `text` that could be the start of `markers` is not shown yet.
fn hold_back<'a>(text: &'a str, partial: bool, markers: &[&str]) -> &'a str {
    if !partial {
        return text;
    }
    let mut cut = text.len();
    for marker in markers {
        for (start, _) in text.char_indices().rev().take(marker.len()) {
            let tail = &text[start..];
            if marker.starts_with(tail) && start < cut {
                cut = start;
            }
        }
    }
    &text[..cut]
}

fn openers(syntax: ToolSyntax) -> &'static [&'static str] {
    match syntax {
        ToolSyntax::Hermes | ToolSyntax::Qwen3Coder => &["<tool_call>"],
        ToolSyntax::MistralJson | ToolSyntax::MistralArgs => &["[TOOL_CALLS]"],
        ToolSyntax::Llama3Json => &["<|python_tag|>"],
        ToolSyntax::KimiK2 => &[KIMI_SECTION, KIMI_CALL],
        ToolSyntax::Glm | ToolSyntax::Ling3 => &["<tool_call>"],
        ToolSyntax::DeepSeekR1 | ToolSyntax::DeepSeekV31 => &[DS_CALLS_BEGIN, DS_CALL_BEGIN],
        ToolSyntax::MiniMaxM2 => &[MINIMAX_OPEN],
        ToolSyntax::CommandR7B => &[ACTION_START],
        ToolSyntax::FunctionaryV31 => &["<function="],
        ToolSyntax::Nemotron => &["<TOOLCALL>"],
        ToolSyntax::Apriel => &["<tool_calls>"],
        ToolSyntax::FireFunction => &["functools["],
        ToolSyntax::Apertus => &["<|tools_prefix|>"],
        ToolSyntax::SeedOss => &["<seed:tool_call>"],
        ToolSyntax::Lfm2 => &[LFM2_OPEN],
        ToolSyntax::CommandRPlus => &["Action:"],
        ToolSyntax::MiniMaxM3 => &[MM_BLOCK_OPEN],
        ToolSyntax::GigaChat3 => &[GIGACHAT3_CALL],
        ToolSyntax::GigaChat31 => &[GIGACHAT31_CALL],
        ToolSyntax::MiniCpm5 => &["<function"],
        ToolSyntax::Dsml => &[DSML_BLOCK[0].0],
        ToolSyntax::DsmlV4 => &[DSML_BLOCK[1].0],
        ToolSyntax::None
        | ToolSyntax::Harmony
        | ToolSyntax::FunctionaryV32
        | ToolSyntax::MuseGlimmer
        | ToolSyntax::KimiK3
        | ToolSyntax::Gemma4
        | ToolSyntax::LlmJpHarmony => &[],
    }
}

/// Content before the first tool call, and the calls.
fn parse_tool_calls(syntax: ToolSyntax, text: &str, partial: bool) -> (&str, Vec<ToolCall>) {
    let markers = openers(syntax);
    if syntax == ToolSyntax::Llama3Json {
        let trimmed = text.trim_start_matches(is_ws);
        if trimmed.starts_with('{') {
            // Llama 3 answers with a bare JSON object when it calls a tool
            return ("", llama3_calls(trimmed, partial).unwrap_or_default());
        }
    }
    let first = markers
        .iter()
        .filter_map(|m| text.find(m).map(|p| (p, *m)))
        .min();
    let Some((start, marker)) = first else {
        // streaming: whitespace may turn out to precede a tool call, which drops it
        let shown = hold_back(text, partial, markers);
        let shown = if partial {
            shown.trim_end_matches(is_ws)
        } else {
            shown
        };
        return (shown, Vec::new());
    };
    let content = text[..start].trim_end_matches(is_ws);
    let content = if content.len() < start && partial {
        content
    } else {
        &text[..start]
    };
    let body = &text[start..];
    let calls = match syntax {
        ToolSyntax::Hermes => tagged_calls(body, "<tool_call>", "</tool_call>", partial, json_call),
        ToolSyntax::Qwen3Coder => {
            tagged_calls(body, "<tool_call>", "</tool_call>", partial, |i, p| {
                function_params_call(i, p, true)
            })
        }
        ToolSyntax::MistralJson => mistral_json_calls(&body[marker.len()..], partial),
        ToolSyntax::MistralArgs => mistral_args_calls(body, partial),
        ToolSyntax::Llama3Json => {
            llama3_calls(body[marker.len()..].trim_start(), partial).unwrap_or_default()
        }
        ToolSyntax::DeepSeekR1 | ToolSyntax::DeepSeekV31 => tagged_calls(
            body,
            DS_CALL_BEGIN,
            DS_CALL_END,
            partial,
            |inner, partial| deepseek_call(syntax, inner, partial),
        ),
        ToolSyntax::KimiK2 => tagged_calls(body, KIMI_CALL, KIMI_CALL_END, partial, kimi_call),
        ToolSyntax::Glm | ToolSyntax::Ling3 => {
            tagged_calls(body, "<tool_call>", "</tool_call>", partial, glm_call)
        }
        ToolSyntax::MiniMaxM2 => {
            tagged_sections(body, MINIMAX_OPEN, MINIMAX_CLOSE, partial, |s, p| {
                tagged_calls(s, "<invoke name=", "</invoke>", p, minimax_invoke)
            })
        }
        ToolSyntax::CommandR7B => {
            array_sections(body, ACTION_START, Some(ACTION_END), partial, |o, p| {
                keyed_json_call(o, p, "tool_name", "parameters", "tool_call_id")
            })
        }
        ToolSyntax::FunctionaryV31 => {
            tagged_calls(body, "<function=", "</function>", partial, functionary_call)
        }
        ToolSyntax::Nemotron => {
            array_sections(body, "<TOOLCALL>", Some("</TOOLCALL>"), partial, json_call)
        }
        ToolSyntax::Apriel => array_sections(
            body,
            "<tool_calls>",
            Some("</tool_calls>"),
            partial,
            json_call,
        ),
        ToolSyntax::FireFunction => array_sections(body, "functools", None, partial, json_call),
        ToolSyntax::Apertus => array_sections(
            body,
            "<|tools_prefix|>",
            Some("<|tools_suffix|>"),
            partial,
            name_keyed_call,
        ),
        ToolSyntax::SeedOss => tagged_calls(
            body,
            "<seed:tool_call>",
            "</seed:tool_call>",
            partial,
            |i, p| function_params_call(i, p, false),
        ),
        ToolSyntax::Lfm2 => tagged_sections(body, LFM2_OPEN, LFM2_CLOSE, partial, lfm2_calls),
        ToolSyntax::CommandRPlus => command_r_plus_calls(&body[marker.len()..], partial),
        ToolSyntax::MiniMaxM3 => {
            tagged_sections(body, MM_BLOCK_OPEN, MM_BLOCK_CLOSE, partial, |s, p| {
                tagged_calls(s, MM_INVOKE_OPEN, MM_INVOKE_CLOSE, p, minimax_m3_invoke)
            })
        }
        ToolSyntax::GigaChat3 | ToolSyntax::GigaChat31 => {
            llama3_calls(body[marker.len()..].trim_start(), partial).unwrap_or_default()
        }
        ToolSyntax::MiniCpm5 => tagged_calls(
            body,
            "<function name=\"",
            "</function>",
            partial,
            minicpm5_call,
        ),
        ToolSyntax::Dsml | ToolSyntax::DsmlV4 => {
            let (open, close) = DSML_BLOCK[usize::from(syntax == ToolSyntax::DsmlV4)];
            tagged_sections(body, open, close, partial, |s, p| {
                tagged_calls(s, DSML_INVOKE_OPEN, DSML_INVOKE_CLOSE, p, dsml_invoke)
            })
        }
        ToolSyntax::None
        | ToolSyntax::Harmony
        | ToolSyntax::FunctionaryV32
        | ToolSyntax::MuseGlimmer
        | ToolSyntax::KimiK3
        | ToolSyntax::Gemma4
        | ToolSyntax::LlmJpHarmony => Vec::new(),
    };
    (content.trim_end_matches(is_ws), calls)
}

/// What stands between each `open` tag and its `close` in `body`, in order, with whether it was
/// closed: only the last can be unclosed (the rest of the text after its `open`).
fn tagged_spans<'a>(body: &'a str, open: &str, close: &str) -> Vec<(&'a str, bool)> {
    let mut spans = Vec::new();
    let mut rest = body;
    while let Some(start) = rest.find(open) {
        let inner = &rest[start + open.len()..];
        match inner.find(close) {
            Some(end) => {
                spans.push((&inner[..end], true));
                rest = &inner[end + close.len()..];
            }
            None => {
                spans.push((inner, false));
                break;
            }
        }
    }
    spans
}

/// Calls between `open` and `close` tags; the last may be unterminated while streaming.
fn tagged_calls(
    body: &str,
    open: &str,
    close: &str,
    partial: bool,
    parse_one: impl Fn(&str, bool) -> Option<ToolCall>,
) -> Vec<ToolCall> {
    tagged_spans(body, open, close)
        .into_iter()
        .filter_map(|(inner, closed)| match closed {
            true => parse_one(inner, false),
            false if partial => parse_one(hold_back(inner, true, &[close]), true),
            false => None,
        })
        .collect()
}

/// `{"name": ..., "arguments": {...}}` with the arguments kept as written.
fn json_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let inner = inner.trim_matches(is_ws);
    let name = json_string_field(inner, "name")?;
    let arguments = raw_json_field(inner, &["arguments", "parameters"], partial)?;
    Some(ToolCall {
        id: json_string_field(inner, "id").unwrap_or_default(),
        name,
        arguments,
    })
}

/// The value of `"key": "..."` in a JSON object text, even an unfinished one.
fn json_string_field(text: &str, key: &str) -> Option<String> {
    let pattern = format!("\"{key}\"");
    let at = text.find(&pattern)?;
    let after = text[at + pattern.len()..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let mut de = serde_json::Deserializer::from_str(after).into_iter::<String>();
    de.next()?.ok()
}

/// The raw text of the first of `keys` whose value is an object (or, finished, any JSON
/// value). Unfinished, the text seen so far; finished, it must be valid JSON.
fn raw_json_field(text: &str, keys: &[&str], partial: bool) -> Option<String> {
    for key in keys {
        let pattern = format!("\"{key}\"");
        let Some(at) = text.find(&pattern) else {
            continue;
        };
        let after = text[at + pattern.len()..]
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        return json_prefix(after, partial);
    }
    None
}

/// The JSON value at the start of `text`: complete, or (streaming) as much as was written.
fn json_prefix(text: &str, partial: bool) -> Option<String> {
    let end = json_value_end(text);
    match end {
        Some(end) => {
            let value = &text[..end];
            serde_json::from_str::<Json>(value)
                .ok()
                .map(|_| value.to_string())
        }
        None if partial => Some(text.trim_end_matches(is_ws).to_string()),
        None => None,
    }
}

/// Byte length of the balanced JSON value at the start of `text`, if it is complete.
fn json_value_end(text: &str) -> Option<usize> {
    let mut depth = 0i32;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    in_string = false;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            c if depth == 0 && (c == ',' || is_ws(c)) && i > 0 => return Some(i),
            _ => {}
        }
    }
    (depth == 0 && !in_string && !text.is_empty() && !text.ends_with(is_ws))
        .then_some(text.len())
        .filter(|_| serde_json::from_str::<Json>(text).is_ok())
}

/// Qwen3-Coder / Seed-OSS style: `<function=NAME>` then `<parameter=KEY>VALUE</parameter>`s;
/// values that parse as JSON keep their type, others become strings. Qwen3-Coder writes each
/// value between newlines (`trim_newlines`), Seed-OSS as is.
fn function_params_call(inner: &str, partial: bool, trim_newlines: bool) -> Option<ToolCall> {
    let body = inner.trim_matches(is_ws);
    let after = body.strip_prefix("<function=")?;
    let name_end = after.find('>')?;
    let name = after[..name_end].trim().to_string();
    let tags = ParamTags {
        open: "<parameter=",
        name_end: ">",
        close: "</parameter>",
        trim_newlines,
    };
    let args = xml_params(&after[name_end + 1..], &tags, partial)?;
    Some(ToolCall {
        id: String::new(),
        name,
        arguments: object_text(args, partial),
    })
}

/// How an XML-style family writes one parameter: `{open}KEY{name_end}VALUE{close}`.
struct ParamTags {
    open: &'static str,
    name_end: &'static str,
    close: &'static str,
    trim_newlines: bool,
}

/// The parameters in `text`; a value is only taken once closed (its type is not known before),
/// and a finished call with an unclosed one is malformed.
fn xml_params(
    text: &str,
    tags: &ParamTags,
    partial: bool,
) -> Option<serde_json::Map<String, Json>> {
    let mut args = serde_json::Map::new();
    let mut rest = text;
    while let Some(p) = rest.find(tags.open) {
        let tail = &rest[p + tags.open.len()..];
        let Some(key_end) = tail.find(tags.name_end) else {
            if partial {
                break;
            }
            return None;
        };
        let key = tail[..key_end].trim().to_string();
        let value_text = &tail[key_end + tags.name_end.len()..];
        let Some(end) = value_text.find(tags.close) else {
            if partial {
                break;
            }
            return None;
        };
        let mut value = &value_text[..end];
        if tags.trim_newlines {
            value = value.strip_prefix('\n').unwrap_or(value);
            value = value.strip_suffix('\n').unwrap_or(value);
        }
        args.insert(key, typed_value(value));
        rest = &value_text[end + tags.close.len()..];
    }
    Some(args)
}

/// MiniMax M2: `"NAME">` then `<parameter name="KEY">VALUE</parameter>`s.
fn minimax_invoke(inner: &str, partial: bool) -> Option<ToolCall> {
    let after = inner.trim_start_matches(is_ws).strip_prefix('"')?;
    let name_end = after.find("\">")?;
    let tags = ParamTags {
        open: "<parameter name=\"",
        name_end: "\">",
        close: "</parameter>",
        trim_newlines: false,
    };
    let args = xml_params(&after[name_end + 2..], &tags, partial)?;
    Some(ToolCall {
        id: String::new(),
        name: after[..name_end].to_string(),
        arguments: object_text(args, partial),
    })
}

/// Functionary v3.1: `NAME>{...}` (inside `<function=` ... `</function>`).
fn functionary_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let name_end = inner.find('>')?;
    let name = inner[..name_end].trim();
    if name.is_empty() {
        return None;
    }
    let arguments = json_prefix(inner[name_end + 1..].trim_matches(is_ws), partial)?;
    Some(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments,
    })
}

/// Sections between `open` and `close`, each holding any number of calls. The last may be
/// unterminated: while streaming it is read as far as written; finished, only what is complete
/// in it counts.
fn tagged_sections(
    body: &str,
    open: &str,
    close: &str,
    partial: bool,
    parse_many: impl Fn(&str, bool) -> Vec<ToolCall>,
) -> Vec<ToolCall> {
    tagged_spans(body, open, close)
        .into_iter()
        .flat_map(|(inner, closed)| match closed {
            true => parse_many(inner, false),
            false => parse_many(hold_back(inner, partial, &[close]), partial),
        })
        .collect()
}

/// JSON lists of calls after `open` (and before `close`, when the family closes them).
fn array_sections(
    body: &str,
    open: &str,
    close: Option<&str>,
    partial: bool,
    parse_obj: fn(&str, bool) -> Option<ToolCall>,
) -> Vec<ToolCall> {
    match close {
        Some(close) => tagged_sections(body, open, close, partial, |s, p| {
            json_array_calls(s, p, parse_obj)
        }),
        None => json_array_calls(body.strip_prefix(open).unwrap_or(body), partial, parse_obj),
    }
}

/// A call object with the given keys for its name, arguments and id; while streaming a call is
/// shown as soon as its name is known.
fn keyed_json_call(
    inner: &str,
    partial: bool,
    name_key: &str,
    args_key: &str,
    id_key: &str,
) -> Option<ToolCall> {
    let inner = inner.trim_matches(is_ws);
    let name = json_string_field(inner, name_key)?;
    let arguments = match raw_json_field(inner, &[args_key], partial) {
        Some(args) => args,
        None if partial && !inner.contains(&format!("\"{args_key}\"")) => String::new(),
        None => return None,
    };
    let id = if id_key.is_empty() {
        None
    } else {
        json_string_field(inner, id_key)
    };
    Some(ToolCall {
        id: id.unwrap_or_default(),
        name,
        arguments,
    })
}

/// Command R+: after `Action:`, a ```json fenced list of `{"tool_name": ..., "parameters": ...}`.
fn command_r_plus_calls(text: &str, partial: bool) -> Vec<ToolCall> {
    const FENCE: &str = "```json";
    let text = text.trim_start_matches(is_ws);
    let Some(fenced) = text.strip_prefix(FENCE) else {
        return Vec::new();
    };
    let (list, closed) = match fenced.find("```") {
        Some(end) => (&fenced[..end], true),
        None => (hold_back(fenced, partial, &["```"]), false),
    };
    json_array_calls(list, partial && !closed, |o, p| {
        keyed_json_call(o, p, "tool_name", "parameters", "")
    })
}

/// Apertus: `{"NAME": {...arguments...}}`.
fn name_keyed_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let after = inner.trim_matches(is_ws).strip_prefix('{')?.trim_start();
    let mut de = serde_json::Deserializer::from_str(after).into_iter::<String>();
    let name = de.next()?.ok()?;
    let rest = after[de.byte_offset()..].trim_start().strip_prefix(':')?;
    let arguments = json_prefix(rest.trim_start(), partial)?;
    Some(ToolCall {
        id: String::new(),
        name,
        arguments,
    })
}

/// LFM2: `[NAME(KEY=VALUE, ...), ...]` with Python (or JSON) literal values. While streaming,
/// a call is shown once its name is written and its arguments grow as each value completes.
fn lfm2_calls(section: &str, partial: bool) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    let Some(mut rest) = section.trim_start_matches(is_ws).strip_prefix('[') else {
        return calls;
    };
    loop {
        rest = rest.trim_start_matches(|c: char| is_ws(c) || c == ',');
        let Some(open) = rest.find('(') else {
            break;
        };
        let name = rest[..open].trim();
        let valid_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !valid_name {
            break;
        }
        let mut args = serde_json::Map::new();
        let mut body = &rest[open + 1..];
        let closed = loop {
            body = body.trim_start_matches(|c: char| is_ws(c) || c == ',');
            if let Some(after) = body.strip_prefix(')') {
                body = after;
                break true;
            }
            let Some(eq) = body.find('=') else {
                break false;
            };
            let key = body[..eq].trim();
            match python_value(body[eq + 1..].trim_start_matches(is_ws)) {
                Some((value, used)) if !key.is_empty() => {
                    args.insert(key.to_string(), value);
                    let start = body.len() - body[eq + 1..].trim_start_matches(is_ws).len();
                    body = &body[start + used..];
                }
                _ => break false,
            }
        };
        if !closed && !partial {
            // malformed or cut short: dropped
            break;
        }
        calls.push(ToolCall {
            id: String::new(),
            name: name.to_string(),
            arguments: object_text(args, !closed),
        });
        if !closed {
            break;
        }
        rest = body;
    }
    calls
}

/// A Python (or JSON) literal at the start of `text` as JSON, and the bytes it took; None when
/// it is unfinished or not a literal.
fn python_value(text: &str) -> Option<(Json, usize)> {
    let first = text.chars().next()?;
    match first {
        '"' | '\'' => {
            let mut out = String::new();
            let mut chars = text.char_indices().skip(1);
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        let (_, e) = chars.next()?;
                        match e {
                            'n' => out.push('\n'),
                            't' => out.push('\t'),
                            'r' => out.push('\r'),
                            '0' => out.push('\0'),
                            'u' => {
                                let hex: String = (0..4)
                                    .filter_map(|_| chars.next().map(|(_, h)| h))
                                    .collect();
                                out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                            }
                            other => out.push(other),
                        }
                    }
                    c if c == first => return Some((Json::String(out), i + 1)),
                    c => out.push(c),
                }
            }
            None
        }
        '[' | '(' | '{' => {
            let close = match first {
                '[' => ']',
                '(' => ')',
                _ => '}',
            };
            let mut rest = &text[1..];
            let mut items = Vec::new();
            let mut object = serde_json::Map::new();
            loop {
                rest = rest.trim_start_matches(is_ws);
                if let Some(after) = rest.strip_prefix(close) {
                    let used = text.len() - after.len();
                    let value = if first == '{' {
                        Json::Object(object)
                    } else {
                        Json::Array(items)
                    };
                    return Some((value, used));
                }
                let (value, used) = python_value(rest)?;
                rest = rest[used..].trim_start_matches(is_ws);
                if first == '{' {
                    let key = match value {
                        Json::String(k) => k,
                        other => other.to_string(),
                    };
                    rest = rest.strip_prefix(':')?.trim_start_matches(is_ws);
                    let (value, used) = python_value(rest)?;
                    object.insert(key, value);
                    rest = rest[used..].trim_start_matches(is_ws);
                } else {
                    items.push(value);
                }
                if let Some(after) = rest.strip_prefix(',') {
                    rest = after;
                } else if !rest.starts_with(close) {
                    return None;
                }
            }
        }
        _ => {
            let end = text.find(|c: char| is_ws(c) || matches!(c, ',' | ')' | ']' | '}' | ':'))?;
            let word = &text[..end];
            let value = match word {
                "True" | "true" => Json::Bool(true),
                "False" | "false" => Json::Bool(false),
                "None" | "null" => Json::Null,
                number => serde_json::from_str::<serde_json::Number>(number)
                    .ok()
                    .map(Json::Number)?,
            };
            Some((value, end))
        }
    }
}

/// Command R7B / Cohere2 MoE content: the text inside `<|START_RESPONSE|>` / `<|START_TEXT|>`
/// (None when the output does not start with one).
fn cohere_content(rest: &str, partial: bool) -> Option<&str> {
    let trimmed = rest.trim_start_matches(is_ws);
    for (start, end) in COHERE_CONTENT {
        if let Some(body) = trimmed.strip_prefix(start) {
            return Some(match body.find(end) {
                Some(e) => &body[..e],
                None => hold_back(body, partial, &[end]),
            });
        }
    }
    let may_open = COHERE_CONTENT
        .iter()
        .any(|(start, _)| start.starts_with(trimmed));
    (partial && !trimmed.is_empty() && may_open).then_some("")
}

/// Functionary v3.2: the prompt ends with `>>>`, so the output starts with a recipient line;
/// `all` is content, any other recipient a tool call whose JSON arguments follow. Later
/// messages start with `>>>` again.
fn parse_functionary_v32(text: &str, parse_tools: bool, partial: bool) -> ParsedMessage {
    let mut msg = ParsedMessage::default();
    if !parse_tools {
        // without tools everything after the `all` recipient is content
        match text.strip_prefix("all\n") {
            Some(rest) => msg.content = rest.to_string(),
            None if partial && "all\n".starts_with(text) => {}
            None => msg.content = text.to_string(),
        }
        return msg;
    }
    let segments: Vec<&str> = text.split(">>>").collect();
    let count = segments.len();
    for (i, segment) in segments.into_iter().enumerate() {
        let last = i + 1 == count;
        let Some((recipient, body)) = segment.split_once('\n') else {
            // a recipient still being written; finished, a lone first line is plain text
            if count == 1 && !partial {
                msg.content.push_str(segment);
            }
            break;
        };
        let recipient = recipient.trim();
        if recipient == "all" {
            let body = if last {
                hold_back(body, partial, &[">>>"])
            } else {
                body
            };
            msg.content.push_str(body);
        } else if !recipient.is_empty() {
            let arguments = json_prefix(body.trim_matches(is_ws), last && partial);
            if let Some(arguments) = arguments {
                msg.tool_calls.push(ToolCall {
                    id: String::new(),
                    name: recipient.to_string(),
                    arguments,
                });
            }
        }
    }
    msg
}

fn kimi_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let (id, args) = inner.split_once(KIMI_ARGS)?;
    let id = id.trim();
    let name = id.strip_prefix("functions.").unwrap_or(id);
    let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
    let arguments = json_prefix(args.trim_matches(is_ws), partial)?;
    Some(ToolCall {
        id: id.to_string(),
        name: name.to_string(),
        arguments,
    })
}

/// GLM: the name, then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs; values that
/// parse as JSON keep their type, others become strings.
fn glm_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let body = inner.trim_start_matches(is_ws);
    let name_end = body.find("<arg_key>").unwrap_or(body.len());
    let name = body[..name_end].trim();
    if name.is_empty() || (partial && name_end == body.len() && !body.ends_with(is_ws)) {
        // the name may still be growing
        return None;
    }
    let mut args = serde_json::Map::new();
    let mut rest = &body[name_end..];
    while let Some(k) = rest.find("<arg_key>") {
        let tail = &rest[k + "<arg_key>".len()..];
        let Some(key_end) = tail.find("</arg_key>") else {
            break;
        };
        let key = tail[..key_end].trim().to_string();
        let after = &tail[key_end + "</arg_key>".len()..];
        let Some(v) = after.find("<arg_value>") else {
            break;
        };
        let value_text = &after[v + "<arg_value>".len()..];
        let Some(end) = value_text.find("</arg_value>") else {
            if partial {
                break;
            }
            return None;
        };
        args.insert(key, typed_value(&value_text[..end]));
        rest = &value_text[end + "</arg_value>".len()..];
    }
    Some(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments: object_text(args, partial),
    })
}

/// A parameter value as JSON: its own type when it parses, a string otherwise.
fn typed_value(text: &str) -> Json {
    serde_json::from_str::<Json>(text)
        .ok()
        .filter(|v| !v.is_string())
        .unwrap_or_else(|| Json::String(text.to_string()))
}

/// Arguments built from parameters; while streaming the object is left open so later
/// parameters only append.
fn object_text(args: serde_json::Map<String, Json>, partial: bool) -> String {
    let text = Json::Object(args).to_string();
    if partial {
        text.trim_end_matches('}').to_string()
    } else {
        text
    }
}

fn mistral_json_calls(text: &str, partial: bool) -> Vec<ToolCall> {
    json_array_calls(text, partial, json_call)
}

/// The calls of a JSON list (the last possibly unfinished while streaming); finished, the list
/// must be complete and valid.
fn json_array_calls(
    text: &str,
    partial: bool,
    parse_obj: impl Fn(&str, bool) -> Option<ToolCall>,
) -> Vec<ToolCall> {
    let text = text.trim_matches(is_ws);
    let complete = json_value_end(text)
        .is_some_and(|end| serde_json::from_str::<Json>(&text[..end]).is_ok_and(|v| v.is_array()));
    if !complete && !partial {
        return Vec::new();
    }
    // each object of the list, the last possibly still being written
    let Some(inner) = text.strip_prefix('[') else {
        return Vec::new();
    };
    split_objects(inner)
        .into_iter()
        .filter_map(|obj| parse_obj(obj, partial))
        .collect()
}

/// The top-level `{...}` objects in a (possibly unfinished) list body.
fn split_objects(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text.trim_start_matches(|c: char| is_ws(c) || c == ',');
    while rest.starts_with('{') {
        match json_value_end(rest) {
            Some(end) => {
                out.push(&rest[..end]);
                rest = rest[end..].trim_start_matches(|c: char| is_ws(c) || c == ',');
            }
            None => {
                out.push(rest);
                break;
            }
        }
    }
    out
}

fn mistral_args_calls(body: &str, partial: bool) -> Vec<ToolCall> {
    let mut calls = Vec::new();
    for chunk in body.split("[TOOL_CALLS]").skip(1) {
        let Some(args_at) = chunk.find("[ARGS]") else {
            continue;
        };
        let head = &chunk[..args_at];
        let (name, id) = match head.split_once("[CALL_ID]") {
            Some((name, id)) => (name, id),
            None => (head, ""),
        };
        let args = chunk[args_at + "[ARGS]".len()..].trim_matches(is_ws);
        let arguments = if partial && json_value_end(args).is_none() {
            Some(args.to_string())
        } else {
            json_prefix(args, false)
        };
        if let Some(arguments) = arguments {
            calls.push(ToolCall {
                id: id.trim().to_string(),
                name: name.trim().to_string(),
                arguments,
            });
        }
    }
    calls
}

fn llama3_calls(text: &str, partial: bool) -> Option<Vec<ToolCall>> {
    let call = json_call(text, partial)?;
    if !partial && json_value_end(text).is_none() {
        return None;
    }
    Some(vec![call])
}

fn deepseek_call(syntax: ToolSyntax, inner: &str, partial: bool) -> Option<ToolCall> {
    let (head, args) = inner.split_once(DS_SEP)?;
    if syntax == ToolSyntax::DeepSeekV31 {
        let arguments = json_prefix(args.trim_matches(is_ws), partial)?;
        return Some(ToolCall {
            id: String::new(),
            name: head.trim().to_string(),
            arguments,
        });
    }
    // R1 writes `function<｜tool▁sep｜>NAME` then the arguments in a ```json fence
    let (name, fenced) = args.split_once('\n')?;
    let fenced = fenced.trim_start();
    let json = match fenced.strip_prefix("```json") {
        Some(json) => json.trim_start(),
        None if partial && "```json".starts_with(fenced) => "",
        None => fenced,
    };
    let json = json
        .trim_end_matches(is_ws)
        .trim_end_matches('`')
        .trim_end_matches(is_ws);
    let arguments = json_prefix(json, partial)?;
    Some(ToolCall {
        id: String::new(),
        name: name.trim().to_string(),
        arguments,
    })
}

/// Harmony (gpt-oss): messages `<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]<|message|>TEXT`
/// separated by `<|end|><|start|>assistant`; `analysis` is reasoning, `final` and plain
/// `commentary` are content, a `to=functions.NAME` recipient makes a tool call.
fn parse_harmony(
    text: &str,
    reasoning: ReasoningFormat,
    parse_tools: bool,
    partial: bool,
) -> ParsedMessage {
    let mut msg = ParsedMessage::default();
    if !reasoning.extracts() {
        // upstream shows the analysis message raw and the final message's text
        let mut out = String::new();
        for (header, body, _) in harmony_messages(text, partial) {
            if header.contains("final") {
                out.push_str(&body);
            } else {
                out.push_str(&format!("<|channel|>{header}<|message|>{body}<|end|>"));
            }
        }
        msg.content = out;
        return msg;
    }
    for (header, body, closed) in harmony_messages(text, partial) {
        let recipient = header
            .split_whitespace()
            .find_map(|w| w.strip_prefix("to=functions."))
            .map(|n| n.trim_end_matches("<|constrain|>json").to_string());
        match recipient {
            Some(name) if parse_tools => {
                let args = body.trim_matches(is_ws);
                let arguments = if closed || !partial {
                    json_prefix(args, false)
                } else {
                    Some(args.to_string())
                };
                if let Some(arguments) = arguments {
                    msg.tool_calls.push(ToolCall {
                        id: String::new(),
                        name,
                        arguments,
                    });
                }
            }
            Some(_) => {}
            None if header.starts_with("analysis") => msg.reasoning_content.push_str(&body),
            None => msg.content.push_str(&body),
        }
    }
    msg
}

/// (header, text, finished) of each Harmony message in the output.
fn harmony_messages(text: &str, partial: bool) -> Vec<(String, String, bool)> {
    const MARKERS: [&str; 6] = [
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|start|>",
        "<|call|>",
        "<|return|>",
    ];
    let mut out = Vec::new();
    let mut rest = text;
    // a role header may carry the recipient: " to=functions.NAME<|channel|>..."
    while let Some(ch) = rest.find("<|channel|>") {
        let prefix = &rest[..ch];
        let after = &rest[ch + "<|channel|>".len()..];
        let Some(msg_at) = after.find("<|message|>") else {
            break;
        };
        let mut header = after[..msg_at].trim().to_string();
        if let Some(to) = prefix.split_whitespace().find(|w| w.starts_with("to=")) {
            header = format!("{header} {to}");
        }
        let body_all = &after[msg_at + "<|message|>".len()..];
        let end = ["<|end|>", "<|call|>", "<|return|>"]
            .iter()
            .filter_map(|m| body_all.find(m).map(|p| (p, m.len())))
            .min();
        match end {
            Some((p, len)) => {
                out.push((header, body_all[..p].to_string(), true));
                rest = &body_all[p + len..];
            }
            None => {
                let body = hold_back(body_all, partial, &MARKERS);
                out.push((header, body.to_string(), false));
                break;
            }
        }
    }
    if out.is_empty() && !text.contains("<|channel|>") {
        out.push((
            "final".into(),
            hold_back(text, partial, &MARKERS).to_string(),
            !partial,
        ));
    }
    out
}

/// One streamed change to the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    /// The start of tool call `index` (its id and name), or more of its arguments.
    ToolCall {
        index: usize,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
}

/// Parses output as it streams: feed pieces, get deltas; ids are given to tool calls that
/// have none (as upstream's server does) and kept stable across deltas.
#[derive(Debug)]
pub struct StreamParser {
    format: OutputFormat,
    reasoning: ReasoningFormat,
    parse_tools: bool,
    text: String,
    shown: ParsedMessage,
    ids: Vec<String>,
    id_seed: u64,
}

impl StreamParser {
    pub fn new(format: OutputFormat, reasoning: ReasoningFormat, parse_tools: bool) -> Self {
        let id_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        StreamParser {
            format,
            reasoning,
            parse_tools,
            text: String::new(),
            shown: ParsedMessage::default(),
            ids: Vec::new(),
            id_seed,
        }
    }

    /// Adds generated text; returns what became visible.
    pub fn push(&mut self, piece: &str) -> Vec<Delta> {
        self.text.push_str(piece);
        let parsed = self
            .format
            .parse(&self.text, self.reasoning, self.parse_tools, true);
        self.advance(parsed)
    }

    /// Ends the stream: the final message and the last deltas.
    pub fn finish(mut self) -> (ParsedMessage, Vec<Delta>) {
        let parsed = self
            .format
            .parse(&self.text, self.reasoning, self.parse_tools, false);
        let deltas = self.advance(parsed);
        (self.shown, deltas)
    }

    fn next_id(&mut self) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..32)
            .map(|_| {
                // xorshift: ids need to be unique, not unpredictable
                self.id_seed ^= self.id_seed << 13;
                self.id_seed ^= self.id_seed >> 7;
                self.id_seed ^= self.id_seed << 17;
                ALPHABET[(self.id_seed % ALPHABET.len() as u64) as usize] as char
            })
            .collect()
    }

    fn advance(&mut self, mut parsed: ParsedMessage) -> Vec<Delta> {
        let mut deltas = Vec::new();
        // never take back what was shown: only growth is streamed
        if let Some(more) = parsed
            .reasoning_content
            .strip_prefix(self.shown.reasoning_content.as_str())
        {
            if !more.is_empty() {
                deltas.push(Delta::Reasoning(more.to_string()));
            }
        } else {
            parsed.reasoning_content = self.shown.reasoning_content.clone();
        }
        if let Some(more) = parsed.content.strip_prefix(self.shown.content.as_str()) {
            if !more.is_empty() {
                deltas.push(Delta::Content(more.to_string()));
            }
        } else {
            parsed.content = self.shown.content.clone();
        }
        for (index, call) in parsed.tool_calls.iter_mut().enumerate() {
            if index >= self.ids.len() {
                let id = if call.id.is_empty() {
                    self.next_id()
                } else {
                    call.id.clone()
                };
                self.ids.push(id);
            }
            call.id = self.ids[index].clone();
            match self.shown.tool_calls.get(index) {
                None => deltas.push(Delta::ToolCall {
                    index,
                    id: Some(call.id.clone()),
                    name: Some(call.name.clone()),
                    arguments: call.arguments.clone(),
                }),
                Some(old) => match call.arguments.strip_prefix(old.arguments.as_str()) {
                    Some(more) if !more.is_empty() => deltas.push(Delta::ToolCall {
                        index,
                        id: None,
                        name: None,
                        arguments: more.to_string(),
                    }),
                    Some(_) => {}
                    None => call.arguments = old.arguments.clone(),
                },
            }
        }
        if parsed.tool_calls.len() < self.shown.tool_calls.len() {
            parsed.tool_calls = self.shown.tool_calls.clone();
        }
        self.shown = parsed;
        deltas
    }
}

/// MiniMax M3: `NAME">` then one element per parameter (`NS<KEY>VALUE NS</KEY>`).
fn minimax_m3_invoke(inner: &str, partial: bool) -> Option<ToolCall> {
    let name_end = inner.find("\">")?;
    let name = &inner[..name_end];
    if name.is_empty() {
        return None;
    }
    let (elements, complete, rest) = mm_elements(&inner[name_end + 2..]);
    if !partial && (!complete || !rest.trim_matches(is_ws).is_empty()) {
        // an unclosed parameter or stray text: malformed
        return None;
    }
    let mut args = serde_json::Map::new();
    for (key, value) in elements {
        args.insert(key.to_string(), mm_value(value));
    }
    Some(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments: object_text(args, partial),
    })
}

/// The `NS<TAG>...NS</TAG>` elements at the start of `text`: (tag, inner) of each closed one,
/// whether the elements end cleanly (none left unclosed), and the text after them.
fn mm_elements(text: &str) -> (Vec<(&str, &str)>, bool, &str) {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let trimmed = rest.trim_start_matches(is_ws);
        let Some(after) = trimmed
            .strip_prefix(MM_NS)
            .and_then(|t| t.strip_prefix('<'))
        else {
            return (out, true, rest);
        };
        if after.starts_with('/') {
            return (out, true, rest);
        }
        let Some(tag_end) = after.find('>') else {
            return (out, false, rest);
        };
        let tag = &after[..tag_end];
        let body = &after[tag_end + 1..];
        let open = format!("{MM_NS}<{tag}>");
        let close = format!("{MM_NS}</{tag}>");
        // the matching close, counting nested elements of the same name
        let mut depth = 0usize;
        let mut at = 0usize;
        let end = loop {
            let next_open = body[at..].find(&open).map(|p| p + at);
            let Some(next_close) = body[at..].find(&close).map(|p| p + at) else {
                break None;
            };
            match next_open {
                Some(o) if o < next_close => {
                    depth += 1;
                    at = o + open.len();
                }
                _ if depth == 0 => break Some(next_close),
                _ => {
                    depth -= 1;
                    at = next_close + close.len();
                }
            }
        };
        let Some(end) = end else {
            return (out, false, rest);
        };
        out.push((tag, &body[..end]));
        rest = &body[end + close.len()..];
    }
}

/// A MiniMax M3 parameter value: nested elements make an object (`<item>`s a list), other text
/// is typed as JSON when it parses and a string otherwise.
fn mm_value(text: &str) -> Json {
    if text.trim_start_matches(is_ws).starts_with(MM_NS) {
        let (elements, complete, rest) = mm_elements(text);
        if complete && !elements.is_empty() && rest.trim_matches(is_ws).is_empty() {
            if elements.iter().all(|(tag, _)| *tag == "item") {
                return Json::Array(elements.iter().map(|(_, v)| mm_value(v)).collect());
            }
            let mut object = serde_json::Map::new();
            for (tag, value) in elements {
                object.insert(tag.to_string(), mm_value(value));
            }
            return Json::Object(object);
        }
    }
    typed_value(text)
}

/// DeepSeek DSML: `NAME">` then `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`s;
/// `string="true"` values are kept as text, others must be JSON.
fn dsml_invoke(inner: &str, partial: bool) -> Option<ToolCall> {
    let name_end = inner.find("\">")?;
    let name = &inner[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut args = serde_json::Map::new();
    let mut rest = &inner[name_end + 2..];
    loop {
        let trimmed = rest.trim_start_matches(is_ws);
        let Some(tail) = trimmed.strip_prefix(DSML_PARAM_OPEN) else {
            if !partial && !trimmed.is_empty() {
                return None;
            }
            break;
        };
        let (Some(attrs_end), Some(end)) = (tail.find('>'), tail.find(DSML_PARAM_CLOSE)) else {
            if partial {
                break;
            }
            return None;
        };
        if attrs_end > end {
            return None;
        }
        let attrs = &tail[..attrs_end];
        let key = &attrs[..attrs.find('"')?];
        let value = &tail[attrs_end + 1..end];
        let value = if attrs.contains("string=\"true\"") {
            Json::String(value.to_string())
        } else {
            serde_json::from_str::<Json>(value.trim_matches(is_ws)).ok()?
        };
        args.insert(key.to_string(), value);
        rest = &tail[end + DSML_PARAM_CLOSE.len()..];
    }
    Some(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments: object_text(args, partial),
    })
}

/// muse-glimmer: the prompt ends with `<|start|>assistant`; each message is
/// ` to=RECIPIENT<|message|>TEXT` closed by `<|eom|>` (more follow, each after another
/// `<|start|>assistant`) or `<|eot|>`.
fn parse_muse_glimmer(
    text: &str,
    reasoning: ReasoningFormat,
    parse_tools: bool,
    partial: bool,
) -> ParsedMessage {
    const START: &str = "<|start|>assistant";
    const ENDS: [&str; 2] = ["<|eom|>", "<|eot|>"];
    let mut msg = ParsedMessage::default();
    if !reasoning.extracts() && !parse_tools {
        // upstream: everything after the generation prompt is content
        msg.content = text.to_string();
        return msg;
    }
    let segments: Vec<&str> = text.split(START).collect();
    let count = segments.len();
    for (i, segment) in segments.into_iter().enumerate() {
        let last = i + 1 == count;
        let Some((header, body_all)) = segment.split_once("<|message|>") else {
            // a header still being written
            break;
        };
        let header = header.trim_matches(is_ws);
        let recipient = match header.strip_prefix("to=") {
            Some(r) => r.trim(),
            None if header.is_empty() => "user",
            None => break,
        };
        let end = ENDS.iter().filter_map(|e| body_all.find(e)).min();
        let body = match end {
            Some(e) => &body_all[..e],
            None if last => hold_back(body_all, partial, &ENDS),
            None => body_all,
        };
        match recipient {
            "self" if reasoning.extracts() => msg.reasoning_content.push_str(body),
            "self" | "user" => msg.content.push_str(body),
            _ if parse_tools => msg.tool_calls.extend(muse_calls(body_all, partial && last)),
            _ => {}
        }
    }
    msg
}

/// The `<atem:function_calls>` block of a muse-glimmer tool message.
fn muse_calls(body: &str, partial: bool) -> Vec<ToolCall> {
    const OPEN: &str = "<atem:function_calls>";
    const CLOSE: &str = "</atem:function_calls>";
    let trimmed = body.trim_start_matches(is_ws);
    let Some(inner) = trimmed.strip_prefix(OPEN) else {
        return Vec::new();
    };
    let (inner, partial) = match inner.find(CLOSE) {
        Some(end) => (&inner[..end], false),
        None if partial => (hold_back(inner, true, &[CLOSE]), true),
        // unterminated: malformed
        None => return Vec::new(),
    };
    tagged_calls(
        inner,
        "<atem:invoke name=\"",
        "</atem:invoke>",
        partial,
        |i, p| {
            let name_end = i.find("\">")?;
            let tags = ParamTags {
                open: "<atem:parameter name=\"",
                name_end: "\">",
                close: "</atem:parameter>",
                trim_newlines: false,
            };
            let args = xml_params(&i[name_end + 2..], &tags, p)?;
            Some(ToolCall {
                id: String::new(),
                name: i[..name_end].to_string(),
                arguments: object_text(args, p),
            })
        },
    )
}

/// The first of `markers` in `text`: (position, marker).
fn first_of<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|p| (p, *m)))
        .min()
}

/// Kimi K3 (`text` starts with what the prompt opened): reasoning up to the end of the think
/// section (or the start of the response), then the response, then a tools section.
fn parse_kimi_k3(
    text: &str,
    reasoning: ReasoningFormat,
    parse_tools: bool,
    partial: bool,
) -> ParsedMessage {
    let mut msg = ParsedMessage::default();
    let mut rest = text.strip_prefix(K3_MSG_START).unwrap_or(text);
    rest = rest.strip_prefix(K3_THINK_START).unwrap_or(rest);
    let think_ends = [K3_THINK_END, K3_RESP_START];
    let Some((at, marker)) = first_of(rest, &think_ends) else {
        // cut short while thinking: the reasoning so far
        let body = hold_back(rest, partial, &think_ends);
        if reasoning.extracts() {
            msg.reasoning_content.push_str(body);
        } else {
            msg.content.push_str(body);
        }
        return msg;
    };
    if reasoning.extracts() {
        msg.reasoning_content.push_str(&rest[..at]);
    } else {
        msg.content.push_str(&rest[..at]);
    }
    rest = &rest[at..];
    if marker == K3_THINK_END {
        rest = &rest[K3_THINK_END.len()..];
    }
    if partial && K3_RESP_START.starts_with(rest) {
        return msg;
    }
    rest = rest.strip_prefix(K3_RESP_START).unwrap_or(rest);
    let response_ends = [K3_RESP_END, K3_TOOLS_START, K3_MSG_END];
    let Some((at, _)) = first_of(rest, &response_ends) else {
        msg.content
            .push_str(hold_back(rest, partial, &response_ends));
        return msg;
    };
    msg.content.push_str(&rest[..at]);
    rest = &rest[at..];
    rest = rest.strip_prefix(K3_RESP_END).unwrap_or(rest);
    if parse_tools && rest.starts_with(K3_TOOLS_START) {
        msg.tool_calls =
            tagged_sections(rest, K3_TOOLS_START, K3_TOOLS_END, partial, |section, p| {
                tagged_calls(
                    section,
                    "<|open|>call tool=\"",
                    "<|close|>call<|sep|>",
                    p,
                    kimi_k3_call,
                )
            });
    }
    msg
}

/// Kimi K3: `NAME" index="N"<|sep|>` then `<|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>`s;
/// string-typed values are kept as text, others typed as JSON.
fn kimi_k3_call(inner: &str, partial: bool) -> Option<ToolCall> {
    const ARG_OPEN: &str = "<|open|>argument key=\"";
    const ARG_CLOSE: &str = "<|close|>argument<|sep|>";
    let name_end = inner.find('"')?;
    let name = &inner[..name_end];
    let sep = inner.find("<|sep|>")?;
    if name.is_empty() || sep < name_end {
        return None;
    }
    let mut args = serde_json::Map::new();
    let mut rest = &inner[sep + "<|sep|>".len()..];
    while let Some(tail) = rest.strip_prefix(ARG_OPEN) {
        let (Some(head_end), Some(end)) = (tail.find("<|sep|>"), tail.find(ARG_CLOSE)) else {
            if partial {
                break;
            }
            return None;
        };
        if head_end > end {
            return None;
        }
        let head = &tail[..head_end];
        let key = &head[..head.find('"')?];
        let value = &tail[head_end + "<|sep|>".len()..end];
        let value = if head.contains("type=\"string\"") || !head.contains("type=\"") {
            Json::String(value.to_string())
        } else {
            typed_value(value)
        };
        args.insert(key.to_string(), value);
        rest = &tail[end + ARG_CLOSE.len()..];
    }
    if !partial && !rest.trim_matches(is_ws).is_empty() {
        return None;
    }
    Some(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments: object_text(args, partial),
    })
}

/// Gemma 4: messages of an optional `<|channel>thought` block and content; with tools the text
/// up to the first `<|tool_call>call:NAME{...}<tool_call|>` and the calls; a stray `<channel|>`
/// ends the content.
fn parse_gemma4(
    text: &str,
    reasoning: ReasoningFormat,
    parse_tools: bool,
    partial: bool,
) -> ParsedMessage {
    const THOUGHT: &str = "<|channel>thought";
    const CHANNEL: &str = "<|channel>";
    const CHANNEL_END: &str = "<channel|>";
    const CALL: &str = "<|tool_call>call:";
    const CALL_END: &str = "<tool_call|>";
    let mut msg = ParsedMessage::default();
    let mut rest = text.strip_prefix("<|turn>model\n").unwrap_or(text);
    let content_ends: &[&str] = if parse_tools {
        &[CHANNEL, CHANNEL_END, "<|tool_call>"]
    } else {
        &[CHANNEL, CHANNEL_END]
    };
    loop {
        if rest.starts_with(CHANNEL) {
            // empty channels before the thought are skipped
            while rest.starts_with(CHANNEL) && !rest.starts_with(THOUGHT) {
                if partial && THOUGHT.starts_with(rest) {
                    return msg;
                }
                rest = &rest[CHANNEL.len()..];
            }
            let Some(after) = rest.strip_prefix(THOUGHT) else {
                if partial && THOUGHT.starts_with(rest) {
                    return msg;
                }
                continue;
            };
            let body = after.trim_start_matches(is_ws);
            let (thought, next) = match body.find(CHANNEL_END) {
                Some(end) => (&body[..end], Some(&body[end + CHANNEL_END.len()..])),
                None => (hold_back(body, partial, &[CHANNEL_END]), None),
            };
            if reasoning.extracts() {
                msg.reasoning_content.push_str(thought);
            } else {
                let raw = &rest[..rest.len() - body.len()];
                msg.content.push_str(raw);
                msg.content.push_str(thought);
                if next.is_some() {
                    msg.content.push_str(CHANNEL_END);
                }
            }
            match next {
                Some(next) => rest = next,
                None => return msg,
            }
        } else if partial && !rest.is_empty() && THOUGHT.starts_with(rest) {
            return msg;
        }
        match first_of(rest, content_ends) {
            Some((at, marker)) => {
                msg.content.push_str(&rest[..at]);
                rest = &rest[at..];
                if marker == CHANNEL {
                    continue;
                }
                break;
            }
            None => {
                msg.content.push_str(hold_back(rest, partial, content_ends));
                return msg;
            }
        }
    }
    if !parse_tools {
        return msg;
    }
    // with tools, the text up to the first call is skipped
    let Some(at) = rest.find("<|tool_call>") else {
        return msg;
    };
    msg.tool_calls = tagged_calls(&rest[at..], CALL, CALL_END, partial, gemma4_call);
    msg
}

/// Gemma 4: `NAME{key:VALUE,...}`; while streaming a call shows once its name is written and
/// gets its arguments when complete.
fn gemma4_call(inner: &str, partial: bool) -> Option<ToolCall> {
    let brace = inner.find('{')?;
    let name = &inner[..brace];
    if name.is_empty() || name.chars().any(|c| is_ws(c) || matches!(c, '<' | '>')) {
        return None;
    }
    let arguments = match gemma4_value(&inner[brace..]) {
        Some((json, used)) if inner[brace + used..].trim_matches(is_ws).is_empty() => json,
        None if partial => String::new(),
        _ => return None,
    };
    Some(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments,
    })
}

/// A Gemma 4 value at the start of `text` as JSON text (numbers kept as written), and the bytes
/// it took; None when unfinished or malformed.
fn gemma4_value(text: &str) -> Option<(String, usize)> {
    const QUOTE: &str = "<|\"|>";
    let skip_ws =
        |s: &str, at: usize| at + (s[at..].len() - s[at..].trim_start_matches(is_ws).len());
    if let Some(body) = text.strip_prefix(QUOTE) {
        let end = body.find(QUOTE)?;
        let json = serde_json::to_string(&body[..end]).ok()?;
        return Some((json, QUOTE.len() + end + QUOTE.len()));
    }
    let first = text.chars().next()?;
    if first == '{' || first == '[' {
        let close = if first == '{' { '}' } else { ']' };
        let mut out = String::from(first);
        let mut at = skip_ws(text, 1);
        if text[at..].starts_with(close) {
            out.push(close);
            return Some((out, at + 1));
        }
        loop {
            if first == '{' {
                let key_len = text[at..].find([':', '}'])?;
                if !text[at + key_len..].starts_with(':') || key_len == 0 {
                    return None;
                }
                out.push_str(&serde_json::to_string(&text[at..at + key_len]).ok()?);
                out.push(':');
                at = skip_ws(text, at + key_len + 1);
            }
            let (value, used) = gemma4_value(&text[at..])?;
            out.push_str(&value);
            at = skip_ws(text, at + used);
            match text[at..].chars().next()? {
                ',' => {
                    out.push(',');
                    at = skip_ws(text, at + 1);
                }
                c if c == close => {
                    out.push(close);
                    return Some((out, at + 1));
                }
                _ => return None,
            }
        }
    }
    let end = text.find(|c: char| is_ws(c) || matches!(c, ',' | '}' | ']'))?;
    let word = &text[..end];
    serde_json::from_str::<Json>(word)
        .ok()
        .filter(|v| !v.is_string() && !v.is_object() && !v.is_array())?;
    Some((word.to_string(), end))
}

/// MiniCPM 5: `NAME">` then `<param name="K">V</param>`s; a value in `<![CDATA[...]]>` is the
/// text inside, others are typed as JSON when they parse.
fn minicpm5_call(inner: &str, partial: bool) -> Option<ToolCall> {
    const OPEN: &str = "<param name=\"";
    const CLOSE: &str = "</param>";
    const CDATA: &str = "<![CDATA[";
    let name_end = inner.find("\">")?;
    let name = &inner[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut args = serde_json::Map::new();
    let mut rest = &inner[name_end + 2..];
    loop {
        let trimmed = rest.trim_start_matches(is_ws);
        let Some(tail) = trimmed.strip_prefix(OPEN) else {
            if !partial && !trimmed.is_empty() {
                return None;
            }
            break;
        };
        let Some(key_end) = tail.find("\">") else {
            if partial {
                break;
            }
            return None;
        };
        let key = &tail[..key_end];
        let value_text = &tail[key_end + 2..];
        let parsed = match value_text.strip_prefix(CDATA) {
            Some(data) => data.find("]]>").and_then(|end| {
                let after = data[end + 3..].strip_prefix(CLOSE)?;
                Some((Json::String(data[..end].to_string()), after))
            }),
            None => value_text.find(CLOSE).map(|end| {
                (
                    typed_value(&value_text[..end]),
                    &value_text[end + CLOSE.len()..],
                )
            }),
        };
        let Some((value, after)) = parsed else {
            if partial {
                break;
            }
            return None;
        };
        args.insert(key.to_string(), value);
        rest = after;
    }
    Some(ToolCall {
        id: String::new(),
        name: name.to_string(),
        arguments: object_text(args, partial),
    })
}

/// LLM-jp Harmony: the prompt ends with `<|start|>assistant`; messages are
/// `[ to=functions.NAME]<|channel|> CHANNEL[ to=functions.NAME][ <|constrain|> TYPE]<|message|> TEXT`
/// separated by `<|end|><|start|> assistant`, one space after `<|message|>` not being part of
/// the text. `analysis` is reasoning, `commentary` and `final` content, a recipient a tool call.
fn parse_llm_jp_harmony(
    text: &str,
    reasoning: ReasoningFormat,
    parse_tools: bool,
    partial: bool,
) -> ParsedMessage {
    const MARKERS: [&str; 2] = ["<|end|>", "<|start|>"];
    let mut msg = ParsedMessage::default();
    let segments: Vec<&str> = text.split("<|start|>").collect();
    let count = segments.len();
    for (i, segment) in segments.into_iter().enumerate() {
        let last = i + 1 == count;
        let segment = if i == 0 {
            segment
        } else {
            match segment.trim_start_matches(' ').strip_prefix("assistant") {
                Some(rest) => rest,
                None => break,
            }
        };
        let Some((header, body_all)) = segment.split_once("<|message|>") else {
            // a header still being written (finished: nothing usable)
            break;
        };
        let body_all = body_all.strip_prefix(' ').unwrap_or(body_all);
        let (body, closed) = match body_all.find("<|end|>") {
            Some(end) => (&body_all[..end], true),
            None if last => (hold_back(body_all, partial, &MARKERS), !partial),
            None => (body_all, true),
        };
        let recipient = header
            .split(|c: char| is_ws(c) || c == '<')
            .find_map(|w| w.strip_prefix("to=functions."));
        let channel = header
            .split_once("<|channel|>")
            .map(|(_, c)| c.trim_start_matches(' '))
            .unwrap_or("");
        match recipient {
            Some(name) if parse_tools => {
                let args = body.trim_matches(is_ws);
                let arguments = if closed {
                    json_prefix(args, false).filter(|a| a.len() == args.len())
                } else {
                    Some(args.to_string())
                };
                if let (Some(arguments), false) = (arguments, name.is_empty()) {
                    msg.tool_calls.push(ToolCall {
                        id: String::new(),
                        name: name.to_string(),
                        arguments,
                    });
                }
            }
            Some(_) => {}
            None if channel.starts_with("analysis") => {
                if reasoning.extracts() {
                    msg.reasoning_content.push_str(body);
                } else {
                    // upstream keeps the whole analysis message as content
                    let raw_end = segment.len() - body_all.len() + body.len();
                    msg.content.push_str(&segment[..raw_end]);
                    if body.len() < body_all.len() {
                        msg.content.push_str("<|end|>");
                    }
                }
            }
            None => msg.content.push_str(body),
        }
    }
    msg
}

/// Ling 3 after the thinking: content, GLM-style calls, then any text after the last call as
/// more content; an end-of-turn token written out as text ends the message.
fn parse_ling3_rest(
    rest: &str,
    mut msg: ParsedMessage,
    parse_tools: bool,
    partial: bool,
) -> ParsedMessage {
    const ROLE_END: &str = "<|role_end|>";
    let rest = match rest.find(ROLE_END) {
        Some(end) => &rest[..end],
        None => hold_back(rest, partial, &[ROLE_END]),
    };
    if !parse_tools {
        msg.content.push_str(rest);
        return msg;
    }
    let (content, calls) = parse_tool_calls(ToolSyntax::Ling3, rest, partial);
    msg.content.push_str(content);
    if !calls.is_empty() {
        if let Some(last) = rest.rfind("</tool_call>") {
            let after = &rest[last + "</tool_call>".len()..];
            // a further call after the trailing text is not read (upstream: text ends the calls)
            if !after.contains("<tool_call>") {
                let after = hold_back(after, partial, &["<tool_call>"]);
                let after = if partial {
                    after.trim_end_matches(is_ws)
                } else {
                    after
                };
                msg.content.push_str(after);
            }
        }
    }
    msg.tool_calls = calls;
    msg
}
