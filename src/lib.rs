//! bloomery: a drop-in replacement for llama.cpp's `llama-server`, built to serve large
//! mixture-of-experts models on machines whose GPU memory is smaller than the model.
//!
//! Data flow: `cli` (one option table) -> `Config` + `PlacementIntent` -> `model` (GGUF) ->
//! `tokenizer` -> `engine` (forward passes over a `backend`) -> `sampling` -> `server` (HTTP).

pub mod backend;
pub mod chat;
pub mod cli;
pub mod engine;
pub mod grammar;
pub mod hub;
pub mod launch;
pub mod model;
pub mod placement;
pub mod sampling;
pub mod server;
pub mod service;
pub mod tokenizer;
