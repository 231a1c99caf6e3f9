//! Grammars that constrain sampling, as upstream's: GBNF text parsed into rules, a matcher that
//! follows every way the text generated so far can continue, and JSON schemas turned into GBNF.
//!
//! Owns: the GBNF language, the grammar state advanced one token at a time, and the rejection
//! of candidate tokens; the JSON-schema conversion. Must not: sample (the sampler asks it which
//! candidates are allowed) or know about HTTP.

pub mod schema;
