"""`/v1/responses` and `/v1/messages` (issue 25 items 4 and 5) through the
official clients: `openai`'s `client.responses` (text, streamed events, a forced
function call and its `function_call_output` round trip through
`previous_response_id`, `retrieve`, errors) and `anthropic`'s
`messages.create` / `messages.stream` (text, a forced `tool_use` and its
`tool_result`, `count_tokens`, the `x-api-key` it sends, errors). The
`anthropic` 2.x client has no `temperature` argument: it goes in `extra_body`."""

import json

import anthropic
import openai
import pytest

from conftest import _model_path, running_server

KEY = "agents-py-key"
PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
FLAT_TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
               "parameters": PARAMS}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "The weather in a city",
                    "input_schema": PARAMS}]


@pytest.fixture(scope="module")
def base():
    args = ["--model", str(_model_path()), "--api-key", KEY,
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with running_server(args, log_prefix="pagoda-py-agents-") as b:
        yield b


@pytest.fixture(scope="module")
def oai(base):
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def claude(base):
    return anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(oai):
    return oai.models.list().data[0].id


def _check_args(args):
    assert set(args) == {"city", "unit"}, args
    assert args["city"] in ("Paris", "London") and args["unit"] in ("celsius", "fahrenheit")


def test_responses_text_streamed_and_retrieved(oai, model):
    kw = dict(model=model, input="Say hello.", instructions="Be brief.",
              max_output_tokens=16, temperature=0)
    r = oai.responses.create(**kw)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text and r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 16
    types, text, last = [], "", None
    for e in oai.responses.create(stream=True, **kw):
        types.append(e.type)
        if e.type == "response.output_text.delta":
            text += e.delta
        last = e
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"], types
    assert {"response.output_text.done", "response.content_part.done",
            "response.output_item.done"} <= set(types), types
    assert types[-1] == "response.completed"
    assert text == r.output_text == last.response.output_text
    assert last.response.status == r.status
    # The client's stream helper (it needs `response.completed`, also when incomplete).
    with oai.responses.stream(**kw) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    assert final.output_text == r.output_text and final.status == r.status
    got = oai.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text


def test_responses_function_call_round_trip(oai, model):
    kw = dict(model=model, input=[{"role": "user", "content": "Weather in Paris?"}],
              tools=FLAT_TOOLS, tool_choice={"type": "function", "name": "get_weather"},
              max_output_tokens=60, temperature=0)
    r = oai.responses.create(**kw)
    calls = [i for i in r.output if i.type == "function_call"]
    assert len(calls) == 1, r.output
    assert calls[0].name == "get_weather"
    _check_args(json.loads(calls[0].arguments))
    args = ""
    for e in oai.responses.create(stream=True, **kw):
        if e.type == "response.function_call_arguments.delta":
            args += e.delta
        if e.type == "response.function_call_arguments.done":
            assert e.arguments == args
    assert args == calls[0].arguments
    follow = oai.responses.create(
        model=model, previous_response_id=r.id, max_output_tokens=8, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "21 C"}])
    assert follow.previous_response_id == r.id
    assert follow.usage.input_tokens > r.usage.input_tokens
    assert isinstance(follow.output_text, str)


def test_responses_errors(oai, model):
    with pytest.raises(openai.BadRequestError, match="web_search"):
        oai.responses.create(model=model, input="x", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="background"):
        oai.responses.create(model=model, input="x", background=True)
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model=model, input="x", previous_response_id="resp_nope")
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve("resp_nope")


def test_messages_text_and_stream(claude, model):
    kw = dict(model=model, max_tokens=16, extra_body={"temperature": 0}, system="Be brief.",
              messages=[{"role": "user", "content": "Say hello."}])
    m = claude.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 16
    with claude.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert final.stop_reason == m.stop_reason
    assert final.usage.output_tokens == m.usage.output_tokens
    n = claude.messages.count_tokens(model=model, system="Be brief.", messages=kw["messages"])
    assert n.input_tokens == m.usage.input_tokens


def test_messages_tool_use_round_trip(claude, model):
    kw = dict(model=model, max_tokens=60, extra_body={"temperature": 0}, tools=ANTHROPIC_TOOLS,
              tool_choice={"type": "tool", "name": "get_weather"},
              messages=[{"role": "user", "content": "Weather in Paris?"}])
    m = claude.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    _check_args(uses[0].input)
    with claude.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [uses[0].input]
    assert final.stop_reason == "tool_use"
    follow = claude.messages.create(
        model=model, max_tokens=8, extra_body={"temperature": 0}, tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "none"},
        messages=[kw["messages"][0],
                  {"role": "assistant", "content": [b.model_dump() for b in m.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                "content": "21 degrees"}]}])
    assert follow.usage.input_tokens > m.usage.input_tokens
    assert follow.stop_reason != "tool_use"


def test_messages_errors(claude, base, model):
    with pytest.raises(anthropic.BadRequestError, match="bash_20250124"):
        claude.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "x"}],
                               tools=[{"type": "bash_20250124", "name": "bash"}])
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=4,
                               messages=[{"role": "user", "content": "x"}])
    wrong = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "x"}])
