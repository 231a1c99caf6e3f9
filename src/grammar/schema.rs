//! JSON schemas turned into GBNF grammars, producing the same rules upstream's converter does.
//!
//! Owns: reading a JSON schema into the supported subset (`SchemaDocument`), converting it to GBNF
//! text rule for rule as upstream b11434 does (names, order, the `space` rule, the integer-range
//! and regular-expression rules), and upstream's mapping of a request's `json_schema` and
//! `response_format` fields to a schema. Must not: parse or run GBNF (the parent module does),
//! or know about HTTP beyond the request fields it maps.
//!
//! The text must match upstream's byte for byte: sampling accepts exactly what the grammar accepts,
//! and upstream's own test cases (tests/grammar_schema.rs) compare grammars as text.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// A schema upstream refuses, or one whose conversion failed; `Display` gives upstream's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError(String);

impl SchemaError {
    fn conversion(detail: &str) -> Self {
        SchemaError(format!("JSON schema conversion failed:\n{detail}"))
    }
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SchemaError {}

/// The GBNF grammar for `schema`, as upstream's `json_schema_to_grammar(schema)` gives it.
pub fn schema_to_grammar(schema: &Value) -> Result<String, SchemaError> {
    let doc = SchemaDocument::from_json(schema).map_err(|e| SchemaError::conversion(&e.0))?;
    let mut builder = GrammarBuilder::new(false);
    builder.add_schema("", &doc, doc.root());
    builder.finish()
}

/// The grammar a completion request's `json_schema` field asks for, as upstream's request
/// parser builds it: only when `json_schema` is present and not null and there is no `grammar`
/// key at all (a `grammar` key, even null, makes upstream read `grammar` instead); `{}` means any
/// object. A failure's message is prefixed with `"json_schema": ` (upstream's server then
/// prefixes `Field 'json_schema': ` as for every field and answers 400 invalid_request_error).
pub fn completion_schema_grammar(body: &Value) -> Result<Option<String>, SchemaError> {
    let Some(field) = non_null(body, "json_schema") else {
        return Ok(None);
    };
    if body.get("grammar").is_some() {
        return Ok(None);
    }
    let schema = match field {
        Value::Object(map) if map.is_empty() => any_object_schema(),
        other => other.clone(),
    };
    schema_to_grammar(&schema)
        .map(Some)
        .map_err(|e| SchemaError(format!("\"json_schema\": {e}")))
}

/// The schema an OpenAI-style chat request asks for, from its `json_schema`, `grammar` and
/// `response_format` fields, following upstream's chat request mapping; `None` when the request
/// constrains nothing. `{}` becomes `{"type": "object"}`. The schema may be any JSON value: a
/// non-object one fails later, in the conversion. Upstream answers "Cannot use both json_schema
/// and grammar" with 500 server_error, an unknown `response_format` type with 400
/// invalid_request_error.
pub fn chat_request_schema(body: &Value) -> Result<Option<Value>, SchemaError> {
    let mut schema = non_null(body, "json_schema").cloned();
    let grammar = non_null(body, "grammar")
        .and_then(Value::as_str)
        .unwrap_or("");
    if schema.is_some() && !grammar.is_empty() {
        return Err(SchemaError(
            "Cannot use both json_schema and grammar".into(),
        ));
    }
    if body.get("response_format").is_some() {
        let empty = Value::Object(Default::default());
        let format = non_null(body, "response_format").unwrap_or(&empty);
        let kind = non_null(format, "type")
            .and_then(Value::as_str)
            .unwrap_or("");
        match kind {
            "json_object" => {
                if format.get("schema").is_some() || schema.as_ref().is_none_or(json_is_empty) {
                    schema = Some(non_null(format, "schema").cloned().unwrap_or(empty));
                }
            }
            "json_schema" => {
                let wrapper = non_null(format, "json_schema").unwrap_or(&empty);
                schema = Some(non_null(wrapper, "schema").cloned().unwrap_or(empty));
            }
            "" | "text" => {}
            other => {
                return Err(SchemaError(format!(
                "response_format type must be one of \"text\" or \"json_object\", but got: {other}"
            )))
            }
        }
    }
    Ok(schema.map(|s| match s {
        Value::Object(map) if map.is_empty() => any_object_schema(),
        other => other,
    }))
}

fn any_object_schema() -> Value {
    serde_json::json!({"type": "object"})
}

/// A field's value, absent when missing or null (upstream's `json_value` reads null as absent).
fn non_null<'a>(obj: &'a Value, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// nlohmann's `empty()`: true for null, empty objects and arrays, false for scalars.
fn json_is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// String formats the converter has rules for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringFormat {
    None,
    /// `uuid` and `uuid1` .. `uuid5`
    Uuid,
    Date,
    Time,
    DateTime,
}

/// One node of a schema, reduced to what the converter uses.
#[derive(Debug, Clone)]
pub enum Schema {
    Any,
    /// `{"$ref": "#/..."}`; the target lives in the document's `refs` under this same string.
    Ref(String),
    /// `anyOf` / `oneOf`, or a `type` array (one alternative per type).
    AnyOf(Vec<Schema>),
    AllOf(Vec<Schema>),
    Const(Value),
    Enum(Vec<Value>),
    Null,
    Boolean,
    Number,
    /// Inclusive bounds with the exclusive ones folded in; `i64::MIN` / `i64::MAX` when unbounded.
    Integer {
        minimum: i64,
        maximum: i64,
    },
    String {
        /// Empty when absent, as upstream treats an empty pattern.
        pattern: String,
        format: StringFormat,
        min_length: i32,
        /// -1 when unbounded.
        max_length: i32,
    },
    Array {
        items: Box<Schema>,
        min_items: i32,
        /// -1 when unbounded.
        max_items: i32,
    },
    Tuple(Vec<Schema>),
    Object {
        /// In schema order.
        properties: Vec<Property>,
        /// `None` when no other property is allowed.
        additional: Option<Box<Schema>>,
    },
}

#[derive(Debug, Clone)]
pub struct Property {
    pub name: String,
    pub schema: Schema,
    pub required: bool,
}

/// A schema read into the supported subset, with the targets of its `$ref`s.
#[derive(Debug, Clone)]
pub struct SchemaDocument {
    root: Schema,
    refs: BTreeMap<String, Schema>,
}

impl SchemaDocument {
    /// Reads `schema`, refusing what falls outside the subset the converter handles, with
    /// upstream's message naming the JSON-pointer path of the offending node (`JSON schema error
    /// at #/...: ...`, without the `JSON schema conversion failed:` that `schema_to_grammar` adds;
    /// upstream's chat parser generator reports it bare).
    pub fn from_json(schema: &Value) -> Result<Self, SchemaError> {
        let mut reader = SchemaReader {
            root: schema,
            refs: BTreeMap::new(),
        };
        let root = reader.node(schema, "#").map_err(SchemaError)?;
        let refs = reader
            .refs
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        Ok(SchemaDocument { root, refs })
    }

    pub fn root(&self) -> &Schema {
        &self.root
    }

    /// The target of a `$ref` node.
    pub fn resolve(&self, reference: &str) -> Option<&Schema> {
        self.refs.get(reference)
    }

    /// The JSON types a value matching `node` may have (upstream's `value_types()`, which the
    /// tool-call parsers use to decide how to read an argument). A `$ref` cycle adds no type.
    pub fn value_types(&self, node: &Schema) -> ValueTypes {
        self.value_types_within(node, &mut HashSet::new())
    }

    fn value_types_within<'s>(
        &'s self,
        node: &'s Schema,
        visiting: &mut HashSet<&'s str>,
    ) -> ValueTypes {
        use ValueType as T;
        match node {
            Schema::Any => ValueTypes::ALL,
            Schema::Null => ValueTypes::of(&[T::Null]),
            Schema::Boolean => ValueTypes::of(&[T::Boolean]),
            Schema::Number => ValueTypes::of(&[T::Number, T::Integer]),
            Schema::Integer { .. } => ValueTypes::of(&[T::Integer]),
            Schema::String { .. } => ValueTypes::of(&[T::String]),
            Schema::Array { .. } | Schema::Tuple(_) => ValueTypes::of(&[T::Array]),
            Schema::Object { .. } => ValueTypes::of(&[T::Object]),
            Schema::Const(value) => ValueTypes::of(&[ValueType::of_json(value)]),
            Schema::Enum(values) => values.iter().fold(ValueTypes::NONE, |acc, v| {
                acc.union(ValueTypes::of(&[ValueType::of_json(v)]))
            }),
            Schema::Ref(reference) => match self.resolve(reference) {
                Some(target) if visiting.insert(reference) => {
                    let types = self.value_types_within(target, visiting);
                    visiting.remove(reference.as_str());
                    types
                }
                _ => ValueTypes::NONE,
            },
            Schema::AnyOf(alts) => alts.iter().fold(ValueTypes::NONE, |acc, alt| {
                acc.union(self.value_types_within(alt, visiting))
            }),
            Schema::AllOf(parts) => parts.iter().fold(ValueTypes::ALL, |acc, part| {
                acc.intersection(self.value_types_within(part, visiting))
            }),
        }
    }

    /// Whether a value matching `node` may be a string through any branch of it (upstream's
    /// `may_be_string()`). An unconstrained schema counts as no string, and so does a `$ref` cycle.
    pub fn may_be_string(&self, node: &Schema) -> bool {
        self.may_be_string_within(node, &mut HashSet::new())
    }

    fn may_be_string_within<'s>(
        &'s self,
        node: &'s Schema,
        visiting: &mut HashSet<&'s str>,
    ) -> bool {
        match node {
            Schema::String { .. } => true,
            Schema::Const(value) => value.is_string(),
            Schema::Enum(values) => values.iter().any(Value::is_string),
            Schema::Ref(reference) => match self.resolve(reference) {
                Some(target) if visiting.insert(reference) => {
                    let result = self.may_be_string_within(target, visiting);
                    visiting.remove(reference.as_str());
                    result
                }
                _ => false,
            },
            Schema::AnyOf(alts) => alts
                .iter()
                .any(|alt| self.may_be_string_within(alt, visiting)),
            // every part must allow a string; an unconstrained part constrains nothing
            Schema::AllOf(parts) => {
                let mut constrained = parts
                    .iter()
                    .filter(|p| !matches!(p, Schema::Any))
                    .peekable();
                constrained.peek().is_some()
                    && constrained.all(|p| self.may_be_string_within(p, visiting))
            }
            _ => false,
        }
    }
}

