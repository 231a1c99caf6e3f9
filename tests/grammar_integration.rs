//! The grammar cases of upstream's `tests/test-grammar-integration.cpp` (b11434), extracted by
//! `scripts/extract-grammar-cases.py` into `tests/data/grammar/integration.json`: each grammar
//! must accept every passing string and refuse every failing one, fed the way upstream's test
//! feeds them (one code point at a time; `<[N]>` parts as token N), and the grammars upstream
//! refuses to build must be refused. The schema cases go through our JSON-schema conversion
//! first, as upstream's test sends them through its own.

use bloomery::grammar::{Grammar, GrammarState};
use serde_json::Value;
use std::sync::Arc;

fn cases() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/grammar/integration.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Whether the grammar takes all of `parts` and may end after them.
fn matches(g: &Arc<Grammar>, parts: &Value) -> bool {
    let mut st = GrammarState::new(g.clone());
    for part in parts.as_array().unwrap() {
        let fed = match part {
            Value::String(text) => text.chars().all(|c| {
                let mut buf = [0u8; 4];
                st.accept_piece(0, c.encode_utf8(&mut buf).as_bytes())
                    .is_ok()
            }),
            Value::Number(n) => {
                let id = n.as_u64().unwrap() as u32;
                st.accept_piece(id, format!("<[{id}]>").as_bytes()).is_ok()
            }
            other => panic!("unexpected part {other}"),
        };
        if !fed {
            return false;
        }
    }
    st.can_end()
}

/// Checks one grammar against its passing and failing strings; returns the mismatches.
fn check(case: &Value, source: &str) -> Vec<String> {
    let desc = case["desc"].as_str().unwrap_or_default();
    let g = match Grammar::new(source, "root", None) {
        Ok(g) => g,
        Err(e) => return vec![format!("{desc}: grammar refused: {e}\n{source}")],
    };
    let mut bad = Vec::new();
    for (key, want) in [("pass", true), ("fail", false)] {
        for parts in case[key].as_array().unwrap() {
            if matches(&g, parts) != want {
                bad.push(format!(
                    "{desc}: {parts} should {}",
                    if want { "match" } else { "not match" }
                ));
            }
        }
    }
    bad
}

#[test]
fn upstream_grammar_cases_accept_and_refuse_the_same_strings() {
    let mut bad = Vec::new();
    let mut n = 0;
    for case in cases().iter().filter(|c| c["kind"] == "grammar") {
        n += 1;
        bad.extend(check(case, case["source"].as_str().unwrap()));
    }
    assert!(n >= 14, "only {n} grammar cases");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn upstream_schema_cases_accept_and_refuse_the_same_strings() {
    let mut bad = Vec::new();
    let mut n = 0;
    for case in cases().iter().filter(|c| c["kind"] == "schema") {
        n += 1;
        let schema: Value = serde_json::from_str(case["source"].as_str().unwrap()).unwrap();
        match bloomery::grammar::schema::schema_to_grammar(&schema) {
            Ok(gbnf) => bad.extend(check(case, &gbnf)),
            Err(e) => bad.push(format!("{}: schema refused: {e}", case["desc"])),
        }
    }
    assert!(n >= 33, "only {n} schema cases");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn grammars_upstream_refuses_are_refused() {
    let mut n = 0;
    for case in cases() {
        let (source, root) = (
            case["source"].as_str().unwrap_or_default(),
            case["root"].as_str().unwrap_or("root"),
        );
        match case["kind"].as_str() {
            Some("refused") => assert!(Grammar::new(source, root, None).is_err(), "{case}"),
            Some("accepted") => assert!(Grammar::new(source, root, None).is_ok(), "{case}"),
            _ => continue,
        }
        n += 1;
    }
    assert_eq!(n, 9);
}
