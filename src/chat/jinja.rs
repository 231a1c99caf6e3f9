//! The Jinja dialect chat templates are written in, on top of `minijinja`: the Python methods
//! templates call (`str.strip`, `dict.items`, `list.append`, ...), the filters and tests whose
//! behaviour differs between Jinja2 and llama.cpp's own engine, and value printing (`True`,
//! `None`, `{'a': 1}`), all as upstream's engine does them, because upstream's rendering is the
//! reference a prompt must match byte for byte.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use minijinja::value::{Kwargs, Object, ObjectRepr, Rest, Value, ValueKind, ValueOrKwargs};
use minijinja::{Environment, Error, ErrorKind, State, UndefinedBehavior};

use super::clock;

/// Name of the context variable that carries the render's clock (seconds since the epoch) to
/// `strftime_now`; no template names it.
pub(crate) const NOW_VAR: &str = "__bloomery_now";

/// A Jinja environment configured like upstream's engine (trim/lstrip blocks, chainable
/// undefined, Python methods, upstream's `tojson`).
pub(crate) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_undefined_behavior(UndefinedBehavior::Chainable);
    env.set_formatter(|out, _state, value| out.write_str(&to_text(value)).map_err(Error::from));
    env.set_unknown_method_callback(|_state, value, name, args| call_builtin(name, value, args));

    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("Jinja Exception: {msg}"),
        ))
    });
    env.add_function(
        "strftime_now",
        |state: &State, format: String| -> Result<String, Error> {
            let now = state
                .lookup(NOW_VAR)
                .and_then(|v| v.as_i64())
                .unwrap_or_else(clock::now_seconds);
            Ok(clock::strftime(&format, now))
        },
    );
    env.add_function("namespace", namespace);
    env.add_function(super::plus::PLUS_FN, super::plus::plus);

    for name in [
        "tojson",
        "string",
        "default",
        "d",
        "length",
        "count",
        "items",
        "dictsort",
        "safe",
        "first",
        "last",
        "join",
        "upper",
        "lower",
        "title",
        "capitalize",
        "replace",
        "indent",
        "list",
        "strip",
        "map",
    ] {
        env.add_filter(name, move |value: Value, args: Rest<ValueOrKwargs>| {
            let args: Vec<Value> = args.0.into_iter().map(Value::from).collect();
            let builtin = match name {
                "d" => "default",
                "count" => "length",
                other => other,
            };
            call_builtin(builtin, &value, &args)
        });
    }
    // Upstream counts strings and undefined as sequences and iterables (unlike Jinja2 for
    // undefined); templates branch on it.
    env.add_test("sequence", |v: Value| is_iterable(&v));
    env.add_test("iterable", |v: Value| is_iterable(&v));
    env
}

fn is_iterable(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Seq
            | ValueKind::Map
            | ValueKind::String
            | ValueKind::Undefined
            | ValueKind::Iterable
    )
}

/// Converts request JSON into a template value, keeping object key order.
pub(crate) fn from_json(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(items) => {
            Value::from(items.iter().map(from_json).collect::<Vec<_>>())
        }
        serde_json::Value::Object(map) => Value::from_pairs(
            map.iter()
                .map(|(k, v)| (Value::from(k.as_str()), from_json(v))),
        ),
    }
}

/// How upstream prints a value with `{{ }}` and `|string`: Python-like (`True`, `None`,
/// `['a', 1]`), floats as `%f` with trailing zeros dropped.
pub(crate) fn to_text(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => number_text(v),
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<String> = iter(v).iter().map(repr).collect();
            format!("[{}]", items.join(", "))
        }
        ValueKind::Map => {
            let items: Vec<String> = pairs(v)
                .iter()
                .map(|(k, x)| format!("{}: {}", repr(k), repr(x)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        _ => v.to_string(),
    }
}

/// A value as it appears inside a printed container.
fn repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => {
            let s = v.as_str().unwrap_or_default();
            if s.contains('\'') {
                json_text(v, None, ", ", ": ")
            } else {
                format!("'{s}'")
            }
        }
        ValueKind::Undefined => "Undefined".into(),
        _ => to_text(v),
    }
}

