//! The HTTP server: llama-server's routes on actix-web, over a scheduler thread that owns the
//! engine. Does no model math: logits come from the engine through [`crate::engine::Forward`],
//! tokens from [`crate::sampling`].

pub mod codec;
pub mod scheduler;
pub mod task;
pub mod testing;

pub use codec::TextCodec;
pub use scheduler::{SchedulerConfig, SchedulerHandle};
pub use task::{Event, TaskParams, TaskRequest};
