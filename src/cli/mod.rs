//! The llama-server option table, parsing, `Config` and `PlacementIntent`, and everything printed
//! about the options (help, completions, man page). Touches no devices and no model files; like
//! upstream it reads the small text files some options name (key files, templates, grammars,
//! schemas) and checks that named folders exist, so bad values are refused while parsing.
//! `--cache-list` prints what `hub` finds in the download cache.
//!
//! Layers, as in ripgrep's flags: `table` holds one definition per option and the function that
//! applies its value; `parse` runs argv and the environment through it; `config` holds the typed
//! results the rest of the program reads.

pub mod config;
pub mod docs;
pub mod parse;
pub mod table;
pub mod values;

pub use config::{Config, PlacementIntent, Source, Sourced};
pub use parse::{parse, parse_process, Exit, ExitOutput, Failure, Parsed};
