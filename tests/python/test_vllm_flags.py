"""vLLM parity (issue 10, server flags and endpoints): the intent of vLLM's tests for
`--served-model-name`, `--max-logprobs`, `--enable-request-id-headers`,
`--enable-force-include-usage`, `--return-tokens-as-token-ids`,
`--enable-server-load-tracking`, `--enable-tokenizer-info-endpoint` and
`/invocations`, against one `pagoda serve` started with those flags, with the
official `openai` client."""

import json
import time
import urllib.request

import openai
import pytest

from conftest import _model_path, running_server

NAMES = ["first-name", "second-name"]


@pytest.fixture(scope="module")
def flagged():
    args = [str(_model_path()), "--served-model-name", *NAMES, "--max-logprobs", "5",
            "--enable-request-id-headers", "--enable-force-include-usage",
            "--return-tokens-as-token-ids", "--enable-server-load-tracking",
            "--enable-tokenizer-info-endpoint"]
    with running_server(args, "pagoda-py-flags-", check_exit=False) as base:
        yield base


@pytest.fixture(scope="module")
def fclient(flagged):
    return openai.OpenAI(base_url=flagged + "/v1", api_key="none", max_retries=0, timeout=300)


def _get(base, path):
    with urllib.request.urlopen(base + path, timeout=60) as r:
        return json.load(r)


def _post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def test_served_model_names(fclient):
    assert [m.id for m in fclient.models.list().data] == NAMES
    r = fclient.completions.create(model=NAMES[1], prompt="Hi", max_tokens=2)
    assert r.model == NAMES[0]
    with pytest.raises(openai.NotFoundError):
        fclient.completions.create(model="other", prompt="Hi", max_tokens=2)


def test_max_logprobs(fclient):
    with pytest.raises(openai.BadRequestError) as e:
        fclient.completions.create(model=NAMES[0], prompt="Hi", max_tokens=1, logprobs=6)
    assert "Requested sample logprobs of 6, which is greater than max allowed: 5" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        fclient.chat.completions.create(model=NAMES[0], messages=[{"role": "user", "content": "Hi"}],
                                        max_tokens=1, logprobs=True, top_logprobs=6)
    r = fclient.completions.create(model=NAMES[0], prompt="Hi", max_tokens=1, logprobs=5)
    assert len(r.choices[0].logprobs.top_logprobs[0]) >= 5


def test_request_id_headers(fclient):
    raw = fclient.completions.with_raw_response.create(
        model=NAMES[0], prompt="Hi", max_tokens=1, extra_headers={"X-Request-Id": "client-id-1"})
    assert raw.headers["x-request-id"] == "client-id-1"
    raw = fclient.completions.with_raw_response.create(model=NAMES[0], prompt="Hi", max_tokens=1)
    generated = raw.headers["x-request-id"]
    assert len(generated) == 32 and int(generated, 16) >= 0


def test_force_include_usage(fclient):
    chunks = list(fclient.chat.completions.create(
        model=NAMES[0], messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert all(c.usage is None for c in chunks[:-1])


def test_return_tokens_as_token_ids(fclient, flagged):
    r = fclient.completions.create(model=NAMES[0], prompt="The capital of France is",
                                   max_tokens=5, temperature=0, logprobs=1)
    tokens = r.choices[0].logprobs.tokens
    assert all(t.startswith("token_id:") for t in tokens), tokens
    ids = [int(t.split(":")[1]) for t in tokens]
    assert _post(flagged, "/detokenize", {"tokens": ids})["prompt"] == r.choices[0].text


def test_server_load(fclient, flagged):
    assert _get(flagged, "/load") == {"server_load": 0}
    stream = fclient.completions.create(model=NAMES[0], prompt="Count:", max_tokens=300,
                                        stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    assert _get(flagged, "/load") == {"server_load": 1}
    for _ in stream:
        pass
    for _ in range(50):
        if _get(flagged, "/load") == {"server_load": 0}:
            break
        time.sleep(0.02)
    assert _get(flagged, "/load") == {"server_load": 0}


def test_tokenizer_info(flagged):
    info = _get(flagged, "/tokenizer_info")
    assert info["tokenizer_class"]
    assert info["eos_token"] == "<|im_end|>"
    assert "chat_template" in info


def test_invocations_route_by_shape(fclient, flagged):
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    chat = fclient.chat.completions.create(model=NAMES[0], messages=messages, max_tokens=6,
                                           temperature=0)
    inv = _post(flagged, "/invocations", {"messages": messages, "max_tokens": 6, "temperature": 0})
    assert inv["object"] == "chat.completion"
    assert inv["choices"][0]["message"]["content"] == chat.choices[0].message.content
    cmpl = fclient.completions.create(model=NAMES[0], prompt="2 + 2 =", max_tokens=4, temperature=0)
    inv = _post(flagged, "/invocations", {"prompt": "2 + 2 =", "max_tokens": 4, "temperature": 0})
    assert inv["object"] == "text_completion"
    assert inv["choices"][0]["text"] == cmpl.choices[0].text
