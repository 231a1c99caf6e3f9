//! JSON schemas turned into GBNF grammars, producing the same rules upstream's converter does.