fn number_text(v: &Value) -> String {
    if let Some(i) = v.as_i64() {
        if v.is_integer() {
            return i.to_string();
        }
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    if v.is_integer() {
        // u64 beyond i64
        return v.to_string();
    }
    let mut out = format!("{f:.6}");
    while out.ends_with('0') {
        out.pop();
    }
    if out.ends_with('.') {
        out.push('0');
    }
    out
}

/// A float as C++ streams print it (`%g`, six significant digits), which is what upstream's
/// `tojson` writes.
fn float_json(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    if !f.is_finite() {
        return if f.is_nan() {
            "nan"
        } else if f > 0.0 {
            "inf"
        } else {
            "-inf"
        }
        .into();
    }
    let sci = format!("{f:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let mantissa = trim_fraction(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (5 - exp).max(0) as usize;
        trim_fraction(&format!("{f:.decimals$}")).to_string()
    }
}

fn trim_fraction(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

fn iter(v: &Value) -> Vec<Value> {
    v.try_iter().map(|it| it.collect()).unwrap_or_default()
}

fn pairs(v: &Value) -> Vec<(Value, Value)> {
    iter(v)
        .into_iter()
        .map(|k| {
            let x = v.get_item(&k).unwrap_or(Value::UNDEFINED);
            (k, x)
        })
        .collect()
}

/// Upstream's `tojson`: `", "` and `": "` separators unless told otherwise, key order kept,
/// non-ASCII left as is, `indent` like Python's.
pub(crate) fn json_text(v: &Value, indent: Option<usize>, item_sep: &str, key_sep: &str) -> String {
    let mut out = String::new();
    write_json(&mut out, v, 0, indent, item_sep, key_sep);
    out
}

fn write_json(
    out: &mut String,
    v: &Value,
    level: usize,
    indent: Option<usize>,
    item_sep: &str,
    key_sep: &str,
) {
    let pad = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push_str(&" ".repeat(n * level));
        }
    };
    let newline = |out: &mut String| {
        if indent.is_some() {
            out.push('\n');
        }
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                out.push_str(&float_json(f64::try_from(v.clone()).unwrap_or(f64::NAN)));
            }
        }
        // serde_json escapes strings as upstream's library does
        ValueKind::String => {
            out.push_str(&serde_json::Value::from(v.as_str().unwrap_or_default()).to_string())
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items = iter(v);
            out.push('[');
            if !items.is_empty() {
                newline(out);
                for (i, item) in items.iter().enumerate() {
                    pad(out, level + 1);
                    write_json(out, item, level + 1, indent, item_sep, key_sep);
                    if i + 1 < items.len() {
                        out.push_str(item_sep);
                    }
                    newline(out);
                }
                pad(out, level);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let items = pairs(v);
            out.push('{');
            if !items.is_empty() {
                newline(out);
                for (i, (key, item)) in items.iter().enumerate() {
                    pad(out, level + 1);
                    out.push_str(&serde_json::Value::from(to_text(key)).to_string());
                    out.push_str(key_sep);
                    write_json(out, item, level + 1, indent, item_sep, key_sep);
                    if i + 1 < items.len() {
                        out.push_str(item_sep);
                    }
                    newline(out);
                }
                pad(out, level);
            }
            out.push('}');
        }
        _ => out.push_str("null"),
    }
}

fn ensure_ascii(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    out
}

/// Positional and keyword arguments of a call, as upstream reads them: a named argument may
/// also be given by position.
struct Args {
    positional: Vec<Value>,
    keywords: Option<Kwargs>,
}

impl Args {
    fn new(args: &[Value]) -> Self {
        let mut positional = args.to_vec();
        let keywords = match positional.last() {
            Some(last) if last.is_kwargs() => {
                positional.pop().and_then(|v| Kwargs::try_from(v).ok())
            }
            _ => None,
        };
        Args {
            positional,
            keywords,
        }
    }

    fn get(&self, name: &str, index: usize) -> Value {
        if let Some(kw) = &self.keywords {
            if let Ok(Some(v)) = kw.peek::<Option<Value>>(name) {
                return v;
            }
        }
        self.positional
            .get(index)
            .cloned()
            .unwrap_or(Value::UNDEFINED)
    }

    fn pos(&self, index: usize) -> Value {
        self.positional
            .get(index)
            .cloned()
            .unwrap_or(Value::UNDEFINED)
    }

