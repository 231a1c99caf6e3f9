//! What a template can do (system role, typed content, tool calls, object arguments, ...),
//! found the way upstream finds it: by rendering small probe conversations and looking at what
//! the template did with them. Upstream watches which input values the template touched; we
//! look for marker strings in the output, which gives the same answers for the templates in
//! use and needs no instrumented engine.

use serde_json::{json, Value as Json};

/// Capabilities of one template, named as upstream reports them in `/props`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub supports_string_content: bool,
    pub supports_typed_content: bool,
    pub supports_system_role: bool,
    pub supports_tools: bool,
    pub supports_tool_calls: bool,
    pub supports_parallel_tool_calls: bool,
    pub supports_object_arguments: bool,
    pub supports_preserve_reasoning: bool,
    /// Whether upstream would turn `enable_thinking` on for this template (its parser found
    /// reasoning markers); not one of upstream's `/props` caps, but decided at load like them.
    pub supports_thinking: bool,
}

const STRING_MARKER: &str = "STRING_MARKER";
const TYPED_MARKER: &str = "TYPED_MARKER";
const SYSTEM_MARKER: &str = "SYSTEM_MARKER";
const TOOL_MARKER: &str = "TOOL_NAME_MARKER";
const CALL_MARKER: &str = "CALL_NAME_MARKER";
const ARG_MARKER: &str = "ARG_VALUE_MARKER";
const SECOND_CALL_MARKER: &str = "SECOND_CALL_MARKER";
const REASONING_MARKER: &str = "<REASONING_CONTENT_PLACEHOLDER>";

