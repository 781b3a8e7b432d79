"""vLLM's `prompt_logprobs` and completions `echo` + `logprobs` (issue 10, items 3
and 5), re-aimed from vLLM's tests/entrypoints/openai/test_completion*.py at
`pagoda serve` with the official `openai` client."""

import math

import openai
import pytest

from conftest import _model_path, running_server

PROMPT = "The capital of France is"


def _ids(client, model, prompt):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                                  extra_body={"return_token_ids": True})
    return r.choices[0].prompt_token_ids


def test_prompt_logprobs_shape_and_ranks(client, model):
    ids = _ids(client, model, PROMPT)
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 3})
    pl = r.choices[0].prompt_logprobs
    assert len(pl) == len(ids) and pl[0] is None
    for tok, entry in zip(ids[1:], pl[1:]):
        # The prompt token itself is always there, plus the 3 most likely tokens.
        assert str(tok) in entry
        assert 3 <= len(entry) <= 4
        ranks = sorted(e["rank"] for e in entry.values())
        assert ranks[:3] == [1, 2, 3]
        for e in entry.values():
            assert e["logprob"] <= 0 and isinstance(e["decoded_token"], str)
        # Rank 1 is the most likely: no entry beats it.
        best = max(entry.values(), key=lambda e: e["logprob"])
        assert best["rank"] == 1


def test_prompt_logprobs_agree_with_sampled_logprobs(client, model):
    # The logprob of a prompt token must equal the logprob the model gives that
    # token when it generates it after the same prefix.
    gen = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, temperature=0,
                                    logprobs=1, extra_body={"return_token_ids": True})
    c = gen.choices[0]
    ids = c.prompt_token_ids + c.token_ids
    want = c.logprobs.token_logprobs[0]
    r = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 0})
    last = r.choices[0].prompt_logprobs[-1][str(c.token_ids[0])]
    assert abs(last["logprob"] - want) < 2e-3, (last, want)
    assert last["rank"] == 1  # it was the greedy choice


def test_prompt_logprobs_ignore_the_prefix_cache(client, model):
    # A second identical request would hit the prefix cache; prompt logprobs must
    # still cover (and equal) every prompt token.
    body = dict(model=model, prompt=PROMPT * 12, max_tokens=1, temperature=0)
    a = client.completions.create(**body, extra_body={"prompt_logprobs": 1}).choices[0]
    b = client.completions.create(**body, extra_body={"prompt_logprobs": 1}).choices[0]
    assert len(a.prompt_logprobs) == len(b.prompt_logprobs) > 40
    for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
        assert x.keys() == y.keys()
        for k in x:
            assert abs(x[k]["logprob"] - y[k]["logprob"]) < 1e-4


def test_echo_with_logprobs_fills_prompt_tokens(client, model):
    ids = _ids(client, model, PROMPT)
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0,
                                  echo=True, logprobs=2)
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(PROMPT)
    n = len(ids) + 3
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for v, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert v is not None and v <= 0 and math.isfinite(v)
        assert 2 <= len(top) <= 3
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_echo_with_logprobs_streams_them_first(client, model):
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=3,
                                            temperature=0, echo=True, logprobs=1, stream=True))
    first = chunks[0].choices[0]
    assert first.text.startswith(PROMPT)
    assert first.logprobs.token_logprobs[0] is None
    assert all(v is not None for v in first.logprobs.token_logprobs[1:])
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=3, temperature=0,
                                      echo=True, logprobs=1)
    assert text == plain.choices[0].text
    streamed = [v for c in chunks if c.choices and c.choices[0].logprobs
                for v in c.choices[0].logprobs.token_logprobs]
    assert streamed[1:] == pytest.approx(plain.choices[0].logprobs.token_logprobs[1:], abs=1e-5)


def test_chat_prompt_logprobs_at_top_level(client, model):
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=2, temperature=0,
                                       extra_body={"prompt_logprobs": 1, "return_token_ids": True})
    pl = r.model_extra["prompt_logprobs"]
    assert pl[0] is None
    assert len(pl) == len(r.model_extra["prompt_token_ids"])


@pytest.mark.parametrize("extra,stream,needle", [
    ({"prompt_logprobs": 1}, True, "stream=True"),
    ({"prompt_logprobs": -1}, True, "stream=True"),
    ({"prompt_logprobs": -2}, False, "positive value or -1"),
    ({"prompt_logprobs": 21}, False, "greater than max allowed"),
])
def test_prompt_logprobs_bad_values_are_400(client, model, extra, stream, needle):
    with pytest.raises(openai.BadRequestError) as e:
        r = client.completions.create(model=model, prompt="Hi", max_tokens=1, stream=stream,
                                      extra_body=extra)
        list(r) if stream else None
    assert needle in str(e.value)


def test_prompt_logprobs_whole_vocabulary_is_checked_against_max_logprobs(client, model):
    # vLLM's rule: -1 counts as the vocabulary's size, above --max-logprobs (20) a 400.
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="Hi there", max_tokens=1,
                                  extra_body={"prompt_logprobs": -1})
    assert "greater than max allowed: 20" in str(e.value)


def test_prompt_logprobs_whole_vocabulary_with_no_cap():
    with running_server([str(_model_path()), "--max-logprobs", "-1"], "pagoda-py-plp-") as base:
        c = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=300)
        m = c.models.list().data[0].id
        r = c.completions.create(model=m, prompt="Hi there", max_tokens=1,
                                 extra_body={"prompt_logprobs": -1})
        pl = r.choices[0].prompt_logprobs
        assert len(pl[1]) > 40000  # every token of the vocabulary
        assert abs(sum(math.exp(e["logprob"]) for e in pl[1].values()) - 1) < 1e-3


def test_bad_words_are_never_generated(client, model):
    base = dict(model=model, prompt=PROMPT, max_tokens=8, temperature=0)
    plain = client.completions.create(**base).choices[0].text
    assert "Paris" in plain, plain
    banned = client.completions.create(**base, extra_body={"bad_words": ["Paris"]}).choices[0].text
    assert "Paris" not in banned, banned
    # A multi-token word: only its completion is banned, after its prefix.
    two = client.completions.create(**base, extra_body={"bad_words": ["capital of France"]})
    assert "capital of France" not in two.choices[0].text


def test_logprob_token_ids_report_those_tokens(client, model):
    ids = _ids(client, model, " Paris London")[-2:]
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=3, temperature=0, logprobs=True,
                                       extra_body={"logprob_token_ids": ids, "return_token_ids": True})
    for entry in r.choices[0].logprobs.content:
        assert [t.token for t in entry.top_logprobs] == [" Paris", " London"]
        assert all(t.logprob <= 0 for t in entry.top_logprobs)
    c = client.completions.create(model=model, prompt=PROMPT, max_tokens=2, temperature=0,
                                  extra_body={"logprob_token_ids": ids})
    assert {" Paris", " London"} <= set(c.choices[0].logprobs.top_logprobs[0])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt=PROMPT, max_tokens=1,
                                  extra_body={"logprob_token_ids": [10**9]})
