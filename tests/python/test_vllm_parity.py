"""vLLM parity (issue 10, request handling): the intent of vLLM's OpenAI-server
tests (tests/entrypoints/openai/), re-aimed at `pagoda serve` with the official
`openai` client. Only what Pagoda implements so far; the rest is refused by name."""

import json
import urllib.error
import urllib.request

import openai
import pytest

from conftest import API_KEY


def _post(server, path, body):
    req = urllib.request.Request(
        server + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def test_completions_default_to_16_tokens(client, model):
    # OpenAI and vLLM default `max_tokens` to 16 for completions.
    r = client.completions.create(model=model, prompt="Tell me a long story:", temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


def test_stop_token_text_is_left_out_unless_asked(client, model, server):
    period = _post(server, "/tokenize", {"prompt": ".", "add_special_tokens": False})["tokens"]
    assert len(period) == 1
    base = dict(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    plain = client.completions.create(**base).choices[0].text
    assert "." in plain, plain
    cut = client.completions.create(**base, extra_body={"stop_token_ids": period}).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == plain[: plain.index(".")], (cut.text, plain)
    kept = client.completions.create(
        **base, extra_body={"stop_token_ids": period, "include_stop_str_in_output": True}
    ).choices[0]
    assert kept.text == plain[: plain.index(".") + 1]


@pytest.mark.parametrize("field,value", [
    ("logits_processors", ["x"]),
    ("guided_regex", "a+"),
    ("prompt_embeds", "x"),
    ("best_of", 3),
])
def test_unimplemented_fields_are_400_naming_them(client, model, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="Hi", max_tokens=2, extra_body={field: value})
    assert field in str(e.value)
    # Harmless OpenAI fields are still accepted.
    assert client.completions.create(model=model, prompt="Hi", max_tokens=1, user="u").choices


def test_unknown_fields_are_ignored_as_vllm_does(client, model):
    # What vllm-router and llm-d add to the requests they forward.
    r = client.completions.create(
        model=model, prompt="Hi", max_tokens=2, temperature=0,
        extra_body={"no_stop_trim": True, "frobnicate": {"x": 1}, "separate_reasoning": False},
    )
    plain = client.completions.create(model=model, prompt="Hi", max_tokens=2, temperature=0)
    assert r.choices[0].text == plain.choices[0].text


def test_stream_options_need_stream(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="Hi", max_tokens=2,
                                  stream_options={"include_usage": True})
    assert "stream=True" in str(e.value)


def test_empty_model_means_the_served_model(client):
    r = client.completions.create(model="", prompt="Hi", max_tokens=2)
    assert r.choices[0].text is not None


def test_empty_cache_salt_is_400(client, model):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="Hi", max_tokens=2, extra_body={"cache_salt": ""})


def test_tokenize_token_strs_are_vocabulary_strings(server):
    r = _post(server, "/tokenize", {"prompt": "The capital is", "return_token_strs": True})
    assert r["token_strs"] == ["The", "Ġcapital", "Ġis"], r


def test_truncate_prompt_tokens_keeps_the_end(client, model, server):
    prompt = "one two three four five six seven eight nine ten"
    ids = _post(server, "/tokenize", {"prompt": prompt})["tokens"]
    r = client.completions.create(model=model, prompt=prompt, max_tokens=1,
                                  extra_body={"truncate_prompt_tokens": 3})
    assert r.usage.prompt_tokens == 3
    # Kept from the end by default: the same as sending the last 3 ids.
    same = client.completions.create(model=model, prompt=ids[-3:], max_tokens=4, temperature=0)
    cut = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0,
                                    extra_body={"truncate_prompt_tokens": 3})
    assert cut.choices[0].text == same.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=prompt, max_tokens=1,
                                  extra_body={"truncate_prompt_tokens": 10**9})


def test_allowed_token_ids_restrict_the_output(client, model, server):
    allowed = _post(server, "/tokenize", {"prompt": " yes no maybe", "add_special_tokens": False})["tokens"]
    r = client.completions.create(model=model, prompt="Answer:", max_tokens=6, temperature=1.0, seed=3,
                                  logprobs=0, extra_body={"allowed_token_ids": allowed,
                                                          "return_tokens_as_token_ids": True,
                                                          "ignore_eos": True})
    ids = [int(t.removeprefix("token_id:")) for t in r.choices[0].logprobs.tokens]
    assert len(ids) == 6 and set(ids) <= set(allowed), (ids, allowed)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="Hi", max_tokens=2,
                                  extra_body={"allowed_token_ids": []})