/// Probes a template through `render(context) -> Ok(output) | Err`.
pub(crate) fn detect(render: impl Fn(&Json) -> Option<String>) -> Caps {
    let probe = |messages: Json, tools: Option<Json>, extra: Json| {
        let mut ctx = json!({
            "messages": messages,
            "tools": tools.unwrap_or_else(|| json!([])),
            "bos_token": "",
            "eos_token": "",
            "add_generation_prompt": true,
        });
        if let (Some(ctx), Some(extra)) = (ctx.as_object_mut(), extra.as_object()) {
            ctx.extend(extra.clone());
        }
        render(&ctx)
    };
    let user = |text: &str| json!({"role": "user", "content": text});

    let as_string = probe(json!([user(STRING_MARKER)]), None, json!({}));
    let typed_parts =
        json!([{"role": "user", "content": [{"type": "text", "text": TYPED_MARKER}]}]);
    let as_typed = probe(typed_parts, None, json!({}));
    // a template that only prints `content` shows a list's Python form, which still holds the
    // marker, so a typed success must show the text without its surrounding dict
    let typed_ok = as_typed.as_deref().is_some_and(|out| {
        out.contains(TYPED_MARKER)
            && !out.contains(&format!("'{TYPED_MARKER}'"))
            && !out.contains(&format!("\"{TYPED_MARKER}\""))
    });
    // upstream, seeing a template that also accepts strings, confirms typed content with an
    // empty list, which some templates refuse
    let typed_ok = typed_ok
        && (as_string.is_none()
            || probe(json!([{"role": "user", "content": []}]), None, json!({})).is_some());
    let string_ok = match &as_string {
        None => false,
        Some(out) => out.contains(STRING_MARKER) || !typed_ok,
    };

    let system = probe(
        json!([{"role": "system", "content": SYSTEM_MARKER}, user("User message")]),
        None,
        json!({}),
    );
    let supports_system_role = system
        .as_deref()
        .is_some_and(|out| out.contains(SYSTEM_MARKER));

    let tools = json!([{
        "name": "tool",
        "type": "function",
        "function": {
            "name": TOOL_MARKER,
            "description": "Tool description",
            "parameters": {
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "Arg description"}},
                "required": ["arg"],
            },
        },
    }]);
    let call = |name: &str, args: Json, id: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
    let tool_conversation = |calls: Json| {
        json!([
            user("User message"),
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            user("User message"),
        ])
    };

    let object_args = probe(
        tool_conversation(json!([call(
            CALL_MARKER,
            json!({"arg": ARG_MARKER}),
            "call00001"
        )])),
        Some(tools.clone()),
        json!({}),
    );
    let mut supports_tools = true;
    let mut supports_tool_calls = true;
    let mut supports_object_arguments = false;
    if let Some(out) = &object_args {
        supports_tools = out.contains(TOOL_MARKER);
        supports_tool_calls = out.contains(CALL_MARKER);
        // upstream counts the arguments as read as an object when the template read a member;
        // the object printed whole (or joined to a string) in Python form does not count
        let printed_whole = format!("{{'arg': '{ARG_MARKER}'}}");
        supports_object_arguments =
            supports_tool_calls && out.replace(&printed_whole, "").contains(ARG_MARKER);
    }
    if !supports_object_arguments {
        let string_args = format!("{{\"arg\": \"{ARG_MARKER}\"}}");
        let out = probe(
            tool_conversation(json!([call(CALL_MARKER, json!(string_args), "call00001")])),
            Some(tools.clone()),
            json!({}),
        );
        match out {
            None => {
                supports_tools = false;
                supports_tool_calls = false;
            }
            Some(out) => {
                supports_tools = out.contains(TOOL_MARKER);
                supports_tool_calls = out.contains(CALL_MARKER);
            }
        }
    }

    let args = if supports_object_arguments {
        json!({"arg": "value"})
    } else {
        json!("{\"arg\": \"value\"}")
    };
    let parallel = probe(
        tool_conversation(json!([
            call(CALL_MARKER, args.clone(), "call00001"),
            call(SECOND_CALL_MARKER, args, "call00002"),
        ])),
        Some(tools),
        json!({}),
    );
    let supports_parallel_tool_calls = parallel
        .as_deref()
        .is_some_and(|out| out.contains(SECOND_CALL_MARKER));

    let reasoning = probe(
        json!([
            user("User message"),
            {"role": "assistant", "content": "Assistant message", "reasoning_content": REASONING_MARKER},
            user("User message"),
            {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
            user("User message"),
        ]),
        None,
        json!({
            "enable_thinking": true,
            "preserve_thinking": true,
            "clear_thinking": false,
            "truncate_history_thinking": false,
            "drop_thinking": false,
        }),
    );
    let supports_preserve_reasoning = reasoning
        .as_deref()
        .is_some_and(|out| out.contains(REASONING_MARKER));

    let supports_thinking = detect_thinking(&probe);

    Caps {
        supports_thinking,
        supports_string_content: string_ok,
        supports_typed_content: typed_ok,
        supports_system_role,
        supports_tools,
        supports_tool_calls,
        supports_parallel_tool_calls,
        supports_object_arguments,
        supports_preserve_reasoning,
    }
}

const THINKING_MARKER: &str = "THINKING_CONTENT_MARKER";

