//! Request parsing and validation, without an engine.

use super::*;

const VOCAB: usize = 1000;

fn completion(json: &str) -> Result<CompletionRequest, ApiError> {
    parse_body(json.as_bytes())
}

fn params(json: &str) -> Result<SamplingParams, ApiError> {
    let r = completion(json)?;
    let lp = r.logprobs()?;
    let p = sampling_params(&r.common, r.common.max_tokens, lp, VOCAB)?;
    // The bounds are checked where the request enters the engine: the same check.
    p.clone().checked(VOCAB).map_err(ApiError::from)?;
    Ok(p)
}

fn bad_param(r: Result<SamplingParams, ApiError>) -> String {
    match r {
        Err(ApiError::BadRequest { param, .. }) => param.unwrap_or_default(),
        other => panic!("expected a 400, got {other:?}"),
    }
}

#[test]
fn prompt_shapes() {
    let p = |j: &str| completion(j).unwrap().prompt.unwrap();
    assert_eq!(p(r#"{"prompt":"hi"}"#), PromptField::Text("hi".into()));
    assert_eq!(
        p(r#"{"prompt":["a","b"]}"#),
        PromptField::Texts(vec!["a".into(), "b".into()])
    );
    assert_eq!(
        p(r#"{"prompt":[1,2,3]}"#),
        PromptField::Tokens(vec![1, 2, 3])
    );
    assert_eq!(
        p(r#"{"prompt":[[1],[2,3]]}"#),
        PromptField::TokenLists(vec![vec![1], vec![2, 3]])
    );
    assert!(completion(r#"{"prompt":[-1]}"#).is_err());
}

#[test]
fn fields_map_to_sampling_params() {
    let p = params(
        r#"{"model":"m","prompt":"x","max_tokens":7,"temperature":0,"top_p":0.5,"top_k":-1,"min_p":0.1,
            "presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1,"seed":42,
            "stop":"END","stop_token_ids":[5],"ignore_eos":true,"min_tokens":2,
            "logit_bias":{"17":-100,"3":2.5},"user":"someone","unknown_field":{"x":1},"logprobs":3}"#,
    )
    .unwrap();
    assert_eq!(p.max_tokens, Some(7));
    assert_eq!(p.temperature, 0.0);
    assert_eq!(p.top_p, 0.5);
    assert_eq!(p.top_k, 0);
    assert!((p.min_p - 0.1).abs() < 1e-6);
    assert_eq!(p.presence_penalty, 0.5);
    assert_eq!(p.frequency_penalty, -0.5);
    assert!((p.repetition_penalty - 1.1).abs() < 1e-6);
    assert_eq!(p.seed, Some(42));
    assert_eq!(*p.stop, ["END".to_string()]);
    assert_eq!(*p.stop_token_ids, [5]);
    assert!(p.ignore_eos);
    assert_eq!(p.min_tokens, 2);
    assert_eq!(*p.logit_bias, [(3, 2.5), (17, -100.0)]);
    assert_eq!(p.logprobs, Some(3));
}

#[test]
fn defaults_and_nulls() {
    let p = params(r#"{"prompt":"x","max_tokens":null,"stop":null,"temperature":null}"#).unwrap();
    assert_eq!(p.max_tokens, None, "no max_tokens means: what fits");
    assert_eq!(p.temperature, 1.0);
    assert!(p.stop.is_empty());
    let p = params(r#"{"prompt":"x","stop":["a","b"]}"#).unwrap();
    assert_eq!(*p.stop, ["a".to_string(), "b".to_string()]);
}

#[test]
fn invalid_values_name_their_param() {
    assert_eq!(bad_param(params(r#"{"max_tokens":-1}"#)), "max_tokens");
    assert_eq!(bad_param(params(r#"{"max_tokens":0}"#)), "max_tokens");
    assert_eq!(bad_param(params(r#"{"temperature":-0.5}"#)), "temperature");
    assert_eq!(bad_param(params(r#"{"top_p":0}"#)), "top_p");
    assert_eq!(bad_param(params(r#"{"top_p":1.5}"#)), "top_p");
    assert_eq!(bad_param(params(r#"{"top_k":-2}"#)), "top_k");
    assert_eq!(bad_param(params(r#"{"min_tokens":-2}"#)), "min_tokens");
    assert_eq!(
        bad_param(params(r#"{"logit_bias":{"abc":1}}"#)),
        "logit_bias"
    );
    assert_eq!(
        bad_param(params(r#"{"logit_bias":{"5000":1}}"#)),
        "logit_bias"
    );
    assert_eq!(
        bad_param(params(r#"{"logit_bias":{"5":101}}"#)),
        "logit_bias"
    );
    assert_eq!(bad_param(params(r#"{"logprobs":-2}"#)), "logprobs");
    // Above the engine's ceiling (a server's --max-logprobs is checked by the handlers).
    assert_eq!(bad_param(params(r#"{"logprobs":1025}"#)), "logprobs");
    assert_eq!(
        bad_param(params(r#"{"stop_token_ids":[999999]}"#)),
        "stop_token_ids"
    );
    assert_eq!(bad_param(params(r#"{"min_p":2}"#)), "min_p");
    assert_eq!(bad_param(params(r#"{"stop":[""]}"#)), "stop");
}

#[test]
fn malformed_json_is_a_400() {
    for body in [
        "{",
        "",
        "[1,2]",
        r#"{"prompt": 5}"#,
        r#"{"temperature":"hot"}"#,
    ] {
        match completion(body) {
            Err(ApiError::BadRequest { .. }) => {}
            other => panic!("{body:?} gave {other:?}"),
        }
    }
}

#[test]
fn n_and_seed_offsets() {
    let r = completion(r#"{"n":3,"seed":10}"#).unwrap();
    assert_eq!(r.common.n().unwrap(), 3);
    let base = sampling_params(&r.common, None, None, VOCAB).unwrap();
    let seeds: Vec<_> = (0..3).map(|i| params_for_sample(&base, i).seed).collect();
    assert_eq!(seeds, vec![Some(10), Some(11), Some(12)]);
    assert!(completion(r#"{"n":0}"#).unwrap().common.n().is_err());
    assert!(completion(r#"{"n":-3}"#).unwrap().common.n().is_err());
}

#[test]
fn stream_flags() {
    let r = completion(r#"{"stream":true,"stream_options":{"include_usage":true}}"#).unwrap();
    assert!(r.common.stream() && r.common.include_usage());
    let r = completion(r#"{"stream":true}"#).unwrap();
    assert!(r.common.stream() && !r.common.include_usage());
}

#[test]
fn chat_fields() {
    let r: ChatRequest = parse_body(
        br#"{"model":"m","messages":[{"role":"user","content":"hi"},
             {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
             "max_tokens":9,"max_completion_tokens":4,"logprobs":true,"top_logprobs":2}"#,
    )
    .unwrap();
    assert_eq!(r.max_tokens(), Some(4));
    assert_eq!(r.logprobs().unwrap(), Some(2));
    let msgs = r.messages.unwrap();
    assert_eq!(msgs[1].text().unwrap(), "ab");
    let r: ChatRequest = parse_body(br#"{"messages":[],"top_logprobs":2}"#).unwrap();
    assert!(r.logprobs().is_err(), "top_logprobs without logprobs");
    let r: ChatRequest = parse_body(br#"{"messages":[],"logprobs":false}"#).unwrap();
    assert_eq!(r.logprobs().unwrap(), None);
    let m: ChatMessageIn =
        serde_json::from_str(r#"{"role":"user","content":[{"type":"image_url"}]}"#).unwrap();
    assert!(m.text().is_err());
}

#[test]
fn prompt_length_checks() {
    assert!(check_prompt_len(0, None, 100).is_err());
    assert!(check_prompt_len(100, None, 100).is_err());
    assert!(check_prompt_len(99, None, 100).is_ok());
    assert!(check_prompt_len(90, Some(10), 100).is_ok());
    assert!(check_prompt_len(90, Some(11), 100).is_err());
}

/// Booleans as strings (and 0/1) are read as vLLM's pydantic models read them;
/// anything else stays a 400.
#[test]
fn lax_booleans_are_accepted() {
    let completion = |j: &str| parse_generation::<CompletionRequest>(j.as_bytes(), false, false);
    let r = completion(
        r#"{"prompt": "x", "stream": "true", "echo": "False", "ignore_eos": 1,
            "stream_options": {"include_usage": "yes", "continuous_usage_stats": "0"}}"#,
    )
    .unwrap();
    assert_eq!(r.common.stream, Some(true));
    assert_eq!(r.echo, Some(false));
    assert_eq!(r.common.ignore_eos, Some(true));
    let o = r.common.stream_options.unwrap();
    assert_eq!(
        (o.include_usage, o.continuous_usage_stats),
        (Some(true), Some(false))
    );
    let chat: ChatRequest = parse_generation(
        br#"{"messages": [], "logprobs": "true", "use_beam_search": "false"}"#,
        true,
        false,
    )
    .unwrap();
    assert_eq!(chat.logprobs, Some(true));
    // Completions' `logprobs` is a number: "true" is not coerced there.
    assert!(completion(r#"{"prompt": "x", "logprobs": "true"}"#).is_err());
    for bad in [r#""maybe""#, "2", "[]"] {
        let body = format!(r#"{{"prompt": "x", "stream": {bad}}}"#);
        assert!(completion(&body).is_err(), "{body}");
    }
    assert_eq!(fields::lax_bool(&serde_json::json!("OFF")), Some(false));
}

/// Every bad `logit_bias` key is named in one 400; out-of-vocabulary ids in
/// any field say "out of vocabulary" (vLLM's words) and list each id.
#[test]
fn bad_ids_are_all_named() {
    let e = params(r#"{"logit_bias": {"abc": 1, "5000": 1, "7000": 2, "5": 101, "6": 1}}"#)
        .unwrap_err()
        .to_string();
    for want in [
        "`abc`",
        "5000, 7000",
        "out of vocabulary",
        "5 (101)",
        "logit_bias",
    ] {
        assert!(e.contains(want), "{e} lacks {want}");
    }
    for field in ["stop_token_ids", "allowed_token_ids", "logprob_token_ids"] {
        let r = params(&format!(r#"{{"{field}": [1, 4000, 2000, 4000]}}"#));
        let e = r.as_ref().unwrap_err().to_string();
        assert!(
            e.contains("token id 2000, 4000 is out of vocabulary"),
            "{e}"
        );
        assert_eq!(bad_param(r), field);
    }
}
