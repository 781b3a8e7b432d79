//! Structured outputs on the real model: JSON schema, JSON object, regex, choice and
//! Lark grammar constraints, greedy and seeded sampling, batches that mix
//! constrained and free rows (free rows unchanged), preemption, and invalid
//! constraints refused before the request enters the engine.

use pagoda_core::{Constraint, FinishReason, SamplingParams, StructuredOutputs};
use pagoda_engine::{EngineError, LLMEngine, PromptInput};
use pagoda_tests::{engine, test_config};
use serde_json::{json, Value};
use std::collections::HashMap;

fn chat(question: &str) -> String {
    format!(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )
}

fn constrained(c: Constraint, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        structured_outputs: Some(StructuredOutputs::new(c).into()),
        ..SamplingParams::greedy(max_tokens)
    }
}

/// Result of one request: text, token ids, finish reason.
#[derive(Debug, Clone, PartialEq)]
struct Out {
    text: String,
    ids: Vec<u32>,
    finish: Option<FinishReason>,
}

/// Runs requests with their own parameters, all submitted at once.
fn run(e: &mut LLMEngine, reqs: &[(String, SamplingParams)]) -> Vec<Out> {
    let mut index = HashMap::new();
    for (i, (prompt, params)) in reqs.iter().enumerate() {
        let id = format!("so-{i}-{}", e.stats().num_steps);
        e.add_request(
            id.clone(),
            PromptInput::Text(prompt.clone()),
            params.clone(),
            None,
        )
        .expect("add_request");
        index.insert(id, i);
    }
    let mut outs = vec![
        Out {
            text: String::new(),
            ids: Vec::new(),
            finish: None
        };
        reqs.len()
    ];
    while e.has_unfinished_requests() {
        for o in e.step().expect("step") {
            let r = &mut outs[index[&o.request_id]];
            r.text.push_str(&o.new_text);
            r.ids.extend_from_slice(&o.new_token_ids);
            if o.finished {
                assert_eq!(o.error, None, "request {} failed", o.request_id);
                r.finish = o.finish_reason;
            }
        }
    }
    assert_eq!(e.core().num_grammars(), 0, "grammars left behind");
    outs
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]}
        },
        "required": ["name", "age", "city"],
        "additionalProperties": false
    })
}

/// The few JSON-Schema rules the test schemas use, checked by hand.
fn validate(schema: &Value, v: &Value) -> Result<(), String> {
    match schema["type"].as_str() {
        Some("object") => {
            let o = v.as_object().ok_or(format!("{v} is not an object"))?;
            let props = schema["properties"].as_object();
            for r in schema["required"].as_array().into_iter().flatten() {
                let r = r.as_str().unwrap();
                if !o.contains_key(r) {
                    return Err(format!("missing required {r} in {v}"));
                }
            }
            for (k, val) in o {
                match props.and_then(|p| p.get(k)) {
                    Some(s) => validate(s, val)?,
                    None if schema["additionalProperties"] == json!(false) => {
                        return Err(format!("unexpected property {k}"))
                    }
                    None => {}
                }
            }
        }
        Some("string") => {
            let s = v.as_str().ok_or(format!("{v} is not a string"))?;
            let n = s.chars().count() as u64;
            if schema["minLength"].as_u64().is_some_and(|m| n < m)
                || schema["maxLength"].as_u64().is_some_and(|m| n > m)
            {
                return Err(format!("{v}: length {n} out of bounds"));
            }
            if let Some(e) = schema["enum"].as_array() {
                if !e.contains(v) {
                    return Err(format!("{v} not in {e:?}"));
                }
            }
        }
        Some("integer") => {
            let i = v.as_i64().ok_or(format!("{v} is not an integer"))?;
            if schema["minimum"].as_i64().is_some_and(|m| i < m)
                || schema["maximum"].as_i64().is_some_and(|m| i > m)
            {
                return Err(format!("{v} out of range"));
            }
        }
        Some("array") => {
            let a = v.as_array().ok_or(format!("{v} is not an array"))?;
            for x in a {
                validate(&schema["items"], x)?;
            }
        }
        None => {}
        Some(t) => return Err(format!("the test validator knows no type {t}")),
    }
    Ok(())
}

