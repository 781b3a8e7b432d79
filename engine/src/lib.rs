//! The engine: ModelRunner (SchedulerOutput -> model inputs -> logits -> tokens),
//! the sampler, structured outputs (llguidance masks), EngineCore (the schedule/execute/update loop) and LLMEngine (text
//! in, incrementally detokenized text out, stop strings).
//!
//! Architecture invariant: the engine knows no HTTP and picks no attention backend
//! itself; it asks the selector.

pub mod config;
pub mod detokenizer;
pub mod engine_core;
pub mod error;
pub mod handle;
pub mod llm_engine;
pub mod output;
pub mod prompt_logprobs;
pub mod runner;
pub mod runner_model;
pub mod sampler;
pub mod sleep;
pub mod spec;
pub mod startup;
pub mod step_pool;
pub mod structured;

pub use config::{EngineConfig, FaultInjectionConfig, ModelInfo};
pub use engine_core::{release_freed_memory, EngineCore, ALLOW_LONG_MAX_MODEL_LEN};
pub use error::EngineError;
pub use handle::{EngineHandle, KvEventSink, RequestStream, SubmitRequest};
pub use llm_engine::{GenerateOutput, LLMEngine, Placement};
pub use output::{
    EngineStats, IterationTokens, PromptInput, RequestMetrics, RequestOutput,
    ITERATION_TOKENS_BUCKETS,
};

pub use pagoda_scheduler::{KvCacheEvent, SchedulingPolicy, SpecDecodingStats};
pub use sleep::Released;
pub use step_pool::StepPool;
