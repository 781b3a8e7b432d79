//! ModelRunner, sampler, EngineCore and LLMEngine.