/// A JSON value's type, integers apart from other numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    Null,
    Boolean,
    Number,
    Integer,
    String,
    Array,
    Object,
}

impl ValueType {
    fn of_json(value: &Value) -> ValueType {
        match value {
            Value::Null => ValueType::Null,
            Value::Bool(_) => ValueType::Boolean,
            Value::Number(n) if n.is_i64() || n.is_u64() => ValueType::Integer,
            Value::Number(_) => ValueType::Number,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::Object(_) => ValueType::Object,
        }
    }
}

/// A set of JSON value types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueTypes(u8);

impl ValueTypes {
    pub const NONE: ValueTypes = ValueTypes(0);
    pub const ALL: ValueTypes = ValueTypes(0x7f);

    pub fn of(types: &[ValueType]) -> ValueTypes {
        ValueTypes(types.iter().fold(0, |acc, t| acc | 1 << *t as u8))
    }

    pub fn has(self, t: ValueType) -> bool {
        self.0 & (1 << t as u8) != 0
    }

    pub fn is_only(self, t: ValueType) -> bool {
        self.0 == 1 << t as u8
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn union(self, other: ValueTypes) -> ValueTypes {
        ValueTypes(self.0 | other.0)
    }

    pub fn intersection(self, other: ValueTypes) -> ValueTypes {
        ValueTypes(self.0 & other.0)
    }
}

struct SchemaReader<'a> {
    root: &'a Value,
    /// Targets by `$ref` string; `None` while its target is being read, so a cycle stops there.
    refs: BTreeMap<String, Option<Schema>>,
}

type ReadResult = Result<Schema, String>;

fn read_fail<T>(path: &str, msg: &str) -> Result<T, String> {
    Err(format!("JSON schema error at {path}: {msg}"))
}

/// nlohmann's `get<int>()` of an integer: the value truncated to 32 bits.
fn json_int_as_i32(v: &Value) -> Option<i32> {
    v.as_i64()
        .map(|i| i as i32)
        .or_else(|| v.as_u64().map(|u| u as i32))
}

/// nlohmann's `get<int64_t>()` of an integer: unsigned values above `i64::MAX` wrap.
fn json_int_as_i64(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_u64().map(|u| u as i64))
}

impl<'a> SchemaReader<'a> {
    fn count(schema: &Value, key: &str, path: &str, default: i32) -> Result<i32, String> {
        let Some(value) = schema.get(key) else {
            return Ok(default);
        };
        match json_int_as_i32(value) {
            Some(n) if n >= 0 => Ok(n),
            _ => read_fail(path, &format!("{key} must be a non-negative integer")),
        }
    }

    /// A fractional bound is rounded inwards, towards the integers it still admits.
    fn bound(value: &Value, key: &str, path: &str, round_up: bool) -> Result<i64, String> {
        if let Some(i) = json_int_as_i64(value) {
            return Ok(i);
        }
        let Some(d) = value.as_f64() else {
            return read_fail(path, &format!("{key} must be a number"));
        };
        let r = if round_up { d.ceil() } else { d.floor() };
        // x86-64's conversion, which upstream's cast compiles to, gives i64::MIN out of range
        let in_range = (-(2f64.powi(63))..2f64.powi(63)).contains(&r);
        Ok(if in_range { r as i64 } else { i64::MIN })
    }

    fn format(schema: &Value, path: &str) -> Result<StringFormat, String> {
        let Some(value) = schema.get("format") else {
            return Ok(StringFormat::None);
        };
        let Some(format) = value.as_str() else {
            return read_fail(path, "format must be a string");
        };
        Ok(match format {
            "date" => StringFormat::Date,
            "time" => StringFormat::Time,
            "date-time" => StringFormat::DateTime,
            "uuid" | "uuid1" | "uuid2" | "uuid3" | "uuid4" | "uuid5" => StringFormat::Uuid,
            _ => StringFormat::None,
        })
    }

    /// The node a local `$ref` points at: `/`-separated keys, or indexes into arrays.
    fn target(&self, reference: &str, path: &str) -> Result<&'a Value, String> {
        let mut target = self.root;
        for sel in reference[1..].split('/').skip(1) {
            if let Some(next) = target.as_object().and_then(|o| o.get(sel)) {
                target = next;
            } else if let Some(items) = target.as_array() {
                match parse_index(sel).and_then(|i| items.get(i)) {
                    Some(next) => target = next,
                    None => {
                        return read_fail(
                            path,
                            &format!("cannot resolve $ref {reference}, {sel} is out of range"),
                        )
                    }
                }
            } else {
                return read_fail(
                    path,
                    &format!("cannot resolve $ref {reference}, {sel} not found"),
                );
            }
        }
        Ok(target)
    }

    fn reference(&mut self, value: &Value, path: &str) -> ReadResult {
        let Some(reference) = value.as_str() else {
            return read_fail(path, "$ref must be a string");
        };
        if !reference.starts_with("#/") {
            return read_fail(
                path,
                &format!(
                    "unsupported $ref {reference}, only references into the same document are supported"
                ),
            );
        }
        if !self.refs.contains_key(reference) {
            self.refs.insert(reference.to_string(), None);
            let target = self.target(reference, path)?;
            let node = self.node(target, reference)?;
            self.refs.insert(reference.to_string(), Some(node));
        }
        Ok(Schema::Ref(reference.to_string()))
    }

    fn alternatives(&mut self, alts: &Value, path: &str) -> Result<Vec<Schema>, String> {
        let Some(alts) = alts.as_array() else {
            return read_fail(path, "must be an array of schemas");
        };
        if alts.is_empty() {
            return read_fail(path, "must not be empty");
        }
        alts.iter()
            .enumerate()
            .map(|(i, alt)| self.node(alt, &format!("{path}/{i}")))
            .collect()
    }

    fn object(&mut self, schema: &Value, path: &str) -> ReadResult {
        let required: HashSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut properties = Vec::new();
        if let Some(props) = schema.get("properties") {
            let Some(props) = props.as_object() else {
                return read_fail(path, "properties must be an object");
            };
            for (name, prop) in props {
                properties.push(Property {
                    name: name.clone(),
                    schema: self.node(prop, &format!("{path}/properties/{name}"))?,
                    required: required.contains(name.as_str()),
                });
            }
        }
        let additional = match schema.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(Box::new(Schema::Any)),
            Some(Value::Bool(false)) => None,
            Some(extra @ Value::Object(_)) => Some(Box::new(
                self.node(extra, &format!("{path}/additionalProperties"))?,
            )),
            Some(_) => {
                return read_fail(path, "additionalProperties must be a boolean or a schema")
            }
            // {"type": "object"} on its own accepts any object
            None if schema.get("properties").is_none() => Some(Box::new(Schema::Any)),
            None => None,
        };
        Ok(Schema::Object {
            properties,
            additional,
        })
    }

    fn array(&mut self, schema: &Value, path: &str) -> ReadResult {
        // "items" wins over "prefixItems"; either as an array is a tuple, as a schema the item schema
        let items_key = ["items", "prefixItems"]
            .into_iter()
            .find(|k| schema.get(*k).is_some());
        let items = match items_key.map(|k| (k, &schema[k])) {
            Some((key, Value::Array(tuple))) => {
                return tuple
                    .iter()
                    .enumerate()
                    .map(|(i, item)| self.node(item, &format!("{path}/{key}/{i}")))
                    .collect::<Result<_, _>>()
                    .map(Schema::Tuple)
            }
            Some((key, items)) => self.node(items, &format!("{path}/{key}"))?,
            None => Schema::Any,
        };
        Ok(Schema::Array {
            items: Box::new(items),
            min_items: Self::count(schema, "minItems", path, 0)?,
            max_items: Self::count(schema, "maxItems", path, -1)?,
        })
    }

    fn string(schema: &Value, path: &str) -> ReadResult {
        let pattern = match schema.get("pattern") {
            None => String::new(),
            Some(Value::String(p)) => p.clone(),
            Some(_) => return read_fail(path, "pattern must be a string"),
        };
        Ok(Schema::String {
            pattern,
            format: Self::format(schema, path)?,
            min_length: Self::count(schema, "minLength", path, 0)?,
            max_length: Self::count(schema, "maxLength", path, -1)?,
        })
    }

    fn integer(schema: &Value, path: &str) -> ReadResult {
        let mut minimum = i64::MIN;
        let mut maximum = i64::MAX;
        if let Some(v) = schema.get("minimum") {
            minimum = Self::bound(v, "minimum", path, true)?;
        } else if let Some(v) = schema.get("exclusiveMinimum") {
            minimum = Self::bound(v, "exclusiveMinimum", path, false)?.wrapping_add(1);
        }
        if let Some(v) = schema.get("maximum") {
            maximum = Self::bound(v, "maximum", path, false)?;
        } else if let Some(v) = schema.get("exclusiveMaximum") {
            maximum = Self::bound(v, "exclusiveMaximum", path, true)?.wrapping_sub(1);
        }
        Ok(Schema::Integer { minimum, maximum })
    }

    fn node(&mut self, schema: &Value, path: &str) -> ReadResult {
        let Some(obj) = schema.as_object() else {
            return read_fail(path, "schema must be an object");
        };
        if let Some(reference) = obj.get("$ref") {
            return self.reference(reference, path);
        }
        if let Some(key) = ["oneOf", "anyOf"]
            .into_iter()
            .find(|k| obj.contains_key(*k))
        {
            return Ok(Schema::AnyOf(
                self.alternatives(&obj[key], &format!("{path}/{key}"))?,
            ));
        }
        let ty = obj.get("type").unwrap_or(&Value::Null);
        if let Value::Array(types) = ty {
            // {"type": ["a", "b"], ...} is {"anyOf": [{"type": "a", ...}, {"type": "b", ...}]}
            if types.is_empty() {
                return read_fail(path, "type must not be empty");
            }
            let mut alts = Vec::with_capacity(types.len());
            for (i, t) in types.iter().enumerate() {
                let mut alt = obj.clone();
                alt.insert("type".into(), t.clone());
                alts.push(self.node(&Value::Object(alt), &format!("{path}/type/{i}"))?);
            }
            return Ok(Schema::AnyOf(alts));
        }
        if let Some(value) = obj.get("const") {
            return Ok(Schema::Const(value.clone()));
        }
        if let Some(values) = obj.get("enum") {
            return match values.as_array() {
                Some(values) if !values.is_empty() => Ok(Schema::Enum(values.clone())),
                _ => read_fail(path, "enum must be a non-empty array"),
            };
        }
        let type_name = match ty {
            Value::Null => "",
            Value::String(s) => s.as_str(),
            _ => return read_fail(path, "type must be a string or an array of strings"),
        };
        let has_properties = obj.contains_key("properties")
            || obj
                .get("additionalProperties")
                .is_some_and(|a| *a != Value::Bool(true));
        match type_name {
            // without a type the structural keywords decide, in the converter's order
            "" if has_properties => self.object(schema, path),
            "" if obj.contains_key("allOf") => Ok(Schema::AllOf(
                self.alternatives(&obj["allOf"], &format!("{path}/allOf"))?,
            )),
            "" if obj.contains_key("items") || obj.contains_key("prefixItems") => {
                self.array(schema, path)
            }
            "" if obj.contains_key("pattern")
                || obj.contains_key("minLength")
                || obj.contains_key("maxLength")
                || Self::format(schema, path)? != StringFormat::None =>
            {
                Self::string(schema, path)
            }
            "" => Ok(Schema::Any),
            "object" if !has_properties && obj.contains_key("allOf") => Ok(Schema::AllOf(
                self.alternatives(&obj["allOf"], &format!("{path}/allOf"))?,
            )),
            "object" => self.object(schema, path),
            "string" if obj.contains_key("allOf") => Ok(Schema::AllOf(
                self.alternatives(&obj["allOf"], &format!("{path}/allOf"))?,
            )),
            "string" => Self::string(schema, path),
            "array" => self.array(schema, path),
            "integer" => Self::integer(schema, path),
            "number" => Ok(Schema::Number),
            "boolean" => Ok(Schema::Boolean),
            "null" => Ok(Schema::Null),
            other => read_fail(path, &format!("unrecognized type {other}")),
        }
    }
}

