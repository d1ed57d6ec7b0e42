"""OpenAI's wire format: parsing, the options refused with a 400, and prompts."""

from __future__ import annotations

import pytest

from multiagenttrainer.serve.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    chat_messages,
    check_chat,
    check_completion,
    parse_request,
    prompt_input,
)


def completion(**fields: object) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "x", **fields})


def chat(**fields: object) -> ChatRequest:
    return ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}
    )


def error_of(call: object, *args: object) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)  # type: ignore[operator]
    return caught.value


def test_bodies_that_are_not_requests() -> None:
    assert error_of(parse_request, b"{oops", CompletionRequest).status == 400
    assert error_of(parse_request, b'"text"', CompletionRequest).status == 400
    invalid = error_of(
        parse_request, b'{"model": "m", "messages": [{"role": "user", "content": 3}]}', ChatRequest
    )
    assert invalid.status == 422 and invalid.param == "messages.0.content"
    assert "messages.0.content: has the wrong type (int)" in invalid.message
    ranged = error_of(parse_request, b'{"model": "m", "top_p": 0}', CompletionRequest)
    assert ranged.status == 422 and "top_p" in ranged.message


def test_unknown_fields_are_ignored() -> None:
    request = parse_request(b'{"model": "m", "prompt": "x", "service_tier": "auto"}', CompletionRequest)
    assert request.prompt == "x"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True}, "echo"),
        ({"logprobs": 2}, "logprobs"),
        ({"suffix": "end"}, "suffix"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": "x" * 257}, "stop"),
    ],
)
def test_completion_options_this_server_does_not_implement(fields: dict[str, object], param: str) -> None:
    error = error_of(check_completion, completion(**fields))
    assert error.status == 400 and error.param == param


def test_neutral_values_of_those_options_pass() -> None:
    check_completion(completion(n=1, best_of=1, echo=False, presence_penalty=0, stop=["a", "", "b"]))
    check_chat(chat(tool_choice="none", response_format={"type": "text"}, logprobs=False))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
    ],
)
def test_chat_options_this_server_does_not_implement(fields: dict[str, object], param: str) -> None:
    assert error_of(check_chat, chat(**fields)).param == param


def test_prompts() -> None:
    assert prompt_input(completion(prompt="abc")) == "abc"
    assert prompt_input(completion(prompt=["abc"])) == "abc"
    assert prompt_input(completion(prompt=[4, 5])) == [4, 5]
    assert prompt_input(completion(prompt=None)) == ""
    assert error_of(prompt_input, completion(prompt=["a", "b"])).param == "prompt"
    assert error_of(prompt_input, completion(prompt=[])).param == "prompt"


def test_chat_messages_keep_text_parts_only() -> None:
    request = chat(
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    )
    assert chat_messages(request) == [{"role": "user", "content": "ab"}]
    image = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert error_of(chat_messages, image).param == "messages.0.content"
