//! The engine: ModelRunner (SchedulerOutput -> model inputs -> logits -> tokens),
//! the sampler, EngineCore (the schedule/execute/update loop) and LLMEngine (text
//! in, incrementally detokenized text out, stop strings).
//!
//! Architecture invariant: the engine knows no HTTP and picks no attention backend
//! itself; it asks the selector.

pub mod detokenizer;
pub mod output;
pub mod sampler;

pub use output::{EngineStats, PromptInput, RequestOutput};
