//! Upstream's `+`, which is not Jinja2's: next to a string it concatenates, and a missing or
//! `none` operand beside a string counts as "" (`'Today is ' + datetime` with no `datetime`,
//! `'): ' + param.description` with no description), where minijinja refuses the operation.
//! Templates rely on it (firefunction-v2, Command R+ with tools), so before compiling a template
//! every `+` chain that has a string literal among its operands becomes a call of
//! [`PLUS_FN`], which adds left to right as upstream does. Chains without a string literal, and
//! chains that also subtract, are left to minijinja. The template's text as served (`/props`)
//! is not rewritten.
//!
//! Operands are found by precedence as Jinja parses them: `~`, `*`, `/`, filters, tests,
//! attribute and call suffixes bind tighter than `+` and stay inside an operand; keywords,
//! comparisons, `,`, `:` and `=` end the chain; brackets nest.

use minijinja::value::{Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The function a rewritten chain calls (a name no template uses).
pub(crate) const PLUS_FN: &str = "__bloomery_plus";

/// `a + b + ...`, left to right, with upstream's rules for each `+`.
pub(crate) fn plus(args: Rest<Value>) -> Result<Value, Error> {
    let mut it = args.0.into_iter();
    let mut acc = it.next().unwrap_or(Value::UNDEFINED);
    for b in it {
        acc = add(&acc, &b)?;
    }
    Ok(acc)
}

fn add(a: &Value, b: &Value) -> Result<Value, Error> {
    let null = |v: &Value| v.is_undefined() || v.is_none();
    let string = |v: &Value| v.kind() == ValueKind::String;
    if null(a) || null(b) {
        if (null(a) && string(b)) || (null(b) && string(a)) {
            let side = |v: &Value| {
                if null(v) {
                    String::new()
                } else {
                    super::jinja::to_text(v)
                }
            };
            return Ok(Value::from(side(a) + &side(b)));
        }
        let what = if a.is_undefined() || b.is_undefined() {
            "Cannot perform operation + on undefined values"
        } else {
            "Cannot perform operation on null values"
        };
        return Err(Error::new(ErrorKind::InvalidOperation, what));
    }
    if a.is_number() && b.is_number() {
        if let (true, true, Some(x), Some(y)) =
            (a.is_integer(), b.is_integer(), a.as_i64(), b.as_i64())
        {
            return Ok(Value::from(x.wrapping_add(y)));
        }
        let f = |v: &Value| f64::try_from(v.clone()).unwrap_or(f64::NAN);
        return Ok(Value::from(f(a) + f(b)));
    }
    let seq = |v: &Value| matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable);
    if seq(a) && seq(b) {
        let mut items: Vec<Value> = a.try_iter()?.collect();
        items.extend(b.try_iter()?);
        return Ok(Value::from(items));
    }
    if string(a) || string(b) {
        return Ok(Value::from(
            super::jinja::to_text(a) + &super::jinja::to_text(b),
        ));
    }
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "unsupported operand types for +: {} and {}",
            a.kind(),
            b.kind()
        ),
    ))
}

/// `source` with every string `+` chain inside `{{ }}` and `{% %}` turned into a call of
/// [`PLUS_FN`]; text, comments and `raw` blocks untouched. A tag that does not tokenize
/// cleanly is left as it is (minijinja then reports whatever is wrong with it).
pub(crate) fn rewrite(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + source.len() / 8);
    let mut rest = source;
    while let Some(at) = rest.find('{') {
        let (text, tail) = rest.split_at(at);
        out.push_str(text);
        let close = match tail.get(..2) {
            Some("{{") => "}}",
            Some("{%") => "%}",
            Some("{#") => {
                let end = tail.find("#}").map_or(tail.len(), |e| e + 2);
                out.push_str(&tail[..end]);
                rest = &tail[end..];
                continue;
            }
            _ => {
                out.push('{');
                rest = &tail[1..];
                continue;
            }
        };
        let Some(end) = tag_end(&tail[2..], close) else {
            out.push_str(tail);
            return out;
        };
        let inner = &tail[2..2 + end];
        let whole = &tail[..2 + end + 2];
        rest = &tail[2 + end + 2..];
        if close == "%}" && is_raw(inner) {
            // everything up to the matching endraw is text
            let stop = find_endraw(rest).unwrap_or(rest.len());
            out.push_str(whole);
            out.push_str(&rest[..stop]);
            rest = &rest[stop..];
            continue;
        }
        out.push_str(&tail[..2]);
        out.push_str(&rewrite_tag(inner, close == "%}"));
        out.push_str(close);
    }
    out.push_str(rest);
    out
}

/// Where `close` ends the tag whose content starts `s`, outside string literals.
fn tag_end(s: &str, close: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => i = string_end(b, i, q)?,
            _ if s[i..].starts_with(close) => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The index after the string literal opening at `i` with quote `q`.
fn string_end(b: &[u8], i: usize, q: u8) -> Option<usize> {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            c if c == q => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

fn is_raw(inner: &str) -> bool {
    inner.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace()) == "raw"
}

fn find_endraw(s: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = s[from..].find("{%") {
        let start = from + at;
        let end = s[start + 2..].find("%}")?;
        if s[start + 2..start + 2 + end]
            .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace())
            == "endraw"
        {
            return Some(start);
        }
        from = start + 2;
    }
    None
}