/// An array index as C's `strtoull` reads one (leading blanks, a sign, digits); `None` when it is
/// no number, or out of range.
fn parse_index(sel: &str) -> Option<usize> {
    let s = sel.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n: u64 = s[..digits].parse().ok()?;
    // a negative index wraps around to a huge one, out of range unless it is zero
    match (negative, n) {
        (true, 0) | (false, _) => usize::try_from(n).ok(),
        (true, _) => None,
    }
}

/// JSON text as nlohmann's `dump()` writes it: no blanks, keys in order, non-ASCII kept,
/// floats in their shortest round-trip digits.
pub fn dump_json(value: &Value) -> String {
    let mut out = String::new();
    write_json(value, &mut out);
    out
}

fn write_json(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) => write_float(f, out),
            _ => out.push_str("null"),
        },
        Value::String(s) => write_json_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_string(k, out);
                out.push(':');
                write_json(v, out);
            }
            out.push('}');
        }
    }
}

/// A JSON string as upstream's library writes it: `"`, `\\` and control characters escaped
/// (`\b \f \n \r \t`, else `\u00xx`), everything else as it is, which is serde_json's
/// escaping too.
fn write_json_string(s: &str, out: &mut String) {
    out.push_str(&Value::from(s).to_string());
}

/// nlohmann's float layout: plain decimals while the decimal point sits within 15 digits of the
/// front (`100.0`, `0.0001`), otherwise `d.ddde+XX` with at least two exponent digits.
fn write_float(f: f64, out: &mut String) {
    if !f.is_finite() {
        out.push_str("null");
        return;
    }
    if f.is_sign_negative() {
        out.push('-');
    }
    let f = f.abs();
    if f == 0.0 {
        out.push_str("0.0");
        return;
    }
    let (digits, exponent) = grisu2::digits(f);
    let digits = String::from_utf8_lossy(&digits).into_owned();
    let k = digits.len() as i32;
    // the value is 0.DIGITS times ten to the n
    let n = k + exponent;
    if k <= n && n <= 15 {
        out.push_str(&digits);
        out.push_str(&"0".repeat((n - k) as usize));
        out.push_str(".0");
    } else if 0 < n && n <= 15 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -4 < n && n <= 0 {
        out.push_str("0.");
        out.push_str(&"0".repeat((-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = n - 1;
        out.push_str(&format!("e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs()));
    }
}

/// Decimal digits of a double by Loitsch's Grisu2, as nlohmann's `dump()` produces them: they
/// read back to the same double but are not always the shortest such digits (6.70400438805688e17
/// comes out as 6.704004388056881e17), so a shortest-digits formatter would spell some constants
/// differently from upstream.
mod grisu2 {
    /// A 64-bit significand and a binary exponent: `f * 2^e`.
    #[derive(Clone, Copy)]
    struct DiyFp {
        f: u64,
        e: i32,
    }

    impl DiyFp {
        /// The upper 64 bits of the product, rounded half up.
        fn mul(self, y: DiyFp) -> DiyFp {
            let p = u128::from(self.f) * u128::from(y.f);
            let h = (p >> 64) as u64 + ((p >> 63) & 1) as u64;
            DiyFp {
                f: h,
                e: self.e + y.e + 64,
            }
        }

        fn normalize(mut self) -> DiyFp {
            let shift = self.f.leading_zeros();
            self.f <<= shift;
            self.e -= shift as i32;
            self
        }
    }

    /// 10^k for k = -300, -292, ..., 324 as `(f, e, k)` with 10^k ~ f * 2^e, f the 64-bit
    /// significand rounded to nearest.
    const CACHED_POWERS: [(u64, i32, i32); 79] = [
        (0xAB70FE17C79AC6CA, -1060, -300),
        (0xFF77B1FCBEBCDC4F, -1034, -292),
        (0xBE5691EF416BD60C, -1007, -284),
        (0x8DD01FAD907FFC3C, -980, -276),
        (0xD3515C2831559A83, -954, -268),
        (0x9D71AC8FADA6C9B5, -927, -260),
        (0xEA9C227723EE8BCB, -901, -252),
        (0xAECC49914078536D, -874, -244),
        (0x823C12795DB6CE57, -847, -236),
        (0xC21094364DFB5637, -821, -228),
        (0x9096EA6F3848984F, -794, -220),
        (0xD77485CB25823AC7, -768, -212),
        (0xA086CFCD97BF97F4, -741, -204),
        (0xEF340A98172AACE5, -715, -196),
        (0xB23867FB2A35B28E, -688, -188),
        (0x84C8D4DFD2C63F3B, -661, -180),
        (0xC5DD44271AD3CDBA, -635, -172),
        (0x936B9FCEBB25C996, -608, -164),
        (0xDBAC6C247D62A584, -582, -156),
        (0xA3AB66580D5FDAF6, -555, -148),
        (0xF3E2F893DEC3F126, -529, -140),
        (0xB5B5ADA8AAFF80B8, -502, -132),
        (0x87625F056C7C4A8B, -475, -124),
        (0xC9BCFF6034C13053, -449, -116),
        (0x964E858C91BA2655, -422, -108),
        (0xDFF9772470297EBD, -396, -100),
        (0xA6DFBD9FB8E5B88F, -369, -92),
        (0xF8A95FCF88747D94, -343, -84),
        (0xB94470938FA89BCF, -316, -76),
        (0x8A08F0F8BF0F156B, -289, -68),
        (0xCDB02555653131B6, -263, -60),
        (0x993FE2C6D07B7FAC, -236, -52),
        (0xE45C10C42A2B3B06, -210, -44),
        (0xAA242499697392D3, -183, -36),
        (0xFD87B5F28300CA0E, -157, -28),
        (0xBCE5086492111AEB, -130, -20),
        (0x8CBCCC096F5088CC, -103, -12),
        (0xD1B71758E219652C, -77, -4),
        (0x9C40000000000000, -50, 4),
        (0xE8D4A51000000000, -24, 12),
        (0xAD78EBC5AC620000, 3, 20),
        (0x813F3978F8940984, 30, 28),
        (0xC097CE7BC90715B3, 56, 36),
        (0x8F7E32CE7BEA5C70, 83, 44),
        (0xD5D238A4ABE98068, 109, 52),
        (0x9F4F2726179A2245, 136, 60),
        (0xED63A231D4C4FB27, 162, 68),
        (0xB0DE65388CC8ADA8, 189, 76),
        (0x83C7088E1AAB65DB, 216, 84),
        (0xC45D1DF942711D9A, 242, 92),
        (0x924D692CA61BE758, 269, 100),
        (0xDA01EE641A708DEA, 295, 108),
        (0xA26DA3999AEF774A, 322, 116),
        (0xF209787BB47D6B85, 348, 124),
        (0xB454E4A179DD1877, 375, 132),
        (0x865B86925B9BC5C2, 402, 140),
        (0xC83553C5C8965D3D, 428, 148),
        (0x952AB45CFA97A0B3, 455, 156),
        (0xDE469FBD99A05FE3, 481, 164),
        (0xA59BC234DB398C25, 508, 172),
        (0xF6C69A72A3989F5C, 534, 180),
        (0xB7DCBF5354E9BECE, 561, 188),
        (0x88FCF317F22241E2, 588, 196),
        (0xCC20CE9BD35C78A5, 614, 204),
        (0x98165AF37B2153DF, 641, 212),
        (0xE2A0B5DC971F303A, 667, 220),
        (0xA8D9D1535CE3B396, 694, 228),
        (0xFB9B7CD9A4A7443C, 720, 236),
        (0xBB764C4CA7A44410, 747, 244),
        (0x8BAB8EEFB6409C1A, 774, 252),
        (0xD01FEF10A657842C, 800, 260),
        (0x9B10A4E5E9913129, 827, 268),
        (0xE7109BFBA19C0C9D, 853, 276),
        (0xAC2820D9623BF429, 880, 284),
        (0x80444B5E7AA7CF85, 907, 292),
        (0xBF21E44003ACDD2D, 933, 300),
        (0x8E679C2F5E44FF8F, 960, 308),
        (0xD433179D9C8CB841, 986, 316),
        (0x9E19DB92B4E31BA9, 1013, 324),
    ];

    /// The target range of the scaled exponent, as Grisu2 with 64-bit significands uses it.
    const ALPHA: i32 = -60;

    /// The digits of positive finite `value` and the power of ten they are scaled by.
    pub(super) fn digits(value: f64) -> (Vec<u8>, i32) {
        let bits = value.to_bits();
        let biased = (bits >> 52) as i32;
        let fraction = bits & ((1 << 52) - 1);
        let v = if biased == 0 {
            DiyFp {
                f: fraction,
                e: -1074,
            }
        } else {
            DiyFp {
                f: fraction | (1 << 52),
                e: biased - 1075,
            }
        };
        let lower_closer = fraction == 0 && biased > 1;
        let m_plus = DiyFp {
            f: 2 * v.f + 1,
            e: v.e - 1,
        }
        .normalize();
        let m_minus = if lower_closer {
            DiyFp {
                f: 4 * v.f - 1,
                e: v.e - 2,
            }
        } else {
            DiyFp {
                f: 2 * v.f - 1,
                e: v.e - 1,
            }
        };
        let m_minus = DiyFp {
            f: m_minus.f << (m_minus.e - m_plus.e),
            e: m_plus.e,
        };
        let v = v.normalize();

        let f = ALPHA - m_plus.e - 1;
        let k = (f * 78913) / (1 << 18) + i32::from(f > 0);
        let (cf, ce, ck) = CACHED_POWERS[((300 + k + 7) / 8) as usize];
        let c = DiyFp { f: cf, e: ce };
        let w = v.mul(c);
        let w_minus = m_minus.mul(c);
        let w_plus = m_plus.mul(c);
        let lo = DiyFp {
            f: w_minus.f + 1,
            e: w_minus.e,
        };
        let hi = DiyFp {
            f: w_plus.f - 1,
            e: w_plus.e,
        };
        let mut digits = Vec::with_capacity(17);
        let exponent = generate(&mut digits, -ck, lo, w, hi);
        (digits, exponent)
    }

    /// Digits of a number within [lo, hi], as close to w as the last digit allows; returns the
    /// decimal exponent, starting from `exponent`.
    fn generate(buf: &mut Vec<u8>, mut exponent: i32, lo: DiyFp, w: DiyFp, hi: DiyFp) -> i32 {
        let mut delta = hi.f - lo.f;
        let mut dist = hi.f - w.f;
        let shift = -hi.e as u32;
        let one = 1u64 << shift;
        let mut p1 = (hi.f >> shift) as u32;
        let mut p2 = hi.f & (one - 1);

        let mut n = p1.checked_ilog10().map_or(1, |d| d + 1);
        let mut pow10 = 10u32.pow(n - 1);
        while n > 0 {
            buf.push(b'0' + (p1 / pow10) as u8);
            p1 %= pow10;
            n -= 1;
            let rest = (u64::from(p1) << shift) + p2;
            if rest <= delta {
                exponent += n as i32;
                round(buf, dist, delta, rest, u64::from(pow10) << shift);
                return exponent;
            }
            pow10 /= 10;
        }
        let mut m = 0;
        loop {
            p2 *= 10;
            buf.push(b'0' + (p2 >> shift) as u8);
            p2 &= one - 1;
            m += 1;
            delta *= 10;
            dist *= 10;
            if p2 <= delta {
                break;
            }
        }
        round(buf, dist, delta, p2, one);
        exponent - m
    }

    /// Moves the last digit down while that brings the number closer to w and keeps it in range.
    fn round(buf: &mut [u8], dist: u64, delta: u64, mut rest: u64, ten_k: u64) {
        let Some(last) = buf.last_mut() else {
            return;
        };
        while rest < dist
            && delta - rest >= ten_k
            && (rest + ten_k < dist || dist - rest > rest + ten_k - dist)
        {
            *last -= 1;
            rest += ten_k;
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn cached_powers_are_powers_of_ten() {
            for &(f, e, k) in CACHED_POWERS.iter().filter(|p| (0..=36).contains(&p.2)) {
                let exact = 10u128.pow(k as u32);
                let scaled = if e >= 0 { exact >> e } else { exact << -e };
                let rounded = if e > 0 {
                    scaled + ((exact >> (e - 1)) & 1)
                } else {
                    scaled
                };
                assert_eq!(rounded, u128::from(f), "10^{k}");
            }
        }

        #[test]
        fn digits_read_back_to_the_value() {
            for v in [
                1.0,
                0.1,
                1.0 / 3.0,
                6.70400438805688e17,
                5e-324,
                f64::MAX,
                123.456,
            ] {
                let (digits, exp) = digits(v);
                let text = format!("{}e{exp}", String::from_utf8_lossy(&digits));
                assert_eq!(text.parse::<f64>().ok(), Some(v), "{text}");
            }
            assert_eq!(
                digits(6.70400438805688e17),
                (b"6704004388056881".to_vec(), 2)
            );
        }
    }
}

/// `literal` as a quoted GBNF string literal (upstream's `gbnf_format_literal`).
pub fn format_literal(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len() + 2);
    out.push('"');
    for c in literal.chars() {
        match c {
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The whitespace allowed between JSON tokens: nothing, a blank, or up to two newlines and indent.
const SPACE_RULE: &str = "| \" \" | \"\\n\"{1,2} [ \\t]{0,20}";

/// A fixed rule and the fixed rules it uses.
struct BuiltinRule {
    name: &'static str,
    content: &'static str,
    deps: &'static [&'static str],
}

const PRIMITIVE_RULES: &[BuiltinRule] = &[
    BuiltinRule { name: "boolean", content: "(\"true\" | \"false\")", deps: &[] },
    BuiltinRule { name: "decimal-part", content: "[0-9]{1,16}", deps: &[] },
    BuiltinRule { name: "integral-part", content: "[0] | [1-9] [0-9]{0,15}", deps: &[] },
    BuiltinRule {
        name: "number",
        content: "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)?",
        deps: &["integral-part", "decimal-part"],
    },
    BuiltinRule { name: "integer", content: "(\"-\"? integral-part)", deps: &["integral-part"] },
    BuiltinRule {
        name: "value",
        content: "object | array | string | number | boolean | null",
        deps: &["object", "array", "string", "number", "boolean", "null"],
    },
    BuiltinRule {
        name: "object",
        content: "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? space \"}\"",
        deps: &["string", "value"],
    },
    BuiltinRule {
        name: "array",
        content: "\"[\" space ( value (\",\" space value)* )? space \"]\"",
        deps: &["value"],
    },
    BuiltinRule {
        name: "uuid",
        content: "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12} \"\\\"\"",
        deps: &[],
    },
    BuiltinRule {
        name: "char",
        content: "[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})",
        deps: &[],
    },
    BuiltinRule { name: "string", content: "\"\\\"\" char* \"\\\"\"", deps: &["char"] },
    BuiltinRule { name: "null", content: "\"null\"", deps: &[] },
];

const STRING_FORMAT_RULES: &[BuiltinRule] = &[
    BuiltinRule {
        name: "date",
        content: "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] )",
        deps: &[],
    },
    BuiltinRule {
        name: "time",
        content: "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{3} )? ( \"Z\" | ( \"+\" | \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )",
        deps: &[],
    },
    BuiltinRule { name: "date-time", content: "date \"T\" time", deps: &["date", "time"] },
    BuiltinRule { name: "date-string", content: "\"\\\"\" date \"\\\"\"", deps: &["date"] },
    BuiltinRule { name: "time-string", content: "\"\\\"\" time \"\\\"\"", deps: &["time"] },
    BuiltinRule {
        name: "date-time-string",
        content: "\"\\\"\" date-time \"\\\"\"",
        deps: &["date-time"],
    },
];

fn builtin(name: &str) -> &'static BuiltinRule {
    PRIMITIVE_RULES
        .iter()
        .chain(STRING_FORMAT_RULES)
        .find(|r| r.name == name)
        .unwrap_or_else(|| {
            panic!("no built-in rule {name}: the tables above name only their own rules")
        })
}

fn is_reserved_name(name: &str) -> bool {
    name == "root"
        || PRIMITIVE_RULES
            .iter()
            .chain(STRING_FORMAT_RULES)
            .any(|r| r.name == name)
}

/// Every run of characters a rule name cannot hold becomes one `-`.
fn sanitize_rule_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('-');
            in_run = true;
        }
    }
    out
}

/// Joins `item` repeated between `min` and `max` times (`i32::MAX`: no bound), optionally
/// separated by `separator`.
fn build_repetition(item: &str, min: i32, max: i32, separator: &str) -> String {
    let has_max = max != i32::MAX;
    if max == 0 {
        return String::new();
    }
    if min == 0 && max == 1 {
        return format!("{item}?");
    }
    if separator.is_empty() {
        return match (min, has_max) {
            (1, false) => format!("{item}+"),
            (0, false) => format!("{item}*"),
            _ => format!(
                "{item}{{{min},{}}}",
                if has_max {
                    max.to_string()
                } else {
                    String::new()
                }
            ),
        };
    }
    let rest = build_repetition(
        &format!("({separator} {item})"),
        if min == 0 { 0 } else { min - 1 },
        if has_max { max - 1 } else { max },
        "",
    );
    let result = format!("{item} {rest}");
    if min == 0 {
        format!("({result})?")
    } else {
        result
    }
}

/// Digit-by-digit rules for integers within bounds, following upstream's construction.
struct IntRange {
    out: String,
}

const NO_MIN: i64 = i64::MIN;
const NO_MAX: i64 = i64::MAX;

impl IntRange {
    fn digit_range(&mut self, from: u8, to: u8) {
        self.out.push('[');
        self.out.push(from as char);
        if from != to {
            self.out.push('-');
            self.out.push(to as char);
        }
        self.out.push(']');
    }

    fn more_digits(&mut self, min: i32, max: i32) {
        self.out.push_str("[0-9]");
        if min == max && min == 1 {
            return;
        }
        self.out.push('{');
        self.out.push_str(&min.to_string());
        if max != min {
            self.out.push(',');
            if max != i32::MAX {
                self.out.push_str(&max.to_string());
            }
        }
        self.out.push('}');
    }

    /// Numbers from `from` to `to`, two digit strings of the same length.
    fn uniform_range(&mut self, from: &[u8], to: &[u8]) {
        let i = from.iter().zip(to).take_while(|(a, b)| a == b).count();
        if i > 0 {
            self.out.push('"');
            self.out.push_str(&String::from_utf8_lossy(&from[..i]));
            self.out.push('"');
        }
        if i >= from.len() || i >= to.len() {
            return;
        }
        if i > 0 {
            self.out.push(' ');
        }
        let sub_len = from.len() - i - 1;
        if sub_len == 0 {
            self.out.push('[');
            self.out.push(from[i] as char);
            self.out.push('-');
            self.out.push(to[i] as char);
            self.out.push(']');
            return;
        }
        let from_sub = &from[i + 1..];
        let to_sub = &to[i + 1..];
        let zeros = vec![b'0'; sub_len];
        let nines = vec![b'9'; sub_len];
        let width = sub_len as i32;
        let mut to_reached = false;
        self.out.push('(');
        if from_sub == zeros.as_slice() {
            self.digit_range(from[i], to[i].wrapping_sub(1));
            self.out.push(' ');
            self.more_digits(width, width);
        } else {
            self.out.push('[');
            self.out.push(from[i] as char);
            self.out.push_str("] (");
            self.uniform_range(from_sub, &nines);
            self.out.push(')');
            if (from[i] as i32) < to[i] as i32 - 1 {
                self.out.push_str(" | ");
                if to_sub == nines.as_slice() {
                    self.digit_range(from[i] + 1, to[i]);
                    to_reached = true;
                } else {
                    self.digit_range(from[i] + 1, to[i] - 1);
                }
                self.out.push(' ');
                self.more_digits(width, width);
            }
        }
        if !to_reached {
            self.out.push_str(" | ");
            self.digit_range(to[i], to[i]);
            self.out.push(' ');
            self.uniform_range(&zeros, to_sub);
        }
        self.out.push(')');
    }

    fn build(
        &mut self,
        mut min: i64,
        max: i64,
        decimals_left: i32,
        top_level: bool,
    ) -> Result<(), String> {
        let has_min = min != NO_MIN;
        let has_max = max != NO_MAX;
        if has_min && has_max {
            if min < 0 && max < 0 {
                self.out.push_str("\"-\" (");
                self.build(max.wrapping_neg(), min.wrapping_neg(), decimals_left, true)?;
                self.out.push(')');
                return Ok(());
            }
            if min < 0 {
                self.out.push_str("\"-\" (");
                self.build(0, min.wrapping_neg(), decimals_left, true)?;
                self.out.push_str(") | ");
                min = 0;
            }
            let mut min_s = min.to_string().into_bytes();
            let max_s = max.to_string().into_bytes();
            for digits in min_s.len()..max_s.len() {
                self.uniform_range(&min_s, &vec![b'9'; digits]);
                min_s = format!("1{}", "0".repeat(digits)).into_bytes();
                self.out.push_str(" | ");
            }
            self.uniform_range(&min_s, &max_s);
            return Ok(());
        }

        let less_decimals = (decimals_left - 1).max(1);
        if has_min {
            if min < 0 {
                self.out.push_str("\"-\" (");
                self.build(NO_MIN, min.wrapping_neg(), decimals_left, false)?;
                self.out.push_str(") | [0] | [1-9] ");
                self.more_digits(0, decimals_left - 1);
            } else if min == 0 {
                if top_level {
                    self.out.push_str("[0] | [1-9] ");
                    self.more_digits(0, less_decimals);
                } else {
                    self.more_digits(1, decimals_left);
                }
            } else if min <= 9 {
                let c = b'0' + min as u8;
                let range_start = if top_level { b'1' } else { b'0' };
                if c > range_start {
                    self.digit_range(range_start, c - 1);
                    self.out.push(' ');
                    self.more_digits(1, less_decimals);
                    self.out.push_str(" | ");
                }
                self.digit_range(c, b'9');
                self.out.push(' ');
                self.more_digits(0, less_decimals);
            } else {
                let min_s = min.to_string();
                let len = min_s.len() as i32;
                let c = min_s.as_bytes()[0];
                if c > b'1' {
                    self.digit_range(if top_level { b'1' } else { b'0' }, c - 1);
                    self.out.push(' ');
                    self.more_digits(len, less_decimals);
                    self.out.push_str(" | ");
                }
                self.digit_range(c, c);
                self.out.push_str(" (");
                let rest = min_s[1..].parse::<i64>().unwrap_or(0);
                self.build(rest, NO_MAX, less_decimals, false)?;
                self.out.push(')');
                if c < b'9' {
                    self.out.push_str(" | ");
                    self.digit_range(c + 1, b'9');
                    self.out.push(' ');
                    self.more_digits(len - 1, less_decimals);
                }
            }
            return Ok(());
        }
        if has_max {
            if max >= 0 {
                if top_level {
                    self.out.push_str("\"-\" [1-9] ");
                    self.more_digits(0, less_decimals);
                    self.out.push_str(" | ");
                }
                self.build(0, max, decimals_left, true)?;
            } else {
                self.out.push_str("\"-\" (");
                self.build(max.wrapping_neg(), NO_MAX, decimals_left, false)?;
                self.out.push(')');
            }
            return Ok(());
        }
        // reached from a bound of i64::MIN, whose negation is itself
        Err("At least one of min_value or max_value must be set".into())
    }
}

/// Why a `pattern` was not converted: one upstream cannot express (the string is then left
/// unconstrained, with a warning), or one that is no valid regular expression (an error).
enum PatternFailure {
    Unsupported(String),
    Invalid(String),
}

/// Upstream's bound on group nesting in a pattern.
const MAX_PATTERN_DEPTH: usize = 100;

const NON_LITERAL: &[u8] = b"|.()[]{}*+?^$";
/// Characters a pattern escapes that a GBNF literal holds as they are.
const ESCAPED_IN_REGEX_ONLY: &[u8] = b"^$.[]()|{}*+?";

/// The length of the GBNF-compatible escape at `pos` (`\x41`, `\u00e9`, `\n`, `\-`, ...), 0 for
/// one GBNF cannot read.
fn gbnf_escape_length(pattern: &[u8], pos: usize) -> usize {
    if pos + 1 >= pattern.len() || pattern[pos] != b'\\' {
        return 0;
    }
    let n_hex = match pattern[pos + 1] {
        b'x' => 2,
        b'u' => 4,
        b'U' => 8,
        // the escapes the GBNF reader accepts
        b't' | b'r' | b'n' | b'\\' | b'"' | b'[' | b']' | b'-' => return 2,
        _ => return 0,
    };
    match pattern.get(pos + 2..pos + 2 + n_hex) {
        Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => 2 + n_hex,
        _ => 0,
    }
}

/// Up to two bytes of `bytes` from `at`, for messages.
fn snippet(bytes: &[u8], at: usize) -> String {
    String::from_utf8_lossy(&bytes[at..(at + 2).min(bytes.len())]).into_owned()
}

/// C's `stoi`: leading blanks, an optional sign, then at least one digit; the rest is ignored.
fn parse_c_int(s: &str) -> Option<i32> {
    let s = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'-') => (-1i64, &s[1..]),
        Some(b'+') => (1, &s[1..]),
        _ => (1, s),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let n: i64 = rest[..digits].parse().ok()?;
    i32::try_from(sign * n).ok()
}

/// A piece of a pattern being converted: literal text (to be quoted) or grammar text.
type Piece = (String, bool);

fn piece_rule((text, is_literal): &Piece) -> String {
    if *is_literal {
        format!("\"{text}\"")
    } else {
        text.clone()
    }
}

/// Consecutive literals merged, the pieces joined by blanks.
fn join_pieces(seq: Vec<Piece>) -> Piece {
    let mut rules = Vec::new();
    let mut literal = String::new();
    for (text, is_literal) in seq {
        if is_literal {
            literal.push_str(&text);
        } else {
            if !literal.is_empty() {
                rules.push(piece_rule(&(std::mem::take(&mut literal), true)));
            }
            rules.push(text);
        }
    }
    if !literal.is_empty() {
        rules.push(piece_rule(&(literal, true)));
    }
    (rules.join(" "), false)
}

/// State of one pattern's conversion.
struct PatternReader<'p> {
    pattern: &'p [u8],
    i: usize,
    depth: usize,
    name: String,
    /// Rule names given to repeated groups, by their grammar text.
    sub_rule_ids: HashMap<String, String>,
}

/// Collects GBNF rules, as upstream's converter does, and writes them out sorted by name.
/// Upstream's `build_grammar` callback interface: `add_rule`, `add_schema`, then `finish`.
pub struct GrammarBuilder {
    dotall: bool,
    rules: BTreeMap<String, String>,
    refs_being_resolved: HashSet<String>,
    errors: Vec<String>,
    warnings: Vec<String>,
    /// An error that ends upstream's conversion at once, reported alone.
    fatal: Option<String>,
}

impl GrammarBuilder {
    /// `dotall`: whether `.` in patterns matches newlines too (upstream's `common_grammar_options`).
    pub fn new(dotall: bool) -> Self {
        let mut rules = BTreeMap::new();
        rules.insert("space".to_string(), SPACE_RULE.to_string());
        GrammarBuilder {
            dotall,
            rules,
            refs_being_resolved: HashSet::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
            fatal: None,
        }
    }

    /// Adds `rule` under `name` (made a valid rule name), or under the name with the first free
    /// number appended when another rule holds it; returns the name used.
    pub fn add_rule(&mut self, name: &str, rule: &str) -> String {
        let esc = sanitize_rule_name(name);
        if self.rules.get(&esc).is_none_or(|r| r == rule) {
            self.rules.insert(esc.clone(), rule.to_string());
            return esc;
        }
        let mut i = 0;
        while self
            .rules
            .get(&format!("{esc}{i}"))
            .is_some_and(|r| r != rule)
        {
            i += 1;
        }
        let key = format!("{esc}{i}");
        self.rules.insert(key.clone(), rule.to_string());
        key
    }

    /// Adds the rules for `node` of `doc` under `name` ("" or "root" for the grammar's root);
    /// returns the rule that matches it.
    pub fn add_schema(&mut self, name: &str, doc: &SchemaDocument, node: &Schema) -> String {
        self.visit(doc, node, if name == "root" { "" } else { name })
    }

    /// The grammar text, or upstream's failure when a pattern was invalid, a reference unresolved.
    pub fn finish(self) -> Result<String, SchemaError> {
        if let Some(fatal) = self.fatal {
            return Err(SchemaError::conversion(&fatal));
        }
        if !self.errors.is_empty() {
            return Err(SchemaError::conversion(&self.errors.join("\n")));
        }
        if !self.warnings.is_empty() {
            log::warn!(
                "JSON schema conversion was incomplete: {}",
                self.warnings.join("; ")
            );
        }
        let mut out = String::new();
        for (name, rule) in &self.rules {
            out.push_str(name);
            out.push_str(" ::= ");
            out.push_str(rule);
            out.push('\n');
        }
        Ok(out)
    }

    fn add_primitive(&mut self, name: &str, rule: &BuiltinRule) -> String {
        let n = self.add_rule(name, rule.content);
        for dep in rule.deps {
            if !self.rules.contains_key(*dep) {
                self.add_primitive(dep, builtin(dep));
            }
        }
        n
    }

    fn visit_primitive(&mut self, rule_name: &str, ty: &str) -> String {
        self.add_primitive(if rule_name == "root" { "root" } else { ty }, builtin(ty))
    }

    fn constant_rule(value: &Value) -> String {
        format_literal(&dump_json(value))
    }

    fn visit(&mut self, doc: &SchemaDocument, schema: &Schema, name: &str) -> String {
        let rule_name = if is_reserved_name(name) {
            format!("{name}-")
        } else if name.is_empty() {
            "root".to_string()
        } else {
            name.to_string()
        };
        let sub_name = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };

        match schema {
            Schema::Ref(reference) => {
                let target = self.resolve_ref(doc, reference);
                self.add_rule(&rule_name, &target)
            }
            Schema::AnyOf(alts) => {
                let union = self.union_rule(doc, name, alts);
                self.add_rule(&rule_name, &union)
            }
            Schema::AllOf(children) => self.visit_all_of(doc, children, name, &rule_name),
            Schema::Const(value) => self.add_rule(&rule_name, &Self::constant_rule(value)),
            Schema::Enum(values) => {
                let alts: Vec<String> = values.iter().map(Self::constant_rule).collect();
                self.add_rule(&rule_name, &format!("({})", alts.join(" | ")))
            }
            Schema::Object {
                properties,
                additional,
            } => {
                if properties.is_empty() && matches!(additional.as_deref(), Some(Schema::Any)) {
                    let object = self.add_primitive("object", builtin("object"));
                    return self.add_rule(&rule_name, &object);
                }
                let props: Vec<(&str, &Schema)> = properties
                    .iter()
                    .map(|p| (p.name.as_str(), &p.schema))
                    .collect();
                let required: HashSet<&str> = properties
                    .iter()
                    .filter(|p| p.required)
                    .map(|p| p.name.as_str())
                    .collect();
                let rule = self.object_rule(doc, &props, &required, name, additional.as_deref());
                self.add_rule(&rule_name, &rule)
            }
            Schema::Tuple(items) => {
                let mut rule = String::from("\"[\" space ");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        rule.push_str(" \",\" space ");
                    }
                    rule.push_str(&self.visit(doc, item, &format!("{sub_name}tuple-{i}")));
                }
                rule.push_str(" space \"]\"");
                self.add_rule(&rule_name, &rule)
            }
            Schema::Array {
                items,
                min_items,
                max_items,
            } => {
                if matches!(**items, Schema::Any) && *min_items == 0 && *max_items < 0 {
                    return self.visit_primitive(&rule_name, "array");
                }
                let item_rule = self.visit(doc, items, &format!("{sub_name}item"));
                let max = if *max_items < 0 { i32::MAX } else { *max_items };
                let rule = format!(
                    "\"[\" space {} space \"]\"",
                    build_repetition(&item_rule, *min_items, max, "\",\" space")
                );
                self.add_rule(&rule_name, &rule)
            }
            Schema::String {
                pattern,
                format,
                min_length,
                max_length,
            } => {
                if !pattern.is_empty() {
                    return self.visit_pattern(pattern, &rule_name);
                }
                let prim_name = match format {
                    StringFormat::Uuid => return self.visit_primitive(&rule_name, "uuid"),
                    StringFormat::Date => "date-string",
                    StringFormat::Time => "time-string",
                    StringFormat::DateTime => "date-time-string",
                    StringFormat::None => {
                        if *min_length > 0 || *max_length >= 0 {
                            let char_rule = self.add_primitive("char", builtin("char"));
                            let max = if *max_length < 0 {
                                i32::MAX
                            } else {
                                *max_length
                            };
                            let rule = format!(
                                "\"\\\"\" {} \"\\\"\"",
                                build_repetition(&char_rule, *min_length, max, "")
                            );
                            return self.add_rule(&rule_name, &rule);
                        }
                        return self.visit_primitive(&rule_name, "string");
                    }
                };
                let prim = self.add_primitive(prim_name, builtin(prim_name));
                self.add_rule(&rule_name, &prim)
            }
            Schema::Integer { minimum, maximum } => {
                if *minimum == NO_MIN && *maximum == NO_MAX {
                    return self.visit_primitive(&rule_name, "integer");
                }
                let mut range = IntRange {
                    out: String::from("("),
                };
                if let Err(e) = range.build(*minimum, *maximum, 16, true) {
                    self.fatal.get_or_insert(e);
                    return String::new();
                }
                range.out.push(')');
                self.add_rule(&rule_name, &range.out)
            }
            Schema::Number => self.visit_primitive(&rule_name, "number"),
            Schema::Boolean => self.visit_primitive(&rule_name, "boolean"),
            Schema::Null => self.visit_primitive(&rule_name, "null"),
            Schema::Any => {
                let value = self.add_primitive("value", builtin("value"));
                self.add_rule(&rule_name, &value)
            }
        }
    }

    fn union_rule(&mut self, doc: &SchemaDocument, name: &str, alts: &[Schema]) -> String {
        let rules: Vec<String> = alts
            .iter()
            .enumerate()
            .map(|(i, alt)| {
                let alt_name = if name.is_empty() {
                    format!("alternative-{i}")
                } else {
                    format!("{name}-{i}")
                };
                self.visit(doc, alt, &alt_name)
            })
            .collect();
        rules.join(" | ")
    }

    fn resolve_ref(&mut self, doc: &SchemaDocument, reference: &str) -> String {
        let fragment = reference.split_once('#').map_or(reference, |(_, f)| f);
        let mut ref_name = format!("ref{}", sanitize_rule_name(fragment));
        if !self.rules.contains_key(&ref_name) && !self.refs_being_resolved.contains(reference) {
            let Some(target) = doc.resolve(reference) else {
                self.errors.push(format!("Unresolved $ref {reference}"));
                return String::new();
            };
            self.refs_being_resolved.insert(reference.to_string());
            ref_name = self.visit(doc, target, &ref_name);
            self.refs_being_resolved.remove(reference);
        }
        ref_name
    }

    fn visit_all_of(
        &mut self,
        doc: &SchemaDocument,
        children: &[Schema],
        name: &str,
        rule_name: &str,
    ) -> String {
        let mut parts = AllOfParts::default();
        for child in children {
            if let Schema::AnyOf(alts) = child {
                for alt in alts {
                    parts.add(doc, alt, false, &mut HashSet::new());
                }
            } else {
                parts.add(doc, child, true, &mut HashSet::new());
            }
        }
        // the values every component allows, in upstream's (sorted) order
        let in_all: Vec<&str> = parts
            .enum_values
            .iter()
            .filter(|(_, count)| **count == children.len())
            .map(|(rule, _)| rule.as_str())
            .collect();
        if !in_all.is_empty() {
            return self.add_rule(rule_name, &format!("({})", in_all.join(" | ")));
        }
        let required: HashSet<&str> = parts.required.iter().map(String::as_str).collect();
        let rule = self.object_rule(doc, &parts.properties, &required, name, None);
        self.add_rule(rule_name, &rule)
    }

    /// The rule for an object: required properties in order, then any of the optional ones in
    /// order (each optional tail a `-rest` rule), then the additional ones.
    fn object_rule(
        &mut self,
        doc: &SchemaDocument,
        properties: &[(&str, &Schema)],
        required: &HashSet<&str>,
        name: &str,
        additional: Option<&Schema>,
    ) -> String {
        let prefix = if name.is_empty() {
            String::new()
        } else {
            format!("{name}-")
        };
        let mut required_props: Vec<String> = Vec::new();
        let mut optional_props: Vec<String> = Vec::new();
        let mut kv_rules: HashMap<String, String> = HashMap::new();
        let mut prop_names: Vec<String> = Vec::new();
        for (prop_name, prop_schema) in properties {
            let prop_rule = self.visit(doc, prop_schema, &format!("{prefix}{prop_name}"));
            let kv = format!(
                "{} space \":\" space {prop_rule}",
                format_literal(&dump_json(&Value::String(prop_name.to_string())))
            );
            let kv_name = self.add_rule(&format!("{prefix}{prop_name}-kv"), &kv);
            kv_rules.insert(prop_name.to_string(), kv_name);
            if required.contains(prop_name) {
                required_props.push(prop_name.to_string());
            } else {
                optional_props.push(prop_name.to_string());
            }
            prop_names.push(prop_name.to_string());
        }
        if let Some(extra) = additional {
            let sub_name = format!("{prefix}additional");
            let value_rule = if matches!(extra, Schema::Any) {
                self.add_primitive("value", builtin("value"))
            } else {
                self.visit(doc, extra, &format!("{sub_name}-value"))
            };
            let key_rule = if prop_names.is_empty() {
                self.add_primitive("string", builtin("string"))
            } else {
                let not_names = self.not_strings(&prop_names);
                self.add_rule(&format!("{sub_name}-k"), &not_names)
            };
            let kv = self.add_rule(
                &format!("{sub_name}-kv"),
                &format!("{key_rule} \":\" space {value_rule}"),
            );
            kv_rules.insert("*".into(), kv);
            optional_props.push("*".into());
        }

        if required_props.is_empty() && optional_props.is_empty() {
            return "\"{\" space \"}\"".into();
        }
        let mut rule = String::from("\"{\" space ");
        let required_kvs: Vec<&str> = required_props
            .iter()
            .map(|p| kv_rules[p].as_str())
            .collect();
        rule.push_str(&required_kvs.join(" \",\" space "));
        if !optional_props.is_empty() {
            rule.push_str(" (");
            if !required_props.is_empty() {
                rule.push_str(" \",\" space ( ");
            }
            let alts: Vec<String> = (0..optional_props.len())
                .map(|i| self.optional_tail(&optional_props[i..], false, &kv_rules, &prefix))
                .collect();
            rule.push_str(&alts.join(" | "));
            if !required_props.is_empty() {
                rule.push_str(" )");
            }
            rule.push_str(" )?");
        }
        rule.push_str(" space \"}\"");
        rule
    }

    /// The optional properties `keys` in order, the first one present unless `first_is_optional`.
    fn optional_tail(
        &mut self,
        keys: &[String],
        first_is_optional: bool,
        kv_rules: &HashMap<String, String>,
        prefix: &str,
    ) -> String {
        let Some((k, rest)) = keys.split_first() else {
            return String::new();
        };
        let kv = &kv_rules[k];
        let comma_ref = format!("( \",\" space {kv} )");
        let mut res = match (first_is_optional, k == "*") {
            (true, true) => format!("{comma_ref}*"),
            (true, false) => format!("{comma_ref}?"),
            (false, true) => format!("{kv} {comma_ref}*"),
            (false, false) => kv.clone(),
        };
        if !rest.is_empty() {
            let tail = self.optional_tail(rest, true, kv_rules, prefix);
            let tail_name = self.add_rule(&format!("{prefix}{k}-rest"), &tail);
            res.push(' ');
            res.push_str(&tail_name);
        }
        res
    }

    /// A rule for a JSON string that is none of `strings`, walking their trie: at each node,
    /// either one of the next characters (and on), or any other character and then anything.
    fn not_strings(&mut self, strings: &[String]) -> String {
        let trie = Trie::new(strings);
        let char_rule = self.add_primitive("char", builtin("char"));
        let mut out = String::from("[\"] ( ");
        trie.write_exclusion(0, &char_rule, &mut out);
        out.push_str(" )");
        if !trie.nodes[0].terminal {
            out.push('?');
        }
        out.push_str(" [\"]");
        out
    }

    fn visit_pattern(&mut self, pattern: &str, name: &str) -> String {
        let snapshot = self.rules.clone();
        match self.pattern_to_rule(pattern, name) {
            Ok(rule) => rule,
            Err(PatternFailure::Unsupported(why)) => {
                self.rules = snapshot;
                self.warnings.push(format!(
                    "pattern {pattern} is not supported ({why}), accepting any string"
                ));
                let string = self.add_primitive("string", builtin("string"));
                self.add_rule(name, &string)
            }
            Err(PatternFailure::Invalid(why)) => {
                self.rules = snapshot;
                self.errors
                    .push(format!("Invalid pattern {pattern}: {why}"));
                String::new()
            }
        }
    }

    fn pattern_to_rule(&mut self, pattern: &str, name: &str) -> Result<String, PatternFailure> {
        let bytes = pattern.as_bytes();
        if bytes.len() < 2 || bytes[0] != b'^' || bytes[bytes.len() - 1] != b'$' {
            return Err(PatternFailure::Unsupported(
                "not anchored with '^' and '$'".into(),
            ));
        }
        let mut reader = PatternReader {
            pattern: &bytes[1..bytes.len() - 1],
            i: 0,
            depth: 0,
            name: name.to_string(),
            sub_rule_ids: HashMap::new(),
        };
        let rule = piece_rule(&self.pattern_sequence(&mut reader)?);
        if reader.depth != 0 {
            return Err(PatternFailure::Invalid("unbalanced parentheses".into()));
        }
        Ok(self.add_rule(name, &format!("\"\\\"\" ({rule}) \"\\\"\"")))
    }

    fn dot_rule(&mut self) -> String {
        let rule = if self.dotall {
            "[\\U00000000-\\U0010FFFF]"
        } else {
            "[^\\x0A\\x0D]"
        };
        self.add_rule("dot", rule)
    }

    /// Converts the pattern from the reader's position to the end of the current group.
    fn pattern_sequence(&mut self, r: &mut PatternReader) -> Result<Piece, PatternFailure> {
        use PatternFailure::{Invalid, Unsupported};
        let p = r.pattern;
        let len = p.len();
        let mut seq: Vec<Piece> = Vec::new();
        while r.i < len {
            let c = p[r.i];
            match c {
                b'.' => {
                    seq.push((self.dot_rule(), false));
                    r.i += 1;
                }
                b'(' => {
                    r.i += 1;
                    if r.i < len && p[r.i] == b'?' {
                        if r.i + 1 < len && p[r.i + 1] == b':' {
                            r.i += 2;
                        } else {
                            // lookaround, named group, inline flags, ...
                            return Err(Unsupported("unsupported group syntax".into()));
                        }
                    }
                    r.depth += 1;
                    if r.depth > MAX_PATTERN_DEPTH {
                        return Err(Unsupported("pattern nesting too deep".into()));
                    }
                    let inner = self.pattern_sequence(r)?;
                    seq.push((format!("({})", piece_rule(&inner)), false));
                }
                b')' => {
                    r.i += 1;
                    if r.depth == 0 {
                        return Err(Invalid("unbalanced parentheses".into()));
                    }
                    r.depth -= 1;
                    return Ok(join_pieces(seq));
                }
                b'^' | b'$' => return Err(Unsupported("anchor inside the pattern".into())),
                b'[' => {
                    let mut class = vec![b'['];
                    r.i += 1;
                    while r.i < len && p[r.i] != b']' {
                        if p[r.i] == b'\\' {
                            let n = gbnf_escape_length(p, r.i);
                            if n == 0 {
                                return Err(Unsupported(format!(
                                    "unsupported escape in character class: {}",
                                    snippet(p, r.i)
                                )));
                            }
                            class.extend_from_slice(&p[r.i..r.i + n]);
                            r.i += n;
                        } else {
                            class.push(p[r.i]);
                            r.i += 1;
                        }
                    }
                    if r.i >= len {
                        return Err(Invalid("unterminated character class".into()));
                    }
                    class.push(b']');
                    r.i += 1;
                    seq.push((String::from_utf8_lossy(&class).into_owned(), false));
                }
                b'|' => {
                    seq.push(("|".into(), false));
                    r.i += 1;
                }
                b'*' | b'+' | b'?' => {
                    let Some(last) = seq.last_mut() else {
                        return Err(Invalid("nothing to repeat".into()));
                    };
                    *last = (format!("{}{}", piece_rule(last), c as char), false);
                    r.i += 1;
                }
                b'{' => {
                    let start = r.i + 1;
                    r.i += 1;
                    while r.i < len && p[r.i] != b'}' {
                        r.i += 1;
                    }
                    if r.i >= len {
                        return Err(Unsupported("unterminated curly brackets".into()));
                    }
                    let inside = String::from_utf8_lossy(&p[start..r.i]).into_owned();
                    r.i += 1;
                    let (min, max) = repetition_bounds(&inside)?;
                    let Some(last) = seq.last_mut() else {
                        return Err(Invalid("nothing to repeat".into()));
                    };
                    let item = if last.1 {
                        format!("\"{}\"", last.0)
                    } else {
                        let next_id = r.sub_rule_ids.len() + 1;
                        match r.sub_rule_ids.get(&last.0) {
                            Some(id) => id.clone(),
                            None => {
                                let id = self.add_rule(&format!("{}-{next_id}", r.name), &last.0);
                                r.sub_rule_ids.insert(last.0.clone(), id.clone());
                                id
                            }
                        }
                    };
                    *last = (build_repetition(&item, min, max, ""), false);
                }
                _ => seq.push((Self::pattern_literal(r, c)?, true)),
            }
        }
        Ok(join_pieces(seq))
    }

    /// Reads literal characters; a character directly before a quantifier is left for the next
    /// piece, so that the quantifier applies to it alone.
    fn pattern_literal(r: &mut PatternReader, first: u8) -> Result<String, PatternFailure> {
        use PatternFailure::{Invalid, Unsupported};
        let p = r.pattern;
        let len = p.len();
        let is_non_literal = |b: u8| NON_LITERAL.contains(&b);
        let mut literal: Vec<u8> = Vec::new();
        while r.i < len {
            let b = p[r.i];
            if b == b'\\' {
                if r.i == len - 1 {
                    return Err(Invalid("trailing backslash".into()));
                }
                let next = p[r.i + 1];
                if ESCAPED_IN_REGEX_ONLY.contains(&next) {
                    literal.push(next);
                    r.i += 2;
                } else {
                    let n = gbnf_escape_length(p, r.i);
                    if n == 0 {
                        return Err(Unsupported(format!(
                            "unsupported escape: {}",
                            snippet(p, r.i)
                        )));
                    }
                    literal.extend_from_slice(&p[r.i..r.i + n]);
                    r.i += n;
                }
            } else if b == b'"' {
                literal.extend_from_slice(b"\\\"");
                r.i += 1;
            } else if !is_non_literal(b)
                && (r.i == len - 1
                    || literal.is_empty()
                    || p[r.i + 1] == b'.'
                    || !is_non_literal(p[r.i + 1]))
            {
                literal.push(b);
                r.i += 1;
            } else {
                break;
            }
        }
        if literal.is_empty() {
            // nothing was consumed, e.g. a stray ']' or '}'
            return Err(Unsupported(format!(
                "unsupported character: {}",
                first as char
            )));
        }
        Ok(String::from_utf8_lossy(&literal).into_owned())
    }
}

