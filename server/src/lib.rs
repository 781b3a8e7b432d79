//! The `pagoda` binary: CLI and OpenAI-compatible HTTP server.