/// One tag's content, its whitespace-control markers kept in place.
fn rewrite_tag(inner: &str, statement: bool) -> String {
    let lead = inner
        .bytes()
        .take(1)
        .filter(|c| matches!(c, b'-' | b'+'))
        .count();
    let trail = usize::from(inner.len() > lead && inner.ends_with('-'));
    let body = &inner[lead..inner.len() - trail];
    let rewritten = tokens(body)
        .and_then(|t| tree(&t))
        .map(|nodes| {
            // a statement's name (`set`, `for`, `include`, ...) is not part of an operand
            let head = nodes
                .iter()
                .position(|n| !matches!(n, Node::Tok(Tok::Space(_))))
                .filter(|_| statement);
            level(&nodes, head)
        })
        .unwrap_or_else(|| body.to_string());
    format!(
        "{}{rewritten}{}",
        &inner[..lead],
        &inner[inner.len() - trail..]
    )
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Str(String),
    Open(char),
    Close(char),
    Punct(String),
    Word(String),
    Space(String),
}

fn tokens(s: &str) -> Option<Vec<Tok>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let tok = match c {
            b'\'' | b'"' => {
                i = string_end(b, i, c)?;
                Tok::Str(s[start..i].to_string())
            }
            b'(' | b'[' | b'{' => {
                i += 1;
                Tok::Open(c as char)
            }
            b')' | b']' | b'}' => {
                i += 1;
                Tok::Close(c as char)
            }
            c if c.is_ascii_whitespace() => {
                while i < b.len() && b[i].is_ascii_whitespace() {
                    i += 1;
                }
                Tok::Space(s[start..i].to_string())
            }
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c >= 0x80 => {
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric()
                        || b[i] == b'_'
                        || b[i] == b'.'
                        || b[i] >= 0x80)
                {
                    i += 1;
                }
                Tok::Word(s[start..i].to_string())
            }
            _ => {
                let two = s.get(i..i + 2).unwrap_or("");
                i += if ["==", "!=", "<=", ">=", "//", "**"].contains(&two) {
                    2
                } else {
                    1
                };
                Tok::Punct(s[start..i].to_string())
            }
        };
        out.push(tok);
    }
    Some(out)
}

#[derive(Debug)]
enum Node {
    Tok(Tok),
    Group(char, Vec<Node>, char),
}

fn tree(toks: &[Tok]) -> Option<Vec<Node>> {
    fn walk(toks: &[Tok], i: &mut usize, closing: Option<char>) -> Option<Vec<Node>> {
        let mut nodes = Vec::new();
        while *i < toks.len() {
            let t = toks[*i].clone();
            *i += 1;
            match t {
                Tok::Open(o) => {
                    let want = match o {
                        '(' => ')',
                        '[' => ']',
                        _ => '}',
                    };
                    let inner = walk(toks, i, Some(want))?;
                    nodes.push(Node::Group(o, inner, want));
                }
                Tok::Close(c) => return (closing == Some(c)).then_some(nodes),
                t => nodes.push(Node::Tok(t)),
            }
        }
        closing.is_none().then_some(nodes)
    }
    walk(toks, &mut 0, None)
}

/// Words that end a chain wherever they stand (a statement's own name ends it too, see
/// [`rewrite_tag`]; other statement words can be variable names).
const KEYWORDS: &[&str] = &["and", "or", "not", "if", "else", "elif", "in"];
const SEPARATORS: &[&str] = &[",", ":", "=", "==", "!=", "<", ">", "<=", ">="];

fn is_separator(nodes: &[Node], i: usize) -> bool {
    match &nodes[i] {
        Node::Tok(Tok::Punct(p)) => SEPARATORS.contains(&p.as_str()),
        Node::Tok(Tok::Word(w)) if w == "not" => {
            // `is not` belongs to a test, which binds tighter than `+`
            let prev = nodes[..i]
                .iter()
                .rev()
                .find(|n| !matches!(n, Node::Tok(Tok::Space(_))));
            !matches!(prev, Some(Node::Tok(Tok::Word(p))) if p == "is")
        }
        Node::Tok(Tok::Word(w)) => KEYWORDS.contains(&w.as_str()),
        _ => false,
    }
}

/// The nodes of one bracket level, each chain between separators rewritten where it qualifies;
/// node `head`, if given, separates too.
fn level(nodes: &[Node], head: Option<usize>) -> String {
    let mut out = String::new();
    let mut start = 0;
    for i in 0..=nodes.len() {
        if i == nodes.len() || head == Some(i) || is_separator(nodes, i) {
            out.push_str(&chain(&nodes[start..i]));
            if i < nodes.len() {
                out.push_str(&text(&nodes[i..i + 1]));
            }
            start = i + 1;
        }
    }
    out
}