    fn count(&self) -> usize {
        self.positional.len()
    }
}

fn raise(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

fn str_arg(v: &Value, what: &str) -> Result<String, Error> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| raise(format!("{what}: expected a string, got {}", v.kind())))
}

fn int_arg(v: &Value) -> Option<i64> {
    v.as_i64()
}

/// One upstream builtin, called as a method (`x.strip()`) or a filter (`x|strip`): upstream
/// resolves both through the same per-type table.
fn call_builtin(name: &str, value: &Value, args: &[Value]) -> Result<Value, Error> {
    let args = Args::new(args);
    match value.kind() {
        ValueKind::String => string_builtin(name, value, &args),
        ValueKind::Seq | ValueKind::Iterable => seq_builtin(name, value, &args),
        ValueKind::Map => map_builtin(name, value, &args),
        ValueKind::Undefined => undefined_builtin(name, value, &args),
        _ => scalar_builtin(name, value, &args),
    }
    .unwrap_or_else(|| {
        Err(Error::new(
            ErrorKind::UnknownMethod,
            format!("{} has no method or filter named {name}", value.kind()),
        ))
    })
}

fn common_builtin(name: &str, value: &Value, args: &Args) -> Option<Result<Value, Error>> {
    Some(Ok(match name {
        "tojson" => {
            let indent = int_arg(&args.get("indent", 1)).map(|n| n.max(0) as usize);
            let separators = iter(&args.get("separators", 2));
            let item_sep = separators
                .first()
                .map(to_text)
                .unwrap_or_else(|| if indent.is_some() { "," } else { ", " }.to_string());
            let key_sep = separators
                .get(1)
                .map(to_text)
                .unwrap_or_else(|| ": ".to_string());
            if args.get("sort_keys", 3).is_true() {
                return Some(Err(raise("tojson sort_keys=true not implemented")));
            }
            let text = json_text(value, indent, &item_sep, &key_sep);
            Value::from(if args.get("ensure_ascii", 0).is_true() {
                ensure_ascii(&text)
            } else {
                text
            })
        }
        "string" => Value::from(to_text(value)),
        "default" => default_value(value, args),
        _ => return None,
    }))
}

fn default_value(value: &Value, args: &Args) -> Value {
    let fallback = args.pos(0);
    let missing = if args.get("boolean", 1).is_true() {
        !value.is_true()
    } else {
        value.is_undefined() || value.is_none()
    };
    if missing {
        fallback
    } else {
        value.clone()
    }
}

fn scalar_builtin(name: &str, value: &Value, args: &Args) -> Option<Result<Value, Error>> {
    if name == "safe" {
        return Some(Ok(Value::from(to_text(value))));
    }
    if name == "length" {
        return Some(Err(raise(format!(
            "length: {} has no length",
            value.kind()
        ))));
    }
    common_builtin(name, value, args)
}

fn undefined_builtin(name: &str, value: &Value, args: &Args) -> Option<Result<Value, Error>> {
    // upstream answers a fixed set of filters on undefined with an empty value of the
    // filter's result type rather than an error
    let empty = match name {
        "default" | "tojson" => return common_builtin(name, value, args),
        "string" | "safe" | "capitalize" | "join" | "lower" | "upper" | "replace" | "strip"
        | "title" | "trim" | "truncate" => Value::from(""),
        "items" | "list" | "map" | "reject" | "rejectattr" | "select" | "selectattr" | "sort"
        | "reverse" | "unique" => Value::from(Vec::<Value>::new()),
        "length" | "sum" | "wordcount" => Value::from(0),
        "first" | "last" | "min" | "max" => Value::UNDEFINED,
        _ => return None,
    };
    Some(Ok(empty))
}

fn strip_chars(s: &str, chars: &Value, left: bool, right: bool) -> String {
    let set: Option<Vec<char>> = chars.as_str().map(|c| c.chars().collect());
    let matches = |c: char| match &set {
        Some(set) => set.contains(&c),
        None => c.is_ascii_whitespace() || c == '\u{b}',
    };
    let mut out = s;
    if left {
        out = out.trim_start_matches(matches);
    }
    if right {
        out = out.trim_end_matches(matches);
    }
    out.to_string()
}

