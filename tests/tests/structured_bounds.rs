//! Structured-output constraints as an attack surface (issue 29, D1, D4, D8): chains
//! that overflowed a 2 MiB stack and aborted the server compile on the compile
//! pool up to the depth bound and are refused past it; constraints that cannot
//! start, or whose regexes explode, are refused before the request is queued; the
//! deadline and cancellation hold.
//!
//! The calls below run on the test's own thread (2 MiB stack in the default test
//! harness): before the compile pool, the 700-link chain aborted this process.

use pagoda_core::{Constraint, StructuredOutputs};
use pagoda_engine::structured::bounds::{lark_depth, schema_depth};
use pagoda_engine::structured::limits::MAX_SAFE_DEPTH;
use pagoda_engine::structured::{CompileLimits, SharedCompiler};
use pagoda_engine::EngineError;
use pagoda_tests::{engine, test_config};
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// One compiler per limits, on the real model's tokenizer.
fn compiler(limits: CompileLimits) -> Arc<SharedCompiler> {
    let mut c = test_config();
    c.kv_cache_bytes = 16 << 20;
    c.structured_limits = limits;
    engine(c).structured_compiler()
}

fn default_compiler() -> &'static Arc<SharedCompiler> {
    static C: OnceLock<Arc<SharedCompiler>> = OnceLock::new();
    C.get_or_init(|| compiler(CompileLimits::default()))
}

fn spec(c: Constraint) -> StructuredOutputs {
    StructuredOutputs::new(c)
}

/// A chain of `n` `$defs`, each pointing at the next through `via`.
fn ref_chain(n: usize, via: &str) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let next = if i + 1 < n {
            json!({"$ref": format!("#/$defs/d{}", i + 1)})
        } else {
            json!({"type": "integer"})
        };
        let link = match via {
            "ref" => next,
            "items" => json!({"type": "array", "items": next}),
            "anyOf" => json!({"anyOf": [next, {"type": "null"}]}),
            "allOf" => json!({"allOf": [next]}),
            "properties" => {
                json!({"type": "object", "properties": {"a": next}, "required": ["a"]})
            }
            other => panic!("unknown link {other}"),
        };
        defs.insert(format!("d{i}"), link);
    }
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

fn lark_chain(n: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n - 1 {
        g.push_str(&format!("r{i}: r{}\n", i + 1));
    }
    g.push_str(&format!("r{}: \"x\"\n", n - 1));
    g
}

fn gbnf_chain(n: usize) -> String {
    let mut g = String::from("root ::= r0\n");
    for i in 0..n - 1 {
        g.push_str(&format!("r{i} ::= r{}\n", i + 1));
    }
    g.push_str(&format!("r{} ::= \"x\"\n", n - 1));
    g
}