fn chain(seg: &[Node]) -> String {
    let punct = |n: &Node, p: &str| matches!(n, Node::Tok(Tok::Punct(x)) if x == p);
    let plus: Vec<usize> = (0..seg.len()).filter(|&i| punct(&seg[i], "+")).collect();
    if plus.is_empty() || seg.iter().any(|n| punct(n, "-")) {
        return text(seg);
    }
    let mut operands = Vec::new();
    let mut from = 0;
    for &p in plus.iter().chain(std::iter::once(&seg.len())) {
        operands.push(&seg[from..p]);
        from = p + 1;
    }
    let blank = |o: &[Node]| o.iter().all(|n| matches!(n, Node::Tok(Tok::Space(_))));
    let literal = |o: &[Node]| o.iter().any(|n| matches!(n, Node::Tok(Tok::Str(_))));
    if operands.iter().any(|o| blank(o)) || !operands.iter().any(|o| literal(o)) {
        return text(seg);
    }
    let whole = text(seg);
    let lead = &whole[..whole.len() - whole.trim_start().len()];
    let trail = &whole[whole.trim_end().len()..];
    let args: Vec<String> = operands
        .iter()
        .map(|o| text(o).trim().to_string())
        .collect();
    format!("{lead}{PLUS_FN}({}){trail}", args.join(", "))
}

/// Nodes back to text, groups rewritten level by level.
fn text(nodes: &[Node]) -> String {
    let mut out = String::new();
    for n in nodes {
        match n {
            Node::Tok(Tok::Str(s) | Tok::Punct(s) | Tok::Word(s) | Tok::Space(s)) => {
                out.push_str(s)
            }
            Node::Tok(Tok::Open(c) | Tok::Close(c)) => out.push(*c),
            Node::Group(o, inner, c) => {
                out.push(*o);
                out.push_str(&level(inner, None));
                out.push(*c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_chains_become_calls_and_the_rest_stays() {
        let cases = [
            ("{{ 'a' + b }}", "{{ __bloomery_plus('a', b) }}"),
            (
                "{%- set s = s + '\\nToday is ' + datetime + '.' -%}",
                "{%- set s = __bloomery_plus(s, '\\nToday is ', datetime, '.') -%}",
            ),
            (
                "{{- '\"tool\": \"'|indent(8, first=true) + c.name + '\",\\n' }}",
                "{{- __bloomery_plus('\"tool\": \"'|indent(8, first=true), c.name, '\",\\n') }}",
            ),
            ("{{ a + b }}", "{{ a + b }}"),
            ("{{ a - 'x' + b }}", "{{ a - 'x' + b }}"),
            (
                "{% set ns.calls = ns.calls + ['{\"n\": \"' + c['name'] + '\"}'] %}",
                "{% set ns.calls = ns.calls + [__bloomery_plus('{\"n\": \"', c['name'], '\"}')] %}",
            ),
            (
                "{% if x + 'a' == y and not z %}",
                "{% if __bloomery_plus(x, 'a') == y and not z %}",
            ),
            (
                "{{ f(a, 'b' + c) ~ d }}",
                "{{ f(a, __bloomery_plus('b', c)) ~ d }}",
            ),
            (
                "{{ 'x' + y is not none }}",
                "{{ __bloomery_plus('x', y is not none) }}",
            ),
            (
                "text { not a tag } {# 'a' + b #}",
                "text { not a tag } {# 'a' + b #}",
            ),
            (
                "{% raw %}{{ 'a' + b }}{% endraw %}{{ 'c' + d }}",
                "{% raw %}{{ 'a' + b }}{% endraw %}{{ __bloomery_plus('c', d) }}",
            ),
            ("{{ '}}' + a }}", "{{ __bloomery_plus('}}', a) }}"),
            ("{{ +'a' }}", "{{ +'a' }}"),
            (
                "{{ block['text'] + 'x' }}{% include 'a' + b %}",
                "{{ __bloomery_plus(block['text'], 'x') }}{% include __bloomery_plus('a', b) %}",
            ),
        ];
        for (src, want) in cases {
            assert_eq!(rewrite(src), want, "{src}");
        }
    }

    #[test]
    fn upstream_s_plus_rules() {
        let env = {
            let mut env = minijinja::Environment::new();
            env.add_function(PLUS_FN, plus);
            env
        };
        let render = |src: &str| {
            env.render_str(
                &rewrite(src),
                minijinja::context! { n => (), s => "s", l => vec![1] },
            )
            .map_err(|e| e.kind())
        };
        assert_eq!(render("{{ 'a' + missing + 'b' }}"), Ok("ab".into()));
        assert_eq!(render("{{ n + 'b' }}"), Ok("b".into()));
        assert_eq!(render("{{ 1 + 2 + 'x' }}"), Ok("3x".into()));
        assert_eq!(render("{{ 'x' + 1.5 }}"), Ok("x1.5".into()));
        assert_eq!(
            render("{{ (l + [2]) | length ~ 'y' + '' }}"),
            Ok("2y".into())
        );
        assert_eq!(
            render("{{ missing + 1 + 'x' }}"),
            Err(ErrorKind::InvalidOperation),
            "undefined beside a number is still an error"
        );
    }
}
