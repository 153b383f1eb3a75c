"""OpenAI conformance of the request models (deployments/openai_fields.py): every field of OpenAI's
chat and completions requests is implemented, accepted and ignored, or refused with a 400 naming it;
the README's table says what the code's says, and the code's covers every field of the official SDK;
bad values are 400s naming the field. Through the official client: tests/test_openai_conformance.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from deployments.openai_api import APIError, ChatCompletionRequest, CompletionRequest
from deployments.openai_fields import BY_NAME, FIELDS, Status
from tests.openai_examples import CONTEXT, IGNORED, MESSAGES, NEUTRAL, REJECTED

README = Path(__file__).resolve().parents[1] / "README.md"


def _names(chat: bool, top_level: bool = True) -> set[str]:
    return {f.name for f in FIELDS if (f.chat if chat else f.completions) and f.top_level == top_level}


def test_every_field_of_the_openai_sdk_has_a_row():
    """A field the installed SDK sends that the table does not know fails here: decide its row."""
    from openai.types import completion_create_params as completions
    from openai.types.chat import ChatCompletionStreamOptionsParam
    from openai.types.chat import completion_create_params as chat
    from openai.types.chat import (ChatCompletionAssistantMessageParam, ChatCompletionDeveloperMessageParam,
                                   ChatCompletionSystemMessageParam, ChatCompletionToolMessageParam,
                                   ChatCompletionUserMessageParam)

    sdk_chat = set(chat.CompletionCreateParamsBase.__annotations__) | {"stream"}
    sdk_completions = set(completions.CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert sdk_chat - _names(chat=True) == set()
    assert sdk_completions - _names(chat=False) == set()
    nested = _names(chat=True, top_level=False)
    assert {f"stream_options.{k}" for k in ChatCompletionStreamOptionsParam.__annotations__} <= nested
    for message in (ChatCompletionAssistantMessageParam, ChatCompletionDeveloperMessageParam,
                    ChatCompletionSystemMessageParam, ChatCompletionToolMessageParam, ChatCompletionUserMessageParam):
        keys = set(message.__annotations__) - {"role"}
        assert {f"messages[].{k}" for k in keys} <= nested, message.__name__


@pytest.mark.parametrize("model, chat", [(ChatCompletionRequest, True), (CompletionRequest, False)])
def test_the_request_models_declare_exactly_the_table(model, chat):
    assert set(model.model_fields) == _names(chat)


def _readme_rows() -> list[tuple[str, ...]]:
    text = README.read_text()
    section = text[text.index("### OpenAI conformance"):]
    section = section[:section.index("\n### ", 1)]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.append((cells[0].strip("`"), *cells[1:]))
    return rows


def test_readme_table_is_the_code_table():
    """Regenerate README's table with ``python -m deployments.openai_fields`` after changing a row."""
    mark = {True: "✓", False: "—"}
    want = [(f.name, mark[f.chat], mark[f.completions], f.status.value, f.note) for f in FIELDS]
    assert _readme_rows() == want


def test_every_rejected_and_ignored_field_has_an_example():
    top = {f.name: f for f in FIELDS if f.top_level}
    assert {n for n, f in top.items() if f.status is Status.REJECTED} == set(REJECTED)
    assert {n for n, f in top.items() if f.status is Status.IGNORED} == set(IGNORED)
    assert set(NEUTRAL) <= set(REJECTED)


def _request(name: str, value):
    f = BY_NAME[name]
    if f.chat:
        return ChatCompletionRequest(messages=MESSAGES, **{name: value})
    return CompletionRequest(prompt="hi", **{name: value})


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_a_rejected_field_is_a_400_naming_it_and_its_neutral_value_is_not(name):
    with pytest.raises(APIError) as e:
        _request(name, REJECTED[name]).to_engine(CONTEXT)
    assert e.value.status == 400 and e.value.param == name
    assert e.value.message.startswith(f"{name}=") and "not supported" in e.value.message
    if name in NEUTRAL:
        _request(name, NEUTRAL[name]).to_engine(CONTEXT)


@pytest.mark.parametrize("message, words", [
    ({"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}, "messages: tool_calls[0] needs a function"),
    ({"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}, "messages[0]: only assistant"),
    ({"role": "user"}, "messages[0]: content is missing"),
    ({"role": "assistant", "content": "x", "function_call": {"name": "f"}}, "messages[0].function_call="),
    ({"role": "assistant", "content": "x", "audio": {"id": "a"}}, "messages[0].audio="),
    ({"role": "assistant", "content": "x", "refusal": "no"}, "messages[0].refusal="),
    ({"role": "function", "content": "x", "name": "f"}, "messages[0].role='function'"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
     "messages[0].content[0]: content parts of type 'image_url'"),
    ({"role": "user", "content": [{"type": "text"}]}, "messages[0].content[0]: a 'text' part needs a string"),
])
def test_a_rejected_message_field_is_a_400_naming_it(message, words):
    with pytest.raises(APIError) as e:
        ChatCompletionRequest(messages=[message]).to_engine(CONTEXT)
    assert e.value.status == 400 and e.value.param == "messages" and e.value.message.startswith(words)


def test_accepted_message_fields():
    msgs = [{"role": "system", "content": "Be brief.", "name": "sys"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}],
             "tool_calls": [], "refusal": None},
            {"role": "tool", "content": "42", "tool_call_id": "call-1"}]
    [prompt], _ = ChatCompletionRequest(messages=msgs).to_engine(CONTEXT)
    assert prompt == [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi\nthere"},
                      {"role": "tool", "content": "42"}]


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": [True, False]}, "prompt", "prompt: true is not a token id"),
    ({"prompt": [[5, 6], [7, "x"]]}, "prompt", 'prompt[1]: "x" is not a token id'),
    ({"prompt": "x", "temperature": 1e308}, "temperature", "temperature=1e+308: must be between 0 and 2"),
    ({"prompt": "x", "temperature": 2.01}, "temperature", "temperature=2.01: must be between 0 and 2"),
    ({"prompt": "x", "temperature": float("nan")}, "temperature", "temperature=nan: must be between 0 and 2"),
    ({"prompt": "x", "top_p": float("nan")}, "top_p", "top_p=nan: Input should be"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty", "presence_penalty=2.5: Input should be less"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias", "logit_bias="),
    ({"prompt": "x", "min_tokens": 9, "max_tokens": 4}, "min_tokens", "min_tokens=9: must be at most max_tokens=4"),
])
def test_bad_values_are_400s_naming_the_field(body, param, words):
    with pytest.raises(APIError) as e:
        CompletionRequest(**body).to_engine(CONTEXT)
    assert (e.value.status, e.value.param) == (400, param) and e.value.message.startswith(words), e.value.message


def test_a_boolean_is_not_a_number():
    from pydantic import ValidationError

    for field in ("max_tokens", "n", "seed", "temperature", "top_k"):
        with pytest.raises(ValidationError, match="must be a number, not a boolean"):
            CompletionRequest(prompt="x", **{field: True})
    assert CompletionRequest(prompt=[[5, 6]]).to_engine(CONTEXT)[0] == [[5, 6]]
    assert CompletionRequest(prompt="x", temperature=2, top_p=1).to_engine(CONTEXT)[1][0].temperature == 2.0
