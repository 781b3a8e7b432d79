"""Tool calling and reasoning output (issue 25) through the official `openai`
client: `tool_choice` "required" and a named function return arguments that
validate against the schema, streamed and not; `auto` with the hermes parser on
an output forced (structured_outputs regex) to hold a `<tool_call>` block gives
the same `tool_calls` streamed and not; a forced `<think>` lands in `reasoning`;
a conversation with the assistant's calls and the tool's answer is accepted."""

import json

import openai
import pytest

from conftest import _model_path, running_server

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "London"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_client():
    args = ["--model", str(_model_path()), "--enable-auto-tool-choice", "--tool-call-parser",
            "hermes", "--reasoning-parser", "qwen3"]
    with running_server(args, log_prefix="pagoda-py-tools-") as base:
        yield openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=300)


def _check(call):
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"}, args
    assert args["city"] in ("Paris", "London") and args["unit"] in ("celsius", "fahrenheit")
    return args


def _stream_calls(client, **kw):
    calls, finish, content = {}, None, ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        content += c.delta.content or ""
        for t in c.delta.tool_calls or []:
            if t.index not in calls:
                assert t.id and t.function.name, t
                calls[t.index] = [t.function.name, ""]
            else:
                assert t.id is None and t.function.name is None, t
            calls[t.index][1] += t.function.arguments or ""
        finish = c.finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], finish, content


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_validate(tool_client, choice):
    kw = dict(model=tool_client.models.list().data[0].id, messages=MESSAGES, tools=TOOLS,
              tool_choice=choice, parallel_tool_calls=False, max_tokens=100, temperature=0)
    r = tool_client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert len(msg.tool_calls) == 1
    _check(msg.tool_calls[0])
    assert r.choices[0].finish_reason == ("tool_calls" if choice == "required" else "stop")
    calls, finish, _ = _stream_calls(tool_client, **kw)
    assert calls == [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    assert finish == r.choices[0].finish_reason


def test_auto_hermes_same_streamed_and_not(tool_client):
    regex = (r'<tool_call>\{"name": "get_weather", "arguments": '
             r'\{"city": "London", "unit": "fahrenheit"\}\}</tool_call>')
    kw = dict(model=tool_client.models.list().data[0].id, messages=MESSAGES, tools=TOOLS,
              max_tokens=80, temperature=0, extra_body={"structured_outputs": {"regex": regex}})
    r = tool_client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert _check(msg.tool_calls[0]) == {"city": "London", "unit": "fahrenheit"}
    assert not msg.content and r.choices[0].finish_reason == "tool_calls"
    calls, finish, content = _stream_calls(tool_client, **kw)
    assert calls == [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    assert finish == "tool_calls" and content == ""


def test_reasoning_and_multi_turn(tool_client):
    model = tool_client.models.list().data[0].id
    r = tool_client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=40, temperature=0,
        extra_body={"structured_outputs": {"regex": r"<think>Paris is in France\.</think>Sunny\."}})
    msg = r.choices[0].message
    assert msg.content == "Sunny."
    assert msg.model_extra["reasoning"] == "Paris is in France."
    turn = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    ]
    r = tool_client.chat.completions.create(model=model, messages=turn, tools=TOOLS,
                                            tool_choice="none", max_tokens=5, temperature=0)
    assert isinstance(r.choices[0].message.content, str)


def test_bad_tool_choice_is_400(tool_client):
    with pytest.raises(openai.BadRequestError) as e:
        tool_client.chat.completions.create(
            model=tool_client.models.list().data[0].id, messages=MESSAGES, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}}, max_tokens=5)
    assert "nope" in str(e.value)
