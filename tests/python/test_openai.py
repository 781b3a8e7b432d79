"""The official `openai` Python client against `pagoda serve` (see conftest.py)."""

import openai
import pytest


def _ids(logprobs) -> list:
    return [int(t.removeprefix("token_id:")) for t in logprobs.tokens]


def test_models_lists_the_served_model(client, model):
    models = client.models.list().data
    assert [m.id for m in models] == [model]


def test_greedy_completions_match_the_reference(client, model, reference):
    for case in reference["cases"]:
        safe = case["safe_len"]
        want = case["greedy_ids"][:safe]
        ends_eos = want[-1] == 2
        # Past an EOS nothing is generated, so room beyond it is safe (and shows "stop").
        r = client.completions.create(
            model=model, prompt=case["prompt_ids"], max_tokens=safe + 4 if ends_eos else safe,
            temperature=0, logprobs=0,
            extra_body={"return_tokens_as_token_ids": True},
        )
        assert _ids(r.choices[0].logprobs) == want, case["prompt"]
        assert r.choices[0].finish_reason == ("stop" if ends_eos else "length")
        assert r.usage.completion_tokens == safe
    # A text prompt continues like its reference ids.
    case = reference["cases"][0]
    r = client.completions.create(model=model, prompt=case["prompt"], max_tokens=8, temperature=0)
    assert r.choices[0].text == case["greedy_text"][: len(r.choices[0].text)]
    assert r.choices[0].text and case["greedy_text"].startswith(r.choices[0].text)


def test_streaming_equals_non_streaming_with_usage(client, model):
    kw = dict(model=model, prompt="def fibonacci(n):", max_tokens=24, temperature=0)
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason]
    # No usage chunk unless asked for.
    chunks = list(client.completions.create(**kw, stream=True))
    assert all(c.choices for c in chunks)


def test_chat_streaming(client, model):
    kw = dict(model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}],
              max_completion_tokens=16, temperature=0)
    full = client.chat.completions.create(**kw)
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_chat_logprobs(client, model):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=3,
        temperature=0, logprobs=True, top_logprobs=2,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)


def test_n_samples_with_seed_are_reproducible(client, model):
    kw = dict(model=model, prompt="My favourite animal is", max_tokens=6, temperature=1.0, n=2, seed=7)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert sorted(c.index for c in a.choices) == [0, 1]


@pytest.mark.parametrize(
    "kw",
    [
        {"max_tokens": -1},
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"prompt": ""},
    ],
)
def test_bad_requests_are_400(client, model, kw):
    args = dict(model=model, prompt="x", max_tokens=4)
    args.update(kw)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**args)
    assert e.value.status_code == 400
    # Still serving.
    assert client.completions.create(model=model, prompt="Hi", max_tokens=1).choices


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)


def test_wrong_key_is_401(server, model):
    bad = openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=model, prompt="x", max_tokens=1)
