//! Chunk and response shapes, checked on hand-made engine outputs.

use super::*;
use pagoda_core::FinishReason;

fn ctx(api: Api, logprobs: bool, tokens_as_ids: bool) -> Ctx {
    Ctx {
        api,
        id: "cmpl-1".into(),
        created: 7,
        model: "m".into(),
        logprobs,
        tokens_as_ids,
        include_usage: true,
        continuous_usage: false,
        return_token_ids: false,
        prompt_logprobs: false,
        text: Arc::new(|id: u32| format!("<{id}>")),
        metrics: Arc::new(Metrics::default()),
        shaping: None,
    }
}

fn out(ids: &[u32], text: &str, finished: bool) -> RequestOutput {
    RequestOutput {
        request_id: "r".into(),
        new_token_ids: ids.to_vec(),
        new_text: text.into(),
        new_logprobs: ids
            .iter()
            .map(|&id| TokenLogprobs {
                token_id: id,
                logprob: -0.5,
                top: vec![(id, -0.5), (99, -1.5)],
            })
            .collect(),
        finished,
        finish_reason: finished.then_some(FinishReason::Length),
        stop_reason: None,
        num_prompt_tokens: 5,
        num_cached_tokens: 2,
        num_output_tokens: 0,
        error: None,
        prompt_logprobs: None,
        metrics: None,
    }
}

#[test]
fn completion_chunk_shape() {
    let c = ctx(Api::Completion, false, false);
    let v = c.chunk(3, "hi", None, Some(FinishReason::Stop), Value::Null, false);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["index"], 3);
    assert_eq!(v["choices"][0]["text"], "hi");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["logprobs"].is_null());
    let e = sse_event(&v);
    assert!(e.starts_with("data: {") && e.ends_with("}\n\n") && !e[6..e.len() - 2].contains('\n'));
}

#[test]
fn chat_chunks_carry_role_first() {
    let c = ctx(Api::Chat, false, false);
    let first = c.chunk(0, "", None, None, Value::Null, true);
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let next = c.chunk(0, "x", None, None, Value::Null, false);
    assert_eq!(next["choices"][0]["delta"], json!({"content": "x"}));
    let last = c.chunk(0, "", None, Some(FinishReason::Length), Value::Null, false);
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(last["choices"][0]["finish_reason"], "length");
}

#[test]
fn completion_logprobs_accumulate_with_offsets() {
    let c = ctx(Api::Completion, true, false);
    let mut st = ChoiceState::new(0, true, 5, Instant::now());
    let mut acc = None;
    for o in [out(&[1], "<1>", false), out(&[22, 3], "<22><3>", true)] {
        if let Some(lp) = st.absorb(&c, &o) {
            merge_logprobs(&mut acc, lp);
        }
    }
    let lp = acc.unwrap();
    assert_eq!(lp["tokens"], json!(["<1>", "<22>", "<3>"]));
    assert_eq!(lp["text_offset"], json!([0, 3, 7]));
    assert_eq!(lp["token_logprobs"], json!([-0.5, -0.5, -0.5]));
    assert_eq!(lp["top_logprobs"][0], json!({"<1>": -0.5, "<99>": -1.5}));
    assert_eq!(st.text, "<1><22><3>");
    assert_eq!(st.finish_reason, Some(FinishReason::Length));
    assert_eq!(st.num_output_tokens, 3);
}

#[test]
fn tokens_as_ids() {
    let c = ctx(Api::Completion, true, true);
    let mut off = 0;
    let lp = c.logprobs_json(&out(&[42], "", false).new_logprobs, &mut off);
    assert_eq!(lp["tokens"], json!(["token_id:42"]));
}

#[test]
fn chat_logprobs_shape() {
    let c = ctx(Api::Chat, true, false);
    let mut off = 0;
    let lp = c.logprobs_json(&out(&[7], "", false).new_logprobs, &mut off);
    let e = &lp["content"][0];
    assert_eq!(e["token"], "<7>");
    assert_eq!(e["bytes"], json!([60, 55, 62]));
    assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(e["top_logprobs"][1]["token"], "<99>");
}

#[test]
fn usage_counts_prompts_once_per_prompt() {
    let c = ctx(Api::Completion, false, false);
    let mut states: Vec<ChoiceState> = (0..3)
        .map(|i| ChoiceState::new(i, i == 0, 5, Instant::now()))
        .collect();
    for s in &mut states {
        s.absorb(&c, &out(&[1, 2], "ab", true));
    }
    let u = usage(&states);
    assert_eq!(u["prompt_tokens"], 5);
    assert_eq!(u["completion_tokens"], 6);
    assert_eq!(u["total_tokens"], 11);
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 2);
    let r = c.response(&states);
    assert_eq!(r["choices"].as_array().unwrap().len(), 3);
    assert_eq!(r["choices"][2]["text"], "ab");
    assert_eq!(r["choices"][2]["finish_reason"], "length");
    let chunk = c.usage_chunk(u);
    assert_eq!(chunk["choices"], json!([]));
}

fn plp(token_id: u32, logprob: f32, rank: u32, top: &[(u32, f32)]) -> PromptLogprob {
    PromptLogprob {
        token_id,
        logprob,
        rank,
        top: top.to_vec(),
    }
}

#[test]
fn prompt_logprobs_list_has_the_token_and_ranked_alternatives() {
    let c = ctx(Api::Completion, false, false);
    let v = c.prompt_logprobs_json(&[
        plp(5, -2.0, 3, &[(7, -0.1), (8, -1.0)]),
        plp(7, -0.1, 1, &[(7, -0.1), (8, -1.0)]),
    ]);
    assert_eq!(v[0], Value::Null);
    assert_eq!(v[1]["5"]["rank"], 3);
    assert_eq!(v[1]["5"]["decoded_token"], "<5>");
    assert_eq!(v[1]["7"]["rank"], 1);
    assert_eq!(v[1]["8"]["rank"], 2);
    // The prompt token among the top entries is listed once, with its own rank.
    assert_eq!(v[2].as_object().unwrap().len(), 2);
    assert_eq!(v[2]["7"]["rank"], 1);
}

#[test]
fn echo_logprobs_fill_all_but_the_first_prompt_token() {
    let c = ctx(Api::Completion, true, false);
    let mut off = 0;
    let v = c.echo_logprobs(
        &[1, 5, 7],
        Some(&[plp(5, -2.0, 3, &[(7, -0.5)]), plp(7, -0.5, 1, &[])]),
        &mut off,
    );
    assert_eq!(v["tokens"], json!(["<1>", "<5>", "<7>"]));
    assert_eq!(v["token_logprobs"], json!([null, -2.0, -0.5]));
    assert_eq!(v["top_logprobs"][0], Value::Null);
    assert_eq!(v["top_logprobs"][1], json!({"<7>": -0.5, "<5>": -2.0}));
    assert_eq!(v["text_offset"], json!([0, 3, 6]));
    assert_eq!(off, 9);
    // Without values (none computed) every entry is null, as before.
    let v = c.echo_logprobs(&[1, 5], None, &mut 0);
    assert_eq!(v["token_logprobs"], json!([null, null]));
}