def test_continuous_usage_stats(client, model):
    chunks = list(client.completions.create(
        model=model, prompt="Count:", max_tokens=5, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    with_usage = [c for c in chunks if c.choices and c.usage is not None]
    assert with_usage, chunks
    done = [c.usage.completion_tokens for c in with_usage]
    assert done == sorted(done) and done[-1] == 5
    assert chunks[-1].usage.completion_tokens == 5


def test_continuous_usage_is_on_every_chat_chunk_the_role_chunk_too(client, model):
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count:"}], max_tokens=4, stream=True,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert all(c.usage is not None for c in with_choices), chunks
    first = with_choices[0].usage
    assert first.completion_tokens == 0 and first.total_tokens == first.prompt_tokens > 0
    assert [c.usage.completion_tokens for c in with_choices][-1] == 4


def _raw(server, path, body):
    req = urllib.request.Request(
        server + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_booleans_sent_as_strings_are_read_as_vllm_reads_them(server, model):
    # pydantic's lax booleans: "true"/"false" (and 0/1, "yes"/"no") are booleans.
    status, body = _raw(server, "/v1/completions", {
        "model": model, "prompt": "Hi", "max_tokens": 3, "stream": "true", "ignore_eos": "True",
        "stream_options": {"include_usage": "true"}})
    assert status == 200, body
    assert body.rstrip().endswith("data: [DONE]"), body
    assert '"completion_tokens":3' in body.replace(" ", ""), body
    status, body = _raw(server, "/v1/completions", {
        "model": model, "prompt": "Hi there", "max_tokens": 3, "echo": "true"})
    assert status == 200 and json.loads(body)["choices"][0]["text"].startswith("Hi there"), body
    status, body = _raw(server, "/v1/completions", {
        "model": model, "prompt": "Hi", "max_tokens": 3, "stream": "maybe"})
    assert status == 400, body


def test_return_token_ids(client, model, server):
    prompt = "The capital of France is"
    ids = _post(server, "/tokenize", {"prompt": prompt})["tokens"]
    r = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0,
                                  extra_body={"return_token_ids": True})
    c = r.choices[0].model_dump()
    assert c["prompt_token_ids"] == ids
    assert len(c["token_ids"]) == r.usage.completion_tokens
    text = _post(server, "/detokenize", {"tokens": c["token_ids"]})["prompt"]
    assert text == c["text"]
    # Streamed: the prompt's ids once, then each chunk's new ids.
    chunks = [ch.model_dump() for ch in client.completions.create(
        model=model, prompt=prompt, max_tokens=5, temperature=0, stream=True,
        extra_body={"return_token_ids": True})]
    streamed = [t for ch in chunks for t in ch["choices"][0].get("token_ids") or []]
    assert streamed == c["token_ids"]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == ids
    # Chat: prompt ids at the top level.
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=3, extra_body={"return_token_ids": True}).model_dump()
    assert chat["prompt_token_ids"] and chat["choices"][0]["token_ids"]


CONVO = [{"role": "user", "content": "What is the capital of France?"},
         {"role": "assistant", "content": "The capital of France is"}]


def test_continue_final_message_and_chat_echo(client, model, server):
    open_ids = _post(server, "/tokenize", {"messages": CONVO, "add_generation_prompt": False,
                                           "continue_final_message": True})["tokens"]
    closed_ids = _post(server, "/tokenize", {"messages": CONVO, "add_generation_prompt": False})["tokens"]
    tail = _post(server, "/tokenize", {"prompt": " is", "add_special_tokens": False})["tokens"]
    assert open_ids[-len(tail):] == tail          # ends inside the assistant's turn
    assert closed_ids[: len(open_ids)] == open_ids and len(closed_ids) > len(open_ids)
    extra = {"add_generation_prompt": False, "continue_final_message": True}
    r = client.chat.completions.create(model=model, messages=CONVO, max_tokens=4, temperature=0,
                                       extra_body=extra)
    cont = r.choices[0].message.content
    assert cont and r.usage.prompt_tokens == len(open_ids)
    echoed = client.chat.completions.create(model=model, messages=CONVO, max_tokens=4, temperature=0,
                                            extra_body={**extra, "echo": True})
    assert echoed.choices[0].message.content == CONVO[-1]["content"] + cont
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=CONVO, max_tokens=4, temperature=0, stream=True,
        extra_body={**extra, "echo": True}) if c.choices)
    assert streamed == CONVO[-1]["content"] + cont
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=CONVO, max_tokens=2,
                                       extra_body={"add_generation_prompt": True,
                                                   "continue_final_message": True})


def test_chat_template_kwargs_reach_the_template_without_overriding_it(server):
    base = {"messages": CONVO[:1]}
    plain = _post(server, "/tokenize", base)["tokens"]
    # Unknown variables are passed (and ignored by this template); standard ones win.
    same = _post(server, "/tokenize", {**base, "chat_template_kwargs": {"enable_thinking": False,
                                                                        "messages": []}})["tokens"]
    assert same == plain