/// The bounds of `{n}`, `{n,}`, `{,m}` or `{n,m}` (`i32::MAX`: no upper bound).
fn repetition_bounds(inside: &str) -> Result<(i32, i32), PatternFailure> {
    let nums: Vec<&str> = inside.split(',').collect();
    let invalid = || PatternFailure::Unsupported("invalid number in curly brackets".into());
    match nums.as_slice() {
        [n] => {
            let n = parse_c_int(n).ok_or_else(invalid)?;
            Ok((n, n))
        }
        [lo, hi] => {
            let min = if lo.is_empty() {
                0
            } else {
                parse_c_int(lo).ok_or_else(invalid)?
            };
            let max = if hi.is_empty() {
                i32::MAX
            } else {
                parse_c_int(hi).ok_or_else(invalid)?
            };
            Ok((min, max))
        }
        _ => Err(PatternFailure::Unsupported(
            "wrong number of values in curly brackets".into(),
        )),
    }
}

/// What an `allOf` gathers from its components: their properties and their enum values.
#[derive(Default)]
struct AllOfParts<'d> {
    properties: Vec<(&'d str, &'d Schema)>,
    required: HashSet<String>,
    /// Each enum value's rule, with how many components list it.
    enum_values: BTreeMap<String, usize>,
}

impl<'d> AllOfParts<'d> {
    /// `seen` stops a `$ref` that leads back to itself, which upstream follows until it crashes.
    fn add(
        &mut self,
        doc: &'d SchemaDocument,
        comp: &'d Schema,
        is_required: bool,
        seen: &mut HashSet<&'d str>,
    ) {
        match comp {
            Schema::Ref(reference) => {
                if let Some(target) = doc.resolve(reference) {
                    if seen.insert(reference) {
                        self.add(doc, target, is_required, seen);
                    }
                }
            }
            Schema::Object { properties, .. } => {
                for prop in properties {
                    self.properties.push((&prop.name, &prop.schema));
                    if is_required {
                        self.required.insert(prop.name.clone());
                    }
                }
            }
            Schema::Enum(values) => {
                for v in values {
                    *self
                        .enum_values
                        .entry(GrammarBuilder::constant_rule(v))
                        .or_default() += 1;
                }
            }
            _ => {}
        }
    }
}

