//! Grammars that constrain sampling, as upstream's: GBNF text parsed into rules, a matcher that
//! follows every way the text generated so far can continue, and JSON schemas turned into GBNF.
//!
//! Owns: the GBNF language, the grammar state advanced one token at a time, and the rejection
//! of candidate tokens; the JSON-schema conversion. Must not: sample (the sampler asks it which
//! candidates are allowed) or know about HTTP.

pub mod schema;

mod gbnf;
mod matcher;

pub use gbnf::GrammarError;
pub use matcher::{Grammar, GrammarState, TokenTexts, Triggers};

/// The GBNF rules for `schema` with its root rule named `name` (upstream's converter names the
/// root `root` when given no name).
pub fn schema_rules(schema: &serde_json::Value, name: &str) -> Result<String, schema::SchemaError> {
    let doc = schema::SchemaDocument::from_json(schema)?;
    let mut builder = schema::GrammarBuilder::new(false);
    builder.add_schema(name, &doc, doc.root());
    builder.finish()
}

/// Upstream's JSON-schema whitespace rule, for grammars that refer to `space`.
const SPACE_RULE: &str = "space ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}";

/// The grammar of a chat reply constrained by a response schema, as upstream's chat parser
/// builds it for templates without reasoning: the generation prompt (fed through the grammar
/// before sampling), then whitespace, then the JSON of rule `schema_root` either bare or in a
/// ```json fence, with whitespace around it. `schema_rules` holds that rule's definitions.
pub fn response_format_grammar(
    schema_rules: &str,
    schema_root: &str,
    generation_prompt: &str,
) -> String {
    let mut out = String::from("root ::= ");
    if !generation_prompt.is_empty() {
        out.push_str(&gbnf_literal(generation_prompt));
        out.push(' ');
    }
    out.push_str(&format!(
        "space space (\"```json\" space {schema_root} space \"```\" | space {schema_root} space)\n"
    ));
    out.push_str(schema_rules.trim_end());
    out.push('\n');
    if !schema_rules.lines().any(|l| l.starts_with("space ::=")) {
        out.push_str(SPACE_RULE);
        out.push('\n');
    }
    out
}

/// `text` as a GBNF string literal.
pub fn gbnf_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
