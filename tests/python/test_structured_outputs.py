"""Structured outputs (issue 10): `response_format` and vLLM's `structured_outputs`
on both endpoints, through the official `openai` client, with the intent of vLLM's
tests/entrypoints/openai structured-output tests: the text parses and validates,
streaming deltas add up to valid output, invalid constraints and two constraints at
once are 400s."""

import json
import re

import openai
import pytest

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _check_person(text):
    v = json.loads(text)
    assert isinstance(v, dict), text
    assert set(v) == {"name", "age"}, text
    assert isinstance(v["name"], str) and 1 <= len(v["name"]) <= 20, text
    assert isinstance(v["age"], int) and 0 <= v["age"] <= 150, text


def _messages(q):
    return [{"role": "user", "content": q}]


def test_chat_json_schema(client, model):
    for extra in [dict(temperature=0), dict(temperature=1.0, seed=11)]:
        r = client.chat.completions.create(
            model=model,
            messages=_messages("Give me a person as JSON."),
            max_tokens=64,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
            **extra,
        )
        c = r.choices[0]
        assert c.finish_reason == "stop", c
        _check_person(c.message.content)


def test_chat_json_object(client, model):
    r = client.chat.completions.create(
        model=model, messages=_messages('Repeat this JSON exactly: {"dog": "brown", "age": 4}'), max_tokens=64,
        temperature=0, response_format={"type": "json_object"},
    )
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    assert isinstance(json.loads(c.message.content), dict)


def test_completions_regex_and_choice(client, model):
    pattern = r"[A-Z][a-z]{2,8}, [0-9]{2}"
    r = client.completions.create(
        model=model, prompt="A name and an age:", max_tokens=20, temperature=0,
        extra_body={"structured_outputs": {"regex": pattern}},
    )
    assert re.fullmatch(pattern, r.choices[0].text), r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    choices = ["positive", "negative", "neutral"]
    for seed in range(3):
        r = client.completions.create(
            model=model, prompt="The sentiment of 'I love it' is", max_tokens=8,
            temperature=1.0, seed=seed, extra_body={"structured_outputs": {"choice": choices}},
        )
        assert r.choices[0].text in choices, r.choices[0].text


def test_completions_grammar_and_json_string(client, model):
    lark = 'start: "SELECT " col " FROM " tbl\ncol: "id" | "name"\ntbl: "users" | "orders"'
    r = client.completions.create(
        model=model, prompt="An SQL query:", max_tokens=20, temperature=0,
        extra_body={"structured_outputs": {"grammar": lark}},
    )
    assert re.fullmatch(r"SELECT (id|name) FROM (users|orders)", r.choices[0].text), r.choices[0].text
    # The same grammar in GBNF/EBNF (llama.cpp's `::=` format), which vLLM also takes.
    ebnf = 'root ::= "SELECT " col " FROM " tbl\ncol ::= "id" | "name"\ntbl ::= "users" | "orders"'
    e = client.completions.create(
        model=model, prompt="An SQL query:", max_tokens=20, temperature=0,
        extra_body={"structured_outputs": {"grammar": ebnf}},
    )
    assert e.choices[0].text == r.choices[0].text
    # vLLM also takes the schema as a JSON string.
    r = client.completions.create(
        model=model, prompt="A person as JSON:", max_tokens=64, temperature=0,
        extra_body={"structured_outputs": {"json": json.dumps(PERSON)}},
    )
    _check_person(r.choices[0].text)


def test_streaming_deltas_validate(client, model):
    stream = client.chat.completions.create(
        model=model, messages=_messages("A person as JSON."), max_tokens=64, temperature=0,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
    )
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert finish == "stop"
    _check_person(text)
    stream = client.completions.create(
        model=model, prompt="Yes or no?", max_tokens=8, temperature=0, stream=True,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) in ["yes", "no"]


def test_n_samples_each_follow_the_schema(client, model):
    r = client.chat.completions.create(
        model=model, messages=_messages("A person as JSON."), max_tokens=64, temperature=1.0,
        seed=3, n=3,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
    )
    assert len(r.choices) == 3
    for c in r.choices:
        _check_person(c.message.content)


@pytest.mark.parametrize("extra", [
    {"structured_outputs": {"regex": "[a-"}},
    {"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "frob"}}}}},
    {"structured_outputs": {"grammar": "start: missing_rule"}},
    {"structured_outputs": {"json": "{not json"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
])
def test_invalid_constraint_is_400(client, model, extra):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="Hi", max_tokens=4, extra_body=extra)
    # The server still serves.
    assert client.completions.create(model=model, prompt="Hi", max_tokens=1).choices


def test_invalid_response_format_schema_names_response_format(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=_messages("Hi"), max_tokens=4,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        )
    assert "response_format" in str(e.value)


@pytest.mark.parametrize("extra", [
    {"structured_outputs": {"regex": "a+", "choice": ["a"]}},
    {"structured_outputs": {"regex": "a+"}, "response_format": {"type": "json_object"}},
])
def test_two_constraints_are_400(client, model, extra):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=_messages("Hi"), max_tokens=4,
                                       extra_body=extra)
    assert "only use one kind of structured outputs constraint" in str(e.value)


def test_response_format_text_is_unconstrained(client, model):
    base = dict(model=model, messages=_messages("Say hi."), max_tokens=8, temperature=0)
    plain = client.chat.completions.create(**base).choices[0].message.content
    text = client.chat.completions.create(**base, response_format={"type": "text"})
    assert text.choices[0].message.content == plain


def test_logprobs_of_a_constrained_row_are_json_numbers(client, model):
    # The mask leaves fewer than 5 candidates: masked tokens' -inf is vLLM's -9999.0.
    r = client.completions.create(
        model=model, prompt="Yes or no?", max_tokens=4, temperature=0, logprobs=5,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    lp = r.choices[0].logprobs
    assert r.choices[0].text in ["yes", "no"]
    for v in lp.token_logprobs:
        assert isinstance(v, float) and -9999.0 <= v <= 0.0
    for top in lp.top_logprobs:
        assert all(isinstance(v, float) and v >= -9999.0 for v in top.values()), top
    c = client.chat.completions.create(
        model=model, messages=_messages("Yes or no?"), max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=5, extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    for e in c.choices[0].logprobs.content:
        assert all(t.logprob >= -9999.0 for t in e.top_logprobs)