/// Strings by code point, for the rule that excludes them.
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Default)]
struct TrieNode {
    children: BTreeMap<char, usize>,
    terminal: bool,
}

impl Trie {
    fn new(words: &[String]) -> Self {
        let mut nodes = vec![TrieNode::default()];
        for word in words {
            let mut current = 0;
            for c in word.chars() {
                current = match nodes[current].children.get(&c) {
                    Some(&child) => child,
                    None => {
                        nodes.push(TrieNode::default());
                        let child = nodes.len() - 1;
                        nodes[current].children.insert(c, child);
                        child
                    }
                };
            }
            nodes[current].terminal = true;
        }
        Trie { nodes }
    }

    fn write_exclusion(&self, idx: usize, char_rule: &str, out: &mut String) {
        let node = &self.nodes[idx];
        let mut rejects = String::new();
        for (i, (c, &child)) in node.children.iter().enumerate() {
            rejects.push(*c);
            if i > 0 {
                out.push_str(" | ");
            }
            out.push('[');
            out.push(*c);
            out.push(']');
            if self.nodes[child].children.is_empty() {
                out.push(' ');
                out.push_str(char_rule);
                out.push('+');
            } else {
                out.push_str(" (");
                self.write_exclusion(child, char_rule, out);
                out.push(')');
            }
        }
        if !node.children.is_empty() {
            out.push_str(&format!(" | [^\"{rejects}] {char_rule}*"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_strings_are_escaped_as_upstreams_library_escapes_them() {
        let mut out = String::new();
        write_json_string("a\"\\\u{8}\u{c}\n\r\t\u{1}\u{1f}\u{7f}é", &mut out);
        assert_eq!(out, "\"a\\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\u{7f}é\"");
    }

    #[test]
    fn floats_are_written_as_nlohmann_writes_them() {
        let cases = [
            (1.5, "1.5"),
            (100.0, "100.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-5, "1.5e-05"),
            (1e14, "100000000000000.0"),
            (1e15, "1e+15"),
            (1.25e100, "1.25e+100"),
            (-0.0, "-0.0"),
            (-2.5, "-2.5"),
            (123456.789, "123456.789"),
        ];
        for (f, want) in cases {
            assert_eq!(dump_json(&json!(f)), want, "{f:e}");
        }
    }

    #[test]
    fn json_text_keeps_order_and_escapes_controls_only() {
        let v: Value = serde_json::from_str(r#"{"b":1,"a":["x\u0001\n\"\\é",null,true]}"#).unwrap();
        assert_eq!(
            dump_json(&v),
            "{\"b\":1,\"a\":[\"x\\u0001\\n\\\"\\\\é\",null,true]}"
        );
    }

    #[test]
    fn rule_names_fold_runs_of_other_characters() {
        assert_eq!(sanitize_rule_name("a b..c-é"), "a-b-c--");
        assert_eq!(sanitize_rule_name("/defs/a.b"), "-defs-a-b");
    }

    #[test]
    fn repetitions_match_upstream_spellings() {
        assert_eq!(build_repetition("x", 0, 1, ""), "x?");
        assert_eq!(build_repetition("x", 1, i32::MAX, ""), "x+");
        assert_eq!(build_repetition("x", 2, 5, ""), "x{2,5}");
        assert_eq!(build_repetition("x", 3, i32::MAX, ""), "x{3,}");
        assert_eq!(
            build_repetition("x", 0, 3, "\",\" space"),
            "(x (\",\" space x){0,2})?"
        );
        assert_eq!(build_repetition("x", 0, 0, ""), "");
    }

    #[test]
    fn request_schema_follows_response_format() {
        let body = json!({"response_format": {"type": "json_object"}});
        assert_eq!(
            chat_request_schema(&body).unwrap(),
            Some(json!({"type": "object"}))
        );
        let body = json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}});
        assert_eq!(
            chat_request_schema(&body).unwrap(),
            Some(json!({"type": "string"}))
        );
        let body =
            json!({"json_schema": {"type": "integer"}, "response_format": {"type": "json_object"}});
        assert_eq!(
            chat_request_schema(&body).unwrap(),
            Some(json!({"type": "integer"}))
        );
        let body = json!({"response_format": {"type": "text"}});
        assert_eq!(chat_request_schema(&body).unwrap(), None);
        let err = chat_request_schema(&json!({"response_format": {"type": "xml"}})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "response_format type must be one of \"text\" or \"json_object\", but got: xml"
        );
        let err = chat_request_schema(&json!({"json_schema": {}, "grammar": "root ::= \"a\""}))
            .unwrap_err();
        assert_eq!(err.to_string(), "Cannot use both json_schema and grammar");
    }

    #[test]
    fn value_types_and_strings_follow_every_branch() {
        use ValueType as T;
        let schema = json!({
            "type": "object",
            "properties": {
                "n": {"type": "number"},
                "e": {"enum": [1, "a", null]},
                "maybe": {"type": ["string", "null"]},
                "all": {"allOf": [{}, {"type": "string"}]},
                "node": {"$ref": "#/$defs/node"},
                "any": {}
            },
            "$defs": {"node": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/node"}]}}
        });
        let doc = SchemaDocument::from_json(&schema).unwrap();
        let Schema::Object { properties, .. } = doc.root() else {
            panic!("not an object")
        };
        let prop = |name: &str| &properties.iter().find(|p| p.name == name).unwrap().schema;
        assert_eq!(
            doc.value_types(prop("n")),
            ValueTypes::of(&[T::Number, T::Integer])
        );
        assert_eq!(
            doc.value_types(prop("e")),
            ValueTypes::of(&[T::Integer, T::String, T::Null])
        );
        assert!(doc.value_types(prop("all")).is_only(T::String));
        assert!(doc.value_types(prop("node")).is_only(T::Integer));
        assert_eq!(doc.value_types(prop("any")), ValueTypes::ALL);
        assert!(doc.may_be_string(prop("e")));
        assert!(doc.may_be_string(prop("maybe")));
        assert!(doc.may_be_string(prop("all")));
        assert!(!doc.may_be_string(prop("n")));
        assert!(!doc.may_be_string(prop("node")));
        assert!(!doc.may_be_string(prop("any")));
    }

    #[test]
    fn unbounded_negation_fails_as_upstream() {
        let err = schema_to_grammar(&json!({"type": "integer", "maximum": i64::MIN})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "JSON schema conversion failed:\nAt least one of min_value or max_value must be set"
        );
    }
}