fn string_builtin(name: &str, value: &Value, args: &Args) -> Option<Result<Value, Error>> {
    let s = value.as_str().unwrap_or_default();
    let result = match name {
        "upper" => Value::from(s.to_uppercase()),
        "lower" => Value::from(s.to_lowercase()),
        "strip" | "trim" => Value::from(strip_chars(s, &args.get("chars", 0), true, true)),
        "lstrip" => Value::from(strip_chars(s, &args.get("chars", 0), true, false)),
        "rstrip" => Value::from(strip_chars(s, &args.get("chars", 0), false, true)),
        "title" => Value::from(title_case(s)),
        "capitalize" => {
            let mut chars = s.chars();
            Value::from(match chars.next() {
                Some(first) => first
                    .to_uppercase()
                    .chain(chars.flat_map(char::to_lowercase))
                    .collect(),
                None => String::new(),
            })
        }
        "length" => Value::from(s.chars().count()),
        "startswith" | "endswith" => {
            let wanted = args.pos(0);
            let candidates: Vec<String> = if wanted.kind() == ValueKind::Seq {
                iter(&wanted).iter().map(to_text).collect()
            } else {
                match str_arg(&wanted, name) {
                    Ok(w) => vec![w],
                    Err(e) => return Some(Err(e)),
                }
            };
            let hit = candidates.iter().any(|c| {
                if name == "startswith" {
                    s.starts_with(c.as_str())
                } else {
                    s.ends_with(c.as_str())
                }
            });
            Value::from(hit)
        }
        "split" | "rsplit" => {
            let sep = if args.count() > 0 {
                to_text(&args.pos(0))
            } else {
                " ".to_string()
            };
            if sep.is_empty() {
                return Some(Err(raise("empty separator")));
            }
            let max = if args.count() > 1 {
                int_arg(&args.pos(1)).unwrap_or(-1)
            } else {
                -1
            };
            Value::from(split(s, &sep, max, name == "rsplit"))
        }
        "replace" => {
            let old = to_text(&args.pos(0));
            let new = to_text(&args.pos(1));
            if args.count() > 2 && int_arg(&args.pos(2)).unwrap_or(-1) > 0 {
                return Some(Err(raise(
                    "String replace with count argument not implemented",
                )));
            }
            Value::from(if old.is_empty() {
                let mut out = new.clone();
                for c in s.chars() {
                    out.push(c);
                    out.push_str(&new);
                }
                out
            } else {
                s.replace(&old, &new)
            })
        }
        "format" => {
            let mut out = String::new();
            let mut next = 0;
            let mut rest = s;
            while let Some(pos) = rest.find('{') {
                out.push_str(&rest[..pos]);
                if !rest[pos..].starts_with("{}") {
                    return Some(Err(raise(
                        "format() only supports simple '{}' placeholders",
                    )));
                }
                out.push_str(&to_text(&args.pos(next)));
                next += 1;
                rest = &rest[pos + 2..];
            }
            out.push_str(rest);
            Value::from(out)
        }
        "int" => {
            let base = int_arg(&args.get("base", 1)).unwrap_or(10) as u32;
            match i64::from_str_radix(s.trim(), base.clamp(2, 36)) {
                Ok(n) => Value::from(n),
                Err(_) => Value::from(int_arg(&args.get("default", 0)).unwrap_or(0)),
            }
        }
        "float" => match s.trim().parse::<f64>() {
            Ok(f) => Value::from(f),
            Err(_) => args.get("default", 0),
        },
        "safe" | "string" => Value::from(s),
        "default" => {
            let fallback = if args.count() > 0 && !args.pos(0).is_undefined() {
                args.pos(0)
            } else {
                Value::from("")
            };
            if args.get("boolean", 1).is_true() && s.is_empty() {
                fallback
            } else {
                value.clone()
            }
        }
        "indent" => {
            let width = args.get("width", 0);
            let pad = if let Some(n) = int_arg(&width) {
                " ".repeat(n.max(0) as usize)
            } else if let Some(text) = width.as_str() {
                text.to_string()
            } else {
                "    ".to_string()
            };
            Value::from(indent(
                s,
                &pad,
                args.get("first", 1).is_true(),
                args.get("blank", 2).is_true(),
            ))
        }
        "join" => return Some(Err(raise("String join builtin not implemented"))),
        "list" => Value::from(
            s.chars()
                .map(|c| Value::from(c.to_string()))
                .collect::<Vec<_>>(),
        ),
        "first" => s
            .chars()
            .next()
            .map(|c| Value::from(c.to_string()))
            .unwrap_or(Value::UNDEFINED),
        "last" => s
            .chars()
            .last()
            .map(|c| Value::from(c.to_string()))
            .unwrap_or(Value::UNDEFINED),
        "items" | "dictsort" | "map" => return None,
        _ => return common_builtin(name, value, args),
    };
    Some(Ok(result))
}

