//! The `pagoda` binary's library: CLI commands and the OpenAI-compatible server.
//!
//! Architecture invariant: the server knows HTTP and the OpenAI schema; it talks to
//! the engine only through `pagoda_engine::EngineHandle` and never blocks the engine
//! loop, which runs on its own thread.

pub mod args;
pub mod backends_cmd;
pub mod data_parallel;
pub mod generate;
pub mod serve;
