//! The bounds one compile runs under (`pagoda serve`'s `--structured-outputs-*`
//! flags) and the compile threads' stack they are tested against. A leaf: the
//! compiler, the compile pool and the engine's config all read it.

use std::time::Duration;

/// Stack of each compile thread. A 2 MiB stack overflowed at a 700-link `$ref`
/// chain (~2,000 levels); chains of [`MAX_SAFE_DEPTH`] levels of every kind
/// compile on this one (`tests/tests/structured_bounds.rs`). It costs address
/// space only: pages are committed as a compile touches them.
pub const COMPILE_STACK_BYTES: usize = 256 << 20;
/// Default of `--structured-outputs-max-depth`: far above real schemas (tens of
/// levels), far below what [`COMPILE_STACK_BYTES`] holds.
pub const DEFAULT_MAX_DEPTH: usize = 5000;
/// The deepest `--structured-outputs-max-depth` accepted: what the compile
/// threads' stack is tested to hold (`tests/structured_bounds.rs` compiles chains of
/// this depth of every kind).
pub const MAX_SAFE_DEPTH: usize = 10_000;

/// The bounds of one compile (`pagoda serve` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct CompileLimits {
    /// `--structured-outputs-compile-threads`.
    pub threads: usize,
    /// `--structured-outputs-compile-timeout`: from submission to a compiled
    /// grammar with its first mask, queueing included.
    pub timeout: Duration,
    /// `--structured-outputs-max-depth`: longest `$ref`/nesting chain of a JSON
    /// schema, longest rule chain of a Lark or GBNF grammar.
    pub max_depth: usize,
    /// `--structured-outputs-max-regex-size`: a regex's size with its counted
    /// repetitions expanded (the `regex` constraint, JSON `pattern`s,
    /// `whitespace_pattern`), and the total length of a `choice`'s strings.
    pub max_regex_size: u64,
    /// `--structured-outputs-compile-memory-mib`: what one compile's lexer may hold
    /// (llguidance's lexer states at ~2 KiB each, and its grammar size).
    pub memory_mib: usize,
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            threads: 2,
            timeout: Duration::from_secs(10),
            max_depth: DEFAULT_MAX_DEPTH,
            max_regex_size: 100_000,
            memory_mib: 256,
        }
    }
}

impl CompileLimits {
    /// Sets llguidance's limits from these: lexer states (llguidance: "~1-2 kB of
    /// memory per state") and grammar symbols within the memory budget; the
    /// lexer fuel stays llguidance's default (1M units, ~20 ms).
    pub fn apply(&self, limits: &mut llguidance::api::ParserLimits) {
        let bytes = self.memory_mib.saturating_mul(1 << 20);
        limits.max_lexer_states = (bytes / 2048).clamp(1024, limits.max_lexer_states.max(1024));
        // ~64 bytes a grammar symbol across llguidance's tables.
        limits.max_grammar_size = (bytes / 64).clamp(4096, limits.max_grammar_size.max(4096));
        // Errors go back to clients: the parser's message, not its state dump.
        limits.verbose_errors = false;
    }
}