fn title_case(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut start = true;
    for c in s.chars() {
        if c.is_whitespace() {
            start = true;
            out.push(c);
        } else if start {
            out.extend(c.to_uppercase());
            start = false;
        } else {
            out.extend(c.to_lowercase());
        }
    }
    out
}

fn split(s: &str, sep: &str, max: i64, from_right: bool) -> Vec<Value> {
    let mut parts: Vec<String> = Vec::new();
    let mut rest = s.to_string();
    let mut remaining = max;
    while remaining != 0 {
        let found = if from_right {
            rest.rfind(sep)
        } else {
            rest.find(sep)
        };
        let Some(pos) = found else { break };
        if from_right {
            parts.push(rest[pos + sep.len()..].to_string());
            rest.truncate(pos);
        } else {
            parts.push(rest[..pos].to_string());
            rest.drain(..pos + sep.len());
        }
        remaining -= 1;
    }
    parts.push(rest);
    if from_right {
        parts.reverse();
    }
    parts.into_iter().map(Value::from).collect()
}

fn indent(s: &str, pad: &str, first: bool, blank: bool) -> String {
    let mut out = String::new();
    let body = s.strip_suffix('\n').unwrap_or(s);
    for (i, line) in body.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let wanted = if i == 0 {
            first
        } else {
            !line.is_empty() || blank
        };
        if wanted {
            out.push_str(pad);
        }
        out.push_str(line);
    }
    if s.ends_with('\n') {
        out.push('\n');
        if blank {
            out.push_str(pad);
        }
    }
    out
}

fn attribute(item: &Value, attr: &Value) -> Value {
    if attr.is_undefined() {
        return item.clone();
    }
    let mut current = item.clone();
    for part in to_text(attr).split('.') {
        current = match part.parse::<usize>() {
            Ok(i) if current.kind() == ValueKind::Seq => current.get_item(&Value::from(i)),
            _ => current.get_attr(part),
        }
        .unwrap_or(Value::UNDEFINED);
    }
    current
}

fn seq_builtin(name: &str, value: &Value, args: &Args) -> Option<Result<Value, Error>> {
    let items = iter(value);
    let result = match name {
        "length" => Value::from(items.len()),
        "list" => Value::from(items),
        "first" => items.first().cloned().unwrap_or(Value::UNDEFINED),
        "last" => items.last().cloned().unwrap_or(Value::UNDEFINED),
        "join" => {
            let delim = args.get("d", 0);
            let delim = if delim.is_undefined() {
                String::new()
            } else {
                to_text(&delim)
            };
            let attr = args.get("attribute", 1);
            let mut parts = Vec::with_capacity(items.len());
            for item in &items {
                let v = attribute(item, &attr);
                if !matches!(v.kind(), ValueKind::String | ValueKind::Number) {
                    return Some(Err(raise(
                        "join() can only join arrays of strings or numerics",
                    )));
                }
                parts.push(to_text(&v));
            }
            Value::from(parts.join(&delim))
        }
        "map" => {
            let attr = args.get("attribute", 0);
            if args.keywords.is_none() {
                return Some(Err(raise("map: filter-mapping not implemented")));
            }
            let fallback = args.get("default", usize::MAX);
            Value::from(
                items
                    .iter()
                    .map(|item| {
                        let v = attribute(item, &attr);
                        if v.is_undefined() {
                            fallback.clone()
                        } else {
                            v
                        }
                    })
                    .collect::<Vec<_>>(),
            )
        }
        "safe" | "string" => Value::from(to_text(value)),
        "append" | "pop" => {
            return Some(match value.downcast_object_ref::<MutableList>() {
                Some(list) => list.mutate(name, args),
                None => Err(raise(format!("{name}: list is not mutable here"))),
            })
        }
        "upper" | "lower" | "title" | "capitalize" | "replace" | "indent" | "strip" | "items"
        | "dictsort" => return Some(Err(raise(format!("{name}: not defined for a list")))),
        _ => return common_builtin(name, value, args),
    };
    Some(Ok(result))
}

