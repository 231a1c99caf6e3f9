//! The markers a chat template starts user and assistant messages with, found as upstream's
//! template analysis finds them: render the template with and without one message and take
//! what the message added before its text. The server passes them on as `message_delimiters`;
//! where user messages start, upstream ends a prompt batch (`server::checkpoints`).

use serde_json::{json, Value};

const USER_MSG: &str = "U_USER_MSG Hello END_U";
const USER_MSG_TWO: &str = "V_USER_MSG Hello END_V";
const ASSISTANT_MSG: &str = "A_ASST_MSG I can help END_A";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Text,
    Marker,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Segment {
    kind: Kind,
    value: String,
}

/// Splits text into markers (`<...>`, `[...]`) and the text between them.
fn segments(text: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut opener: Option<u8> = None;
    let mut border = 0;
    for (i, &c) in bytes.iter().enumerate() {
        match opener {
            None if c == b'<' || c == b'[' => {
                if border < i {
                    out.push(Segment {
                        kind: Kind::Text,
                        value: text[border..i].to_string(),
                    });
                }
                border = i;
                opener = Some(c);
            }
            Some(o) if (o == b'<' && c == b'>') || (o == b'[' && c == b']') => {
                out.push(Segment {
                    kind: Kind::Marker,
                    value: text[border..=i].to_string(),
                });
                border = i + 1;
                opener = None;
            }
            _ => {}
        }
    }
    if border < text.len() {
        out.push(Segment {
            kind: Kind::Text,
            value: text[border..].to_string(),
        });
    }
    out
}

/// C's `isspace` in the C locale.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

fn trim(s: &str) -> &str {
    s.trim_matches(is_space)
}

fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn common_suffix_len(a: &[u8], b: &[u8]) -> usize {
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

/// What `right` has that `left` lacks, between their common prefix and suffix, compared
/// marker by marker first and then character by character within text.
fn diff_right(left: &str, right: &str) -> String {
    let ls = segments(left);
    let rs = segments(right);
    if ls.is_empty() {
        return right.to_string();
    }
    if rs.is_empty() {
        return String::new();
    }
    // inclusive ends, as upstream walks them
    let (mut l0, mut l1) = (0usize, ls.len() - 1);
    let (mut r0, mut r1) = (0usize, rs.len() - 1);
    let (mut left_done, mut right_done) = (false, false);
    while l0 != l1 && r0 != r1 {
        let mut advanced = false;
        if ls[l0] == rs[r0] {
            l0 += 1;
            r0 += 1;
            advanced = true;
        }
        if ls[l1] == rs[r1] {
            if l0 != l1 {
                l1 -= 1;
            } else {
                left_done = true;
            }
            if r0 != r1 {
                r1 -= 1;
            } else {
                right_done = true;
            }
            advanced = true;
        }
        if !advanced {
            break;
        }
    }
    if l0 == l1 && r0 != r1 {
        if ls[l0] == rs[r1] {
            r1 -= 1;
            left_done = true;
        } else if ls[l0] == rs[r0] {
            r0 += 1;
            left_done = true;
        }
    } else if r0 == r1 && l0 != l1 {
        if ls[l1] == rs[r0] {
            l1 -= 1;
            right_done = true;
        } else if ls[l0] == rs[r0] {
            l0 += 1;
            right_done = true;
        }
    } else if l0 == l1 && r0 == r1 && ls[l0] == rs[r0] && ls[l0].kind == Kind::Marker {
        left_done = true;
        right_done = true;
    }
    let text_suffix = ls[l1].kind == Kind::Text && rs[r1].kind == Kind::Text;
    let text_prefix = rs[r0].kind == Kind::Text && ls[l0].kind == Kind::Text;
    let join = |s: &[Segment], a: usize, b: usize, done: bool| -> String {
        let end = if done { b } else { b + 1 };
        s[a..end.max(a)].iter().map(|g| g.value.as_str()).collect()
    };
    let rem_l = join(&ls, l0, l1, left_done);
    let rem_r = join(&rs, r0, r1, right_done);
    let suffix = if text_suffix {
        common_suffix_len(rem_l.as_bytes(), rem_r.as_bytes())
    } else {
        0
    };
    let prefix = if text_prefix {
        common_prefix_len(
            &rem_l.as_bytes()[..rem_l.len() - suffix],
            &rem_r.as_bytes()[..rem_r.len() - suffix],
        )
    } else {
        0
    };
    let lpart = &rem_l.as_bytes()[prefix..rem_l.len() - suffix];
    let rpart =
        String::from_utf8_lossy(&rem_r.as_bytes()[prefix..rem_r.len() - suffix]).into_owned();
    // left adds nothing and is where right starts: right's own part is all after it
    if lpart.is_empty() && !rpart.is_empty() && right.starts_with(left) {
        return right[left.len()..].to_string();
    }
    rpart
}

/// The text before `needle` in `hay` (all of it when absent).
fn before<'a>(hay: &'a str, needle: &str) -> &'a str {
    hay.find(needle).map_or(hay, |i| &hay[..i])
}