/// The longest chain of `make(n)` whose measure is at most `limit`.
fn longest_within(limit: usize, measure: impl Fn(usize) -> Option<usize>) -> usize {
    let (mut lo, mut hi) = (1usize, limit + 1);
    // measure is monotone in n: binary search the last n that fits.
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if measure(mid).is_some() {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

fn assert_depth_refused(r: Result<impl std::fmt::Debug, EngineError>) {
    match r {
        Err(EngineError::InvalidGrammar { message, .. }) => assert!(
            message.contains("--structured-outputs-max-depth"),
            "{message}"
        ),
        other => panic!("expected a depth refusal, got {other:?}"),
    }
}

/// The reproduction: 700 `$ref`s (24 KB) aborted the server; 500 did not.
#[test]
fn ref_chain_of_700_compiles_instead_of_aborting() {
    let c = default_compiler();
    for via in ["ref", "items", "anyOf", "allOf", "properties"] {
        let g = c.compile(&spec(Constraint::Json(ref_chain(700, via))));
        assert!(g.is_ok(), "{via}: {g:?}");
    }
    let g = c.compile(&spec(Constraint::Grammar(lark_chain(1000))));
    assert!(g.is_ok(), "lark: {g:?}");
}

/// At the largest depth the flag accepts, every kind of chain compiles on the
/// pool's stack; one link more is a 400 naming the flag.
#[test]
fn chains_at_the_largest_depth_bound_compile_and_one_more_is_refused() {
    let limit = MAX_SAFE_DEPTH;
    let c = compiler(CompileLimits {
        max_depth: limit,
        timeout: Duration::from_secs(600),
        ..CompileLimits::default()
    });
    for via in ["ref", "items", "anyOf", "allOf", "properties"] {
        let n = longest_within(limit, |n| schema_depth(&ref_chain(n, via), limit).ok());
        let t0 = Instant::now();
        let g = c.compile(&spec(Constraint::Json(ref_chain(n, via))));
        assert!(g.is_ok(), "{via} x {n}: {g:?}");
        eprintln!("{via}: {n} links at depth {limit}: {:?}", t0.elapsed());
        assert_depth_refused(c.compile(&spec(Constraint::Json(ref_chain(n + 1, via)))));
    }
    let n = longest_within(limit, |n| lark_depth(&lark_chain(n), limit).ok());
    assert!(c.compile(&spec(Constraint::Grammar(lark_chain(n)))).is_ok());
    assert_depth_refused(c.compile(&spec(Constraint::Grammar(lark_chain(n + 1)))));
    let n = longest_within(limit, |n| lark_depth(&gbnf_chain(n), limit).ok());
    assert!(c.compile(&spec(Constraint::Grammar(gbnf_chain(n)))).is_ok());
    assert_depth_refused(c.compile(&spec(Constraint::Grammar(gbnf_chain(n + 1)))));
}

#[test]
fn default_depth_bound_refuses_deeper_chains() {
    let c = default_compiler();
    let limit = c.limits().max_depth;
    assert_depth_refused(c.compile(&spec(Constraint::Json(ref_chain(limit + 1, "ref")))));
    assert_depth_refused(c.compile(&spec(Constraint::Grammar(lark_chain(limit + 1)))));
}

fn assert_refused(r: Result<impl std::fmt::Debug, EngineError>, needle: &str) {
    match r {
        Err(EngineError::InvalidGrammar { message, .. }) => {
            assert!(message.contains(needle), "{message}")
        }
        other => panic!("expected a refusal with `{needle}`, got {other:?}"),
    }
}

/// D8: what failed at its first step as a 500 after queueing is refused up front.
#[test]
fn constraints_that_cannot_start_are_refused_before_queueing() {
    let c = default_compiler();
    let selfref = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
    assert_refused(
        c.compile(&spec(Constraint::Json(selfref))),
        "cannot generate any output",
    );
    assert_refused(
        c.compile(&spec(Constraint::Regex("(a{1000}){1000}".into()))),
        "--structured-outputs-max-regex-size",
    );
    let pattern = json!({"type": "string", "pattern": "^(ab{500}){500}$"});
    assert_refused(
        c.compile(&spec(Constraint::Json(pattern))),
        "--structured-outputs-max-regex-size",
    );
    let choices: Vec<String> = (0..100_000).map(|i| format!("option-{i}")).collect();
    assert_refused(
        c.compile(&spec(Constraint::Choice(choices))),
        "--structured-outputs-max-regex-size",
    );
    assert_refused(
        c.compile(&spec(Constraint::Grammar(
            "start: A\nA: /(a{1000}){1000}/".into(),
        ))),
        "--structured-outputs-max-regex-size",
    );
    // A schema embedded in a Lark grammar is measured like any other.
    let embedded = format!("start: %json {}", ref_chain(6000, "ref"));
    assert_depth_refused(c.compile(&spec(Constraint::Grammar(embedded))));
    // Ordinary constraints still compile, first mask included.
    assert!(c
        .compile(&spec(Constraint::Regex(
            "[a-z]{1,20}@[a-z]{1,10}\\.com".into()
        )))
        .is_ok());
    assert!(c
        .compile(&spec(Constraint::Choice(vec!["yes".into(), "no".into()])))
        .is_ok());
}

/// The deadline covers queueing and compiling; the refusal names the flag.
#[test]
fn compile_deadline_is_a_400_naming_the_flag() {
    let c = compiler(CompileLimits {
        timeout: Duration::from_nanos(1),
        ..CompileLimits::default()
    });
    assert_refused(
        c.compile(&spec(Constraint::Regex("[0-9]+".into()))),
        "--structured-outputs-compile-timeout",
    );
}

/// A dropped ticket (the client hung up) is never compiled, and a compile keeps
/// working after many cancellations.
#[test]
fn dropped_tickets_are_cancelled() {
    let c = compiler(CompileLimits {
        threads: 1,
        ..CompileLimits::default()
    });
    // Occupy the single thread, then queue and drop 50 more.
    let busy = c
        .submit(&spec(Constraint::Json(ref_chain(300, "items"))))
        .expect("submit");
    for _ in 0..50 {
        drop(c.submit(&spec(Constraint::Json(ref_chain(300, "items")))));
    }
    assert!(busy.wait_blocking().is_ok());
    let g = c.compile(&spec(Constraint::Regex("[0-9]{3}".into())));
    assert!(g.is_ok(), "{g:?}");
    let s = c.stats();
    assert!(s.cancelled >= 40, "{s:?}");
    assert!(s.completed >= 2, "{s:?}");
}