fn map_builtin(name: &str, value: &Value, args: &Args) -> Option<Result<Value, Error>> {
    let entries = pairs(value);
    let result = match name {
        "get" => {
            let key = args.pos(0);
            let fallback = if args.count() > 1 {
                args.pos(1)
            } else {
                Value::from(())
            };
            match value.get_item(&key) {
                Ok(v) if !v.is_undefined() => v,
                _ => fallback,
            }
        }
        "keys" => Value::from(entries.into_iter().map(|(k, _)| k).collect::<Vec<_>>()),
        "values" => Value::from(entries.into_iter().map(|(_, v)| v).collect::<Vec<_>>()),
        "items" => Value::from(
            entries
                .into_iter()
                .map(|(k, v)| Value::from(vec![k, v]))
                .collect::<Vec<_>>(),
        ),
        "length" => Value::from(entries.len()),
        "dictsort" => {
            let by_value = args.get("by", 1).as_str() == Some("value");
            let reverse = args.get("reverse", 2).is_true();
            let mut entries = entries;
            entries.sort_by(|a, b| {
                let ord = if by_value {
                    a.1.cmp(&b.1)
                } else {
                    a.0.cmp(&b.0)
                };
                if reverse {
                    ord.reverse()
                } else {
                    ord
                }
            });
            // a list of (key, value) pairs, so `for k, v in d|dictsort` unpacks them
            Value::from(
                entries
                    .into_iter()
                    .map(|(k, v)| Value::from(vec![k, v]))
                    .collect::<Vec<_>>(),
            )
        }
        "safe" | "string" => Value::from(to_text(value)),
        "join" => return Some(Err(raise("object join not implemented"))),
        "default" => value.clone(),
        "first" | "last" | "upper" | "lower" | "strip" | "replace" | "indent" | "title"
        | "capitalize" => return Some(Err(raise(format!("{name}: not defined for an object")))),
        _ => return common_builtin(name, value, args),
    };
    Some(Ok(result))
}

/// `namespace(...)` whose list members can be appended to and popped from, as templates that
/// keep queues in a namespace (Kimi K2) expect.
fn namespace(args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args: Vec<Value> = args.0.into_iter().map(Value::from).collect();
    let args = Args::new(&args);
    let mut members: Vec<(Value, Value)> = Vec::new();
    if let Some(first) = args.positional.first() {
        if first.kind() != ValueKind::Map {
            return Err(raise(format!(
                "namespace() expects keyword arguments or a dict, got {}",
                first.kind()
            )));
        }
        members.extend(pairs(first));
    }
    if let Some(kw) = &args.keywords {
        for key in kw.args() {
            let v: Value = kw.peek(key)?;
            members.push((Value::from(key), v));
        }
    }
    let members = members
        .into_iter()
        .map(|(k, v)| {
            let v = if v.kind() == ValueKind::Seq {
                MutableList::value(iter(&v))
            } else {
                v
            };
            (k, v)
        })
        .collect::<Vec<_>>();
    minijinja::functions::namespace(Some(ValueOrKwargs::from(Value::from_pairs(members))))
}

#[derive(Debug, Default)]
struct MutableList(Mutex<Vec<Value>>);

impl MutableList {
    fn value(items: Vec<Value>) -> Value {
        Value::from_object(MutableList(Mutex::new(items)))
    }

    fn items(&self) -> Vec<Value> {
        self.0.lock().map(|l| l.clone()).unwrap_or_default()
    }

    fn mutate(&self, name: &str, args: &Args) -> Result<Value, Error> {
        let mut list = self.0.lock().map_err(|_| raise("list lock poisoned"))?;
        if name == "append" {
            list.push(args.pos(0));
            return Ok(Value::from(()));
        }
        let len = list.len() as i64;
        let index = int_arg(&args.pos(0)).unwrap_or(-1);
        let index = if index < 0 { index + len } else { index };
        if index < 0 || index >= len {
            return Err(raise(format!(
                "pop: index {index} out of range for a list of {len}"
            )));
        }
        Ok(list.remove(index as usize))
    }
}