/// The message delimiters upstream passes on for a Jinja template with source `src`: none for
/// the families it handles with dedicated code (its template analysis never runs for them),
/// else what [`message_delimiters`] finds.
pub fn template_delimiters(
    src: &str,
    render: impl Fn(&Value) -> Option<String>,
    thinking: Option<(&str, &str)>,
) -> Vec<(String, String)> {
    if super::template::specialised_family(src).is_some() {
        return Vec::new();
    }
    message_delimiters(render, thinking)
}

/// Finds the assistant and user message starts of a template, given a renderer of a message
/// list (no generation prompt, thinking on) that gives `None` when the template fails, and the
/// template's thinking tags. Gives (role, marker) pairs, assistant first, empty ones left out.
pub fn message_delimiters(
    render: impl Fn(&Value) -> Option<String>,
    thinking: Option<(&str, &str)>,
) -> Vec<(String, String)> {
    let user = json!({"role": "user", "content": USER_MSG});
    let assistant = json!({"role": "assistant", "content": ASSISTANT_MSG});
    let mut out = Vec::new();
    // assistant: what an assistant reply adds after a user message, up to its text
    if let (Some(a), Some(b)) = (render(&json!([user])), render(&json!([user, assistant]))) {
        let right = diff_right(&a, &b);
        let mut prefix = before(&right, ASSISTANT_MSG);
        if let Some((start, end)) = thinking {
            for tag in [trim(start), trim(end)] {
                if !tag.is_empty() {
                    prefix = before(prefix, tag);
                }
            }
        }
        let marker = trim(prefix);
        if !marker.is_empty() {
            out.push(("assistant".to_string(), marker.to_string()));
        }
    }
    // user: what a first user message adds (or a second one, for templates that refuse an
    // empty conversation), up to its text, leading end markers and blank text dropped
    let two = json!({"role": "user", "content": USER_MSG_TWO});
    let pair = render(&json!([]))
        .zip(render(&json!([user])))
        .or_else(|| render(&json!([two, assistant])).zip(render(&json!([two, assistant, user]))));
    if let Some((a, b)) = pair {
        let mut right = diff_right(&a, &b);
        if let Some(i) = right.find(ASSISTANT_MSG) {
            right = right[i + ASSISTANT_MSG.len()..].to_string();
        }
        let candidate = before(&right, USER_MSG);
        let mut marker = String::new();
        let mut seen_marker = false;
        for seg in segments(candidate) {
            let lower = seg.value.to_ascii_lowercase();
            if seg.kind == Kind::Marker
                && !seen_marker
                && (lower.contains("end") || lower.contains("close"))
            {
                continue;
            }
            if seg.kind == Kind::Text && !seen_marker && trim(&seg.value).is_empty() {
                continue;
            }
            seen_marker |= seg.kind == Kind::Marker;
            marker.push_str(&seg.value);
        }
        let marker = trim(&marker);
        if !marker.is_empty() {
            out.push(("user".to_string(), marker.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy renderer for a ChatML-like and a Gemma-like layout.
    fn chatml(msgs: &Value) -> Option<String> {
        let mut s = String::new();
        for m in msgs.as_array()? {
            s += &format!(
                "<|im_start|>{}\n{}<|im_end|>\n",
                m["role"].as_str()?,
                m["content"].as_str()?
            );
        }
        Some(s)
    }

    fn gemma(msgs: &Value) -> Option<String> {
        let mut s = "<bos>".to_string();
        for m in msgs.as_array()? {
            let role = match m["role"].as_str()? {
                "assistant" => "model",
                r => r,
            };
            s += &format!(
                "<start_of_turn>{role}\n{}<end_of_turn>\n",
                m["content"].as_str()?
            );
        }
        Some(s)
    }

    #[test]
    fn finds_chatml_and_gemma_markers() {
        assert_eq!(
            message_delimiters(chatml, None),
            [
                ("assistant".to_string(), "<|im_start|>assistant".to_string()),
                ("user".to_string(), "<|im_start|>user".to_string())
            ]
        );
        assert_eq!(
            message_delimiters(gemma, None),
            [
                ("assistant".to_string(), "<start_of_turn>model".to_string()),
                ("user".to_string(), "<start_of_turn>user".to_string())
            ]
        );
    }

    #[test]
    fn a_template_refusing_empty_conversations_is_read_from_a_second_user_message() {
        let strict = |m: &Value| {
            if m.as_array()?.is_empty() {
                None
            } else {
                chatml(m)
            }
        };
        let d = message_delimiters(strict, None);
        assert_eq!(d[1], ("user".to_string(), "<|im_start|>user".to_string()));
    }

    #[test]
    fn segments_split_markers_from_text() {
        let s = segments("a<b>c[d]<e");
        let vals: Vec<&str> = s.iter().map(|g| g.value.as_str()).collect();
        assert_eq!(vals, ["a", "<b>", "c", "[d]", "<e"]);
        assert_eq!(s[4].kind, Kind::Text, "an unclosed marker is text");
    }

    #[test]
    fn diff_takes_what_right_adds() {
        assert_eq!(diff_right("<bos>", "<bos><x>hi"), "<x>hi");
        assert_eq!(diff_right("<a>one<z>", "<a>one two<z>"), " two");
    }
}