fn assert_valid_json(out: &Out, schema: &Value) {
    assert_eq!(out.finish, Some(FinishReason::Stop), "{out:?}");
    let v: Value = serde_json::from_str(&out.text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", out.text));
    validate(schema, &v).unwrap_or_else(|e| panic!("{e}: {:?}", out.text));
}

#[test]
fn json_schema_greedy_and_seeded() {
    let mut e = engine(test_config());
    let schema = person_schema();
    let prompt = chat("Give me a person as JSON with a name, an age and a city.");
    let greedy = constrained(Constraint::Json(schema.clone()), 80);
    let sampled = |seed| SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..greedy.clone()
    };
    let outs = run(
        &mut e,
        &[
            (prompt.clone(), greedy.clone()),
            (prompt.clone(), sampled(7)),
            (prompt.clone(), sampled(8)),
            (chat("Who are you?"), sampled(9)),
        ],
    );
    for o in &outs {
        assert_valid_json(o, &schema);
    }
    // The mask made the greedy run differ from the unconstrained one.
    let free = run(&mut e, &[(prompt.clone(), SamplingParams::greedy(80))]);
    assert_ne!(free[0].text, outs[0].text);
    // Same seed, same output.
    let again = run(&mut e, &[(prompt, sampled(7))]);
    assert_eq!(again[0], outs[1]);
    let stats = e.core().mask_stats();
    assert!(stats.num_masks > 0, "{stats:?}");
}

#[test]
fn json_object_regex_choice_and_grammar() {
    let mut e = engine(test_config());
    let regex = r"[A-Z][a-z]{2,8} [0-9]{1,3}";
    let choices = ["Paris", "Tokyo", "a.b|c", "x/y \"q\""];
    let lark = "start: \"SELECT \" col \" FROM \" tbl\ncol: \"id\" | \"name\"\ntbl: \"users\" | \"orders\"";
    // The same grammar in GBNF (llama.cpp's format, which vLLM also takes).
    let gbnf = "root ::= \"SELECT \" col \" FROM \" tbl\ncol ::= \"id\" | \"name\"\ntbl ::= \"users\" | \"orders\"";
    let outs = run(
        &mut e,
        &[
            (
                chat("Repeat this JSON exactly: {\"cat\": \"black\", \"age\": 3}"),
                constrained(Constraint::JsonObject, 120),
            ),
            (
                chat("Name a fruit and a number."),
                constrained(Constraint::Regex(regex.into()), 20),
            ),
            (
                chat("What is the capital of France?"),
                constrained(
                    Constraint::Choice(choices.iter().map(|c| c.to_string()).collect()),
                    10,
                ),
            ),
            (
                chat("Write an SQL query."),
                constrained(Constraint::Grammar(lark.into()), 20),
            ),
            (
                chat("Write an SQL query."),
                constrained(Constraint::Grammar(gbnf.into()), 20),
            ),
        ],
    );
    let v: Value =
        serde_json::from_str(&outs[0].text).unwrap_or_else(|e| panic!("{e}: {:?}", outs[0]));
    assert!(v.is_object(), "{v}");
    assert_eq!(outs[0].finish, Some(FinishReason::Stop));

    let re = regex::Regex::new(&format!("^(?:{regex})$")).unwrap();
    assert!(re.is_match(&outs[1].text), "{:?} !~ {regex}", outs[1].text);
    assert_eq!(outs[1].finish, Some(FinishReason::Stop));

    assert!(choices.contains(&outs[2].text.as_str()), "{:?}", outs[2]);
    assert_eq!(outs[2].finish, Some(FinishReason::Stop));

    let sql = regex::Regex::new("^SELECT (id|name) FROM (users|orders)$").unwrap();
    assert!(sql.is_match(&outs[3].text), "{:?}", outs[3]);
    assert_eq!(outs[3].finish, Some(FinishReason::Stop));
    assert_eq!(outs[4], outs[3], "GBNF and Lark give the same output");

    // Every choice is reachable: forcing each one through `allowed`-style prompts is
    // overkill; check instead that a seeded sampler lands in the set every time.
    for seed in 0..4 {
        let p = SamplingParams {
            temperature: 1.5,
            seed: Some(seed),
            ..constrained(
                Constraint::Choice(choices.iter().map(|c| c.to_string()).collect()),
                10,
            )
        };
        let o = run(&mut e, &[(chat("Pick one."), p)]);
        assert!(choices.contains(&o[0].text.as_str()), "{:?}", o[0]);
    }
}

/// Free rows batched with constrained ones produce what they produce alone.
#[test]
fn mixed_batch_leaves_free_rows_unchanged() {
    let mut e = engine(test_config());
    let free: Vec<(String, SamplingParams)> = (0..4)
        .map(|i| {
            let p = SamplingParams {
                temperature: 0.8,
                seed: Some(100 + i),
                max_tokens: Some(24),
                ..SamplingParams::default()
            };
            (format!("Note {i}: the weather today is"), p)
        })
        .collect();
    let alone: Vec<Out> = free
        .iter()
        .map(|r| run(&mut e, std::slice::from_ref(r))[0].clone())
        .collect();
    let mut mixed = Vec::new();
    for (i, f) in free.iter().enumerate() {
        mixed.push(f.clone());
        mixed.push((
            chat(&format!("Person number {i} as JSON.")),
            constrained(Constraint::Json(person_schema()), 80),
        ));
    }
    let outs = run(&mut e, &mixed);
    for (i, a) in alone.iter().enumerate() {
        assert_eq!(outs[2 * i].ids, a.ids, "free row {i} changed when batched");
        assert_valid_json(&outs[2 * i + 1], &person_schema());
    }
}