impl Object for MutableList {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let items = self.items();
        let len = items.len() as i64;
        let i = key.as_i64()?;
        let i = if i < 0 { i + len } else { i };
        items.get(usize::try_from(i).ok()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Values(self.items())
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State,
        name: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        match name {
            "append" | "pop" => self.mutate(name, &Args::new(args)),
            _ => call_builtin(name, &Value::from(self.items()), args),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> String {
        let env = environment();
        let tmpl = env.template_from_str(src).expect("template parses");
        tmpl.render(from_json(&ctx)).expect("template renders")
    }

    #[test]
    fn prints_values_like_upstream() {
        let ctx = serde_json::json!({"b": true, "n": null, "f": 0.5, "l": ["a", 1, "it's"], "m": {"k": "v"}});
        assert_eq!(
            render("{{ b }} {{ n }} {{ f }} {{ l }} {{ m }}", ctx),
            "True None 0.5 ['a', 1, \"it's\"] {'k': 'v'}"
        );
    }

    #[test]
    fn tojson_uses_python_separators_and_keeps_order() {
        let ctx = serde_json::json!({"m": {"z": 1, "a": [1.5, "é<>"], "t": 1e-7}});
        assert_eq!(
            render("{{ m | tojson }}", ctx.clone()),
            r#"{"z": 1, "a": [1.5, "é<>"], "t": 1e-07}"#
        );
        assert_eq!(
            render("{{ m | tojson(indent=2) }}", ctx.clone()),
            "{\n  \"z\": 1,\n  \"a\": [\n    1.5,\n    \"é<>\"\n  ],\n  \"t\": 1e-07\n}"
        );
        assert_eq!(
            render(
                "{{ m.a | tojson(ensure_ascii=True, separators=(',', ':')) }}",
                ctx
            ),
            r#"[1.5,"\u00e9<>"]"#
        );
    }

    #[test]
    fn python_string_methods() {
        let ctx = serde_json::json!({"s": "  a b  c "});
        assert_eq!(render("[{{ s.strip() }}]", ctx.clone()), "[a b  c]");
        assert_eq!(render("{{ s.split(' ') | length }}", ctx.clone()), "7");
        assert_eq!(
            render("{{ 'a,b,c'.rsplit(',', 1) }}", ctx.clone()),
            "['a,b', 'c']"
        );
        assert_eq!(
            render("{{ 'x'.startswith(('y', 'x')) }}", ctx.clone()),
            "True"
        );
        assert_eq!(render("{{ '{} and {}'.format(1, 'b') }}", ctx), "1 and b");
    }

    #[test]
    fn dict_methods_and_mutable_namespace_lists() {
        let ctx = serde_json::json!({"d": {"a": 1, "b": null}});
        assert_eq!(
            render(
                "{{ d.get('b', 2) }}/{{ d.get('c', 2) }}/{{ d.get('c') }}",
                ctx.clone()
            ),
            "None/2/None"
        );
        assert_eq!(
            render(
                "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                ctx.clone()
            ),
            "a=1;b=None;"
        );
        let src = "{% set ns = namespace(q=[]) %}{% set _ = ns.q.append('x') %}{% set _ = ns.q.append('y') %}{{ ns.q.pop(0) }}{{ ns.q | length }}";
        assert_eq!(render(src, ctx), "x1");
    }

    #[test]
    fn undefined_is_forgiving_like_upstream() {
        let ctx = serde_json::json!({"m": {}});
        assert_eq!(
            render(
                "{{ m.x | length }}|{{ m.x.y }}|{{ m.x | default('d') }}|{{ none | default('n') }}",
                ctx
            ),
            "0||d|n"
        );
    }

    #[test]
    fn raise_exception_carries_the_message() {
        let env = environment();
        let tmpl = env
            .template_from_str("{{ raise_exception('no system role') }}")
            .expect("parses");
        let err = tmpl.render(Value::UNDEFINED).expect_err("must fail");
        assert!(err.to_string().contains("no system role"), "{err}");
    }
}