/// Upstream's reasoning detection, reduced to its two main signals: reasoning content printed
/// and followed by a closing tag, or `enable_thinking` adding or removing tags at the end of
/// the generation prompt.
fn detect_thinking(probe: &dyn Fn(Json, Option<Json>, Json) -> Option<String>) -> bool {
    let user = json!({"role": "user", "content": "USER_MESSAGE_MARKER"});
    let with_reasoning = probe(
        json!([user, {"role": "assistant", "content": "ASSISTANT_MESSAGE_MARKER", "reasoning_content": THINKING_MARKER}]),
        None,
        json!({"add_generation_prompt": false, "enable_thinking": true}),
    );
    if let Some(out) = with_reasoning {
        if let Some(pos) = out.find(THINKING_MARKER) {
            let after = out[pos + THINKING_MARKER.len()..].trim_start();
            if after.starts_with('<') || after.starts_with('[') {
                return true;
            }
        }
    }
    let off = probe(json!([user]), None, json!({"enable_thinking": false}));
    let on = probe(json!([user]), None, json!({"enable_thinking": true}));
    let (Some(off), Some(on)) = (off, on) else {
        return false;
    };
    if off == on {
        return false;
    }
    let prefix = off
        .bytes()
        .zip(on.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let (off_rest, on_rest) = (&off.as_bytes()[prefix..], &on.as_bytes()[prefix..]);
    let suffix = off_rest
        .iter()
        .rev()
        .zip(on_rest.iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let off_diff = String::from_utf8_lossy(&off_rest[..off_rest.len() - suffix])
        .trim()
        .to_string();
    let on_diff = String::from_utf8_lossy(&on_rest[..on_rest.len() - suffix])
        .trim()
        .to_string();
    let is_markers = |s: &str| !s.is_empty() && only_markers(s);
    match (off_diff.is_empty(), on_diff.is_empty()) {
        (true, false) => on.ends_with(&on_diff) && is_markers(&on_diff),
        (false, true) => off.ends_with(&off_diff) && is_markers(&off_diff),
        _ => {
            // one output ends with the other's tail plus an opening and closing tag
            [(&on, &off), (&off, &on)].iter().any(|(base, extended)| {
                let anchor = &base[base.len().saturating_sub(64)..];
                extended
                    .rfind(anchor)
                    .map(|p| extended[p + anchor.len()..].trim())
                    .is_some_and(|extra| {
                        !extra.is_empty() && only_markers(extra) && marker_count(extra) == 2
                    })
            })
        }
    }
}

/// True when `s` is made only of `<...>` / `[...]` tags and whitespace.
fn only_markers(s: &str) -> bool {
    let mut rest = s.trim();
    while !rest.is_empty() {
        let close = match rest.chars().next() {
            Some('<') => '>',
            Some('[') => ']',
            _ => return false,
        };
        match rest.find(close) {
            Some(end) => rest = rest[end + 1..].trim_start(),
            None => return false,
        }
    }
    true
}

fn marker_count(s: &str) -> usize {
    s.chars().filter(|c| *c == '<' || *c == '[').count()
}

/// The tags (with their surrounding whitespace) the template wraps earlier reasoning in, as
/// upstream's parser generator finds them: the tag before the reasoning text with the
/// whitespace after it, and the tag after it with the whitespace on both sides.
pub(crate) fn reasoning_wrapping(
    render: impl Fn(&Json) -> Option<String>,
) -> Option<(String, String)> {
    let ctx = json!({
        "messages": [
            {"role": "user", "content": "USER_MESSAGE_MARKER"},
            {"role": "assistant", "content": "ASSISTANT_MESSAGE_MARKER", "reasoning_content": THINKING_MARKER},
        ],
        "bos_token": "",
        "eos_token": "",
        "enable_thinking": true,
    });
    let out = render(&ctx)?;
    let pos = out.find(THINKING_MARKER)?;
    let before = &out[..pos];
    let after = &out[pos + THINKING_MARKER.len()..];
    let pre_ws = before.len() - before.trim_end_matches(is_space).len();
    let tag_end = before.len() - pre_ws;
    let tag_start = before[..tag_end].rfind(['<', '['])?;
    let start = before[tag_start..].to_string();
    if !only_markers(&before[tag_start..tag_end]) {
        return None;
    }
    let lead = after.len() - after.trim_start_matches(is_space).len();
    let rest = &after[lead..];
    let close = match rest.chars().next()? {
        '<' => '>',
        '[' => ']',
        _ => return None,
    };
    let tag_len = rest.find(close)? + 1;
    let tail = &rest[tag_len..];
    let trail = tail.len() - tail.trim_start_matches(is_space).len();
    Some((start, after[..lead + tag_len + trail].to_string()))
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\n' | '\r' | '\t')
}