/// Preemption and recomputation keep the matcher in step with the output.
#[test]
fn preemption_keeps_grammars_consistent() {
    let reqs: Vec<(String, SamplingParams)> = (0..3)
        .map(|i| {
            (
                chat(&format!("Person {i}, as JSON please.")),
                constrained(Constraint::Json(person_schema()), 80),
            )
        })
        .collect();
    let mut base = engine(test_config());
    let expected = run(&mut base, &reqs);
    let mut c = test_config();
    c.num_kv_blocks = Some(28);
    c.block_size = 4;
    let mut tight = engine(c);
    let outs = run(&mut tight, &reqs);
    assert!(
        tight.stats().num_preemptions > 0,
        "27 blocks of 4 tokens should force preemption"
    );
    for (o, x) in outs.iter().zip(&expected) {
        assert_valid_json(o, &person_schema());
        assert_eq!(o.ids, x.ids);
    }
}

#[test]
fn invalid_constraints_are_refused_before_the_engine() {
    let mut e = engine(test_config());
    for c in [
        Constraint::Regex("[a-".into()),
        Constraint::Json(json!({"type": "object", "properties": {"a": {"type": "frob"}}})),
        Constraint::Grammar("start: undefined_rule".into()),
        Constraint::Grammar("root ::= \"a".into()),
        Constraint::Grammar("root ::= undefined-rule".into()),
    ] {
        let r = e.add_request(
            "bad".into(),
            PromptInput::Text("x".into()),
            constrained(c.clone(), 4),
            None,
        );
        match r {
            Err(EngineError::InvalidGrammar { message, .. }) => {
                assert!(!message.is_empty(), "{c:?}")
            }
            other => panic!("{c:?}: expected InvalidGrammar, got {other:?}"),
        }
    }
    assert!(!e.has_unfinished_requests());
    // The engine still serves.
    let o = run(
        &mut e,
        &[(chat("Hi"), constrained(Constraint::Regex("ok".into()), 4))],
    );
    assert_eq!(o[0].text, "ok");
}

/// Aborting a constrained request drops its grammar.
#[test]
fn abort_drops_the_grammar() {
    let mut e = engine(test_config());
    e.add_request(
        "a".into(),
        PromptInput::Text(chat("JSON please")),
        constrained(Constraint::JsonObject, 50),
        None,
    )
    .unwrap();
    e.step().unwrap();
    assert_eq!(e.core().num_grammars(), 1);
    e.abort_request("a");
    // The runner drops it at the next step.
    e.step().unwrap();
    assert_eq!(e.core().num_grammars(), 0);
}

/// `logit_bias` composes with the mask; `allowed_token_ids` that leave no token the
/// grammar allows fail that request alone (FinishReason::Error), the batch goes on.
#[test]
fn mask_composes_with_sampler_controls() {
    let mut e = engine(test_config());
    let tok = e.tokenizer();
    let first = |s: &str| tok.encode(s, false).unwrap()[0];
    let choice = || Constraint::Choice(vec!["yes".into(), "no".into()]);
    for (favoured, other) in [("no", "yes"), ("yes", "no")] {
        let p = SamplingParams {
            logit_bias: vec![(first(favoured), 100.0), (first(other), -100.0)].into(),
            ..constrained(choice(), 4)
        };
        let o = run(&mut e, &[(chat("Is the sky green?"), p)]);
        assert_eq!(o[0].text, favoured);
    }
    let starved = SamplingParams {
        allowed_token_ids: Some(vec![first("Paris")].into()),
        ..constrained(choice(), 4)
    };
    e.add_request(
        "starved".into(),
        PromptInput::Text(chat("Yes or no?")),
        starved,
        None,
    )
    .unwrap();
    e.add_request(
        "free".into(),
        PromptInput::Text(chat("Yes or no?")),
        SamplingParams::greedy(4),
        None,
    )
    .unwrap();
    let mut finish = HashMap::new();
    while e.has_unfinished_requests() {
        for o in e.step().unwrap() {
            if o.finished {
                finish.insert(o.request_id.clone(), (o.finish_reason, o.error.clone()));
            }
        }
    }
    let (reason, error) = &finish["starved"];
    assert_eq!(*reason, Some(FinishReason::Error));
    assert!(
        error.as_deref().is_some_and(|e| e.contains("masked")),
        "{error:?}"
    );
    assert!(finish["free"].0.is_some() && finish["free"].1.is_none());
    assert_eq!(e.core().num_grammars(), 0);
}
