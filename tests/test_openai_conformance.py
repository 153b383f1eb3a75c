"""OpenAI conformance through the official `openai` client (the request models and the README's
table alone: tests/test_openai_fields.py): rejected fields are 400s naming them, ignored ones and
neutral values change nothing, usage and streaming options, extensions, context overflow, raw JSON
edge cases, and an OpenAPI document that declares what the routes answer.

The client runs against the real FastAPI app of deployments/app.py, in-process: the Serve routes get the replica object they run on directly
(``serve.get_replica_context`` patched), over the default model with a short context (256 tokens)
so that context-overflow cases are cheap. Over Serve and HTTP: tests/test_openai_http.py."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx2 as httpx
import openai
import pytest

from deployments.openai_fields import BY_NAME
from tests.openai_examples import CONTEXT, IGNORED, MESSAGES, MODEL, NEUTRAL, REJECTED


# ---- the official client against the real app, in-process ------------------------------------
@pytest.fixture(scope="module")
def app(default_model):
    """deployments.app's FastAPI app with its routes bound to an in-process replica stand-in."""
    from ray import serve

    from cluster.async_engine import AsyncLLMEngine
    from cluster.config import EngineConfig, SpeculativeConfig
    from cluster.engine import LLMEngine
    from deployments.admission import Admission
    from deployments.app import app
    from deployments.openai_server import OpenAIServer

    config = EngineConfig(num_kv_blocks=64, num_threads=1, max_model_len=CONTEXT,
                          speculative=SpeculativeConfig.from_draft_arg("ngram", 4))
    engine = LLMEngine(config, loaded=default_model)
    server = OpenAIServer(AsyncLLMEngine(engine), MODEL, engine.max_model_len, Admission(4, 8, 1, 30))
    replica = SimpleNamespace(server=server)
    patch = pytest.MonkeyPatch()
    patch.setattr(serve, "get_replica_context", lambda: SimpleNamespace(servable_object=replica))
    yield app
    patch.undo()
    server.aeng.shutdown()


def _call(app, fn, raw: bool = False):
    """Run ``fn(client)`` (a coroutine function) with an AsyncOpenAI client over the app in-process
    (``raw``: with the plain httpx client)."""
    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            if raw:
                return await fn(http)
            client = openai.AsyncOpenAI(base_url="http://app/v1", api_key="none", http_client=http, max_retries=0)
            return await fn(client)

    return asyncio.run(main())


def _chat(app, **kw):
    async def fn(client):
        return await client.chat.completions.create(model=MODEL, max_tokens=kw.pop("max_tokens", 8), temperature=0,
                                                    **{"messages": MESSAGES, **kw})
    return _call(app, fn)


def _counts(usage) -> dict:
    """Token counts of a usage object; cached_tokens depends on what the prefix cache held, so an
    identical request answered later may report more of them."""
    return usage.model_dump(exclude={"prompt_tokens_details"})


def test_content_parts_are_the_text_they_hold(app):
    parts = [{"type": "text", "text": "Name three"}, {"type": "text", "text": "colours."}]
    as_parts = _chat(app, messages=[{"role": "user", "content": parts}])
    as_text = _chat(app, messages=[{"role": "user", "content": "Name three\ncolours."}])
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    assert _counts(as_parts.usage) == _counts(as_text.usage)
    with pytest.raises(openai.BadRequestError) as e:
        _chat(app, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])
    assert e.value.body["param"] == "messages" and "image_url" in e.value.body["message"]


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_continuous_usage_stats_put_usage_on_every_chunk(app, chat):
    opts = {"include_usage": True, "continuous_usage_stats": True}

    async def fn(client):
        if chat:
            stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, n=2,
                                                          temperature=0, stream=True, stream_options=opts)
        else:
            stream = await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=10, temperature=0,
                                                     stream=True, stream_options=opts)
        return [c async for c in stream]

    async def whole(client):
        if chat:
            return await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, n=2,
                                                        temperature=0)
        return await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=10, temperature=0)

    chunks, reply = _call(app, fn), _call(app, whole)
    assert all(c.usage is not None for c in chunks)
    usages = [(c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) for c in chunks]
    assert len({u[0] for u in usages}) == 1 and all(u[2] == u[0] + u[1] for u in usages)
    assert [u[1] for u in usages] == sorted(u[1] for u in usages) and usages[-1][1] > usages[0][1]
    final = chunks[-1]
    assert not final.choices and usages[-2] == usages[-1]  # the last content chunk already had it all
    assert _counts(final.usage) == _counts(reply.usage)  # the same counts as the answer without streaming
    if chat:
        assert usages[0][1] == 0  # the role chunks come before any token


def test_without_include_usage_continuous_stats_add_nothing(app):
    async def fn(client):
        stream = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, stream=True,
                                                 stream_options={"continuous_usage_stats": True})
        return [c async for c in stream]

    assert all(c.usage is None for c in _call(app, fn))


def test_ignored_fields_and_neutral_values_change_nothing(app):
    plain = _chat(app)
    extra = {k: v for k, v in IGNORED.items() if k not in ("prompt_cache_options", "safety_identifier")}
    body = {"prompt_cache_options": IGNORED["prompt_cache_options"], "safety_identifier": "s-1"}
    neutral = {k: v for k, v in NEUTRAL.items() if BY_NAME[k].chat}
    reply = _chat(app, **extra, **neutral, extra_body=body,
                  messages=[{**MESSAGES[0], "name": "alice"}])
    assert reply.choices[0].message.content == plain.choices[0].message.content
    assert _counts(reply.usage) == _counts(plain.usage)

    async def fn(client):
        return await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0,
                                               user="u", echo=False, best_of=1, suffix="")
    assert _call(app, fn).usage.completion_tokens >= 1


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_the_client_gets_a_400_naming_each_rejected_field(app, name):
    async def fn(client):
        if BY_NAME[name].chat:
            return await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                                        extra_body={name: REJECTED[name]})
        return await client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                               extra_body={name: REJECTED[name]})

    with pytest.raises(openai.BadRequestError) as e:
        _call(app, fn)
    assert e.value.body["param"] == name and "not supported" in e.value.body["message"]


def test_extensions_and_penalties_through_the_client(app):
    long = _chat(app, max_tokens=12, extra_body={"min_tokens": 12, "ignore_eos": True, "top_k": 1,
                                                 "repetition_penalty": 1.0})
    assert long.usage.completion_tokens == 12 and long.choices[0].finish_reason == "length"

    async def fn(client):
        prompt = "one two one two one two one two"
        base = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        pen = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                              frequency_penalty=2.0, presence_penalty=2.0)
        rep = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                              extra_body={"repetition_penalty": 2.0})
        return base, pen, rep

    base, pen, rep = _call(app, fn)
    assert pen.choices[0].text != base.choices[0].text and rep.choices[0].text != base.choices[0].text
    async def biased(client):
        return await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0,
                                               logit_bias={"28": 100}, extra_body={"return_token_ids": True})
    out = _call(app, biased)
    assert out.choices[0].model_extra["token_ids"] == [28, 28, 28, 28]

    async def stop_ids(client):
        full = await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0,
                                               extra_body={"return_token_ids": True})
        ids = full.choices[0].model_extra["token_ids"]
        cut = await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0,
                                              extra_body={"return_token_ids": True, "stop_token_ids": [ids[2]]})
        return full, ids, cut
    full, ids, cut = _call(app, stop_ids)
    assert cut.choices[0].model_extra["token_ids"] == ids[:ids.index(ids[2]) + 1]
    assert cut.choices[0].finish_reason == "stop" and full.choices[0].text.startswith(cut.choices[0].text)
    assert len(cut.choices[0].text) < len(full.choices[0].text)

    async def stop_strings(client):  # vLLM's include_stop_str_in_output: the text runs through the stop
        full = await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=8, temperature=0)
        stop = full.choices[0].text[4:7]
        kw = dict(model=MODEL, prompt="The sky is", max_tokens=8, temperature=0, stop=[stop])
        return (full.choices[0].text, stop, await client.completions.create(**kw),
                await client.completions.create(**kw, extra_body={"include_stop_str_in_output": True}))
    text, stop, cut, kept = _call(app, stop_strings)
    assert cut.choices[0].text == text[:text.index(stop)] and kept.choices[0].text == cut.choices[0].text + stop
    assert kept.choices[0].finish_reason == "stop"

    async def min_p(client):  # min_p 1 keeps only the most probable token: sampling gives the greedy answer
        greedy = await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0)
        sampled = [await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=1.0,
                                                   seed=s, extra_body={"min_p": 1.0}) for s in (1, 2)]
        return greedy, sampled
    greedy, sampled = _call(app, min_p)
    assert [s.choices[0].text for s in sampled] == [greedy.choices[0].text] * 2
    with pytest.raises(openai.BadRequestError) as e:
        _call(app, lambda c: c.completions.create(model=MODEL, prompt="x", extra_body={"min_p": 1.5}))
    assert e.value.body["param"] == "min_p" and "min_p=1.5" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        _call(app, lambda c: c.completions.create(model=MODEL, prompt="x", logit_bias={"49152": 1}))
    assert e.value.body["param"] == "logit_bias" and "outside the vocabulary" in e.value.body["message"]


def test_a_list_of_prompts_gets_n_choices_each_in_prompt_order(app):
    """OpenAI's batched completions: choice j of prompt i at index i * n + j, each the answer the prompt
    gets alone; usage counts each prompt once; streamed chunks carry those indices."""
    prompts = ["One, two,", [504, 314, 253]]

    async def fn(client):
        alone = [await client.completions.create(model=MODEL, prompt=p, max_tokens=5, temperature=0) for p in prompts]
        both = await client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, n=2)
        stream = await client.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0, n=2,
                                                 stream=True, stream_options={"include_usage": True})
        return alone, both, [c async for c in stream]

    alone, both, chunks = _call(app, fn)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [alone[0].choices[0].text] * 2 + [alone[1].choices[0].text] * 2
    assert both.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert both.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)
    texts = ["", "", "", ""]
    for c in chunks[:-1]:
        texts[c.choices[0].index] += c.choices[0].text
    assert texts == [c.text for c in both.choices]
    assert _counts(chunks[-1].usage) == _counts(both.usage) and not chunks[-1].choices

    def bad(prompt, n=1):
        with pytest.raises(openai.BadRequestError) as e:
            _call(app, lambda c: c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, n=n))
        return e.value.body
    body = bad(["fine", [5, "x"]])
    assert body["param"] == "prompt" and body["message"].startswith('prompt[1]: "x" is not a token id')
    body = bad(["a", "b", "c"], n=2)  # 6 sequences; the app's replica runs 4
    assert body["param"] == "prompt" and "3 prompts x n=2 = 6 sequences" in body["message"]
    body = bad(["a", [5] * (CONTEXT + 1)])
    assert body["param"] == "prompt" and body["message"].startswith("prompt[1]: ")


def test_echo_returns_the_prompt_and_its_logprobs(app):
    """Completions' echo as evaluation harnesses use it (prompts as token ids, logprobs, max_tokens 0
    or a few): the prompt's text and every prompt token's logprob (the first null) before the choice's
    own, the same output tokens as without echo, streamed or not."""
    ids = [504, 314, 253, 1382, 30]

    async def fn(client):
        plain = await client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0, logprobs=2)
        echo = await client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0, logprobs=2,
                                               echo=True)
        text_only = await client.completions.create(model=MODEL, prompt="The sky is", max_tokens=3, temperature=0,
                                                    echo=True)
        scores = await client.completions.create(model=MODEL, prompt=[ids, ids[:3]], max_tokens=0, logprobs=1,
                                                 echo=True, temperature=0)
        stream = await client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0, logprobs=2,
                                                 echo=True, stream=True)
        return plain, echo, text_only, scores, [c async for c in stream]

    plain, echo, text_only, scores, chunks = _call(app, fn)
    choice, lp = echo.choices[0], echo.choices[0].logprobs
    assert choice.text.endswith(plain.choices[0].text) and len(choice.text) > len(plain.choices[0].text)
    assert len(lp.tokens) == len(ids) + 3 and lp.tokens[len(ids):] == plain.choices[0].logprobs.tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(v, float) and v <= 0 for v in lp.token_logprobs[1:])
    assert lp.token_logprobs[len(ids):] == plain.choices[0].logprobs.token_logprobs
    assert all(lp.token_logprobs[i] in lp.top_logprobs[i].values() for i in range(1, len(lp.tokens)))
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert text_only.choices[0].text.startswith("The sky is") and text_only.choices[0].logprobs is None
    assert [c.text for c in scores.choices] == [choice.text[:len(c.text)] for c in scores.choices]
    assert [len(c.logprobs.tokens) for c in scores.choices] == [len(ids), 3]
    assert scores.choices[0].logprobs.token_logprobs == lp.token_logprobs[:len(ids)]
    assert scores.usage.completion_tokens == 0 and scores.usage.prompt_tokens == len(ids) + 3
    assert {c.finish_reason for c in scores.choices} == {"length"}
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert sum((c.choices[0].logprobs.tokens for c in chunks if c.choices[0].logprobs), []) == lp.tokens

    def bad(**kw):
        with pytest.raises(openai.BadRequestError) as e:
            _call(app, lambda c: c.completions.create(model=MODEL, prompt="x", **kw))
        return e.value.body
    assert bad(max_tokens=0, echo=True, stream=True)["param"] == "max_tokens"
    assert bad(max_tokens=0)["message"].startswith("max_tokens=0")


def test_prompt_and_max_tokens_over_the_context_is_a_400_naming_the_numbers(app):
    prompt = list(range(1000, 1200))  # 200 tokens of a 256-token context

    async def over(client):
        return await client.completions.create(model=MODEL, prompt=prompt, max_tokens=100)
    with pytest.raises(openai.BadRequestError) as e:
        _call(app, over)
    msg = e.value.body["message"]
    assert "200 tokens" in msg and "max_tokens=100" in msg and "context of 256" in msg and "max_tokens=56" in msg
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "prompt"

    async def until_the_end(client):
        return await client.completions.create(model=MODEL, prompt=prompt, extra_body={"ignore_eos": True})
    out = _call(app, until_the_end)  # max_tokens left out: until the context ends
    assert out.usage.completion_tokens == CONTEXT - 200 and out.choices[0].finish_reason == "length"


def test_raw_json_edge_cases(app):
    async def fn(http):
        nan = await http.post("/v1/completions", content=b'{"prompt": "x", "temperature": NaN}',
                              headers={"content-type": "application/json"})
        bools = await http.post("/v1/completions", json={"prompt": [True, False]})
        return nan, bools

    nan, bools = _call(app, fn, raw=True)
    assert nan.status_code == 400 and nan.json()["error"]["param"] == "temperature"
    assert bools.status_code == 400 and bools.json()["error"]["param"] == "prompt"


# ---- the OpenAPI document declares what the routes answer; 405 says what is allowed -------------
def _validator(doc: dict, name: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator({"$ref": f"#/components/schemas/{name}", "components": doc["components"]})


def test_openapi_declares_the_real_answers_and_they_validate(app):
    async def fn(http):
        doc = (await http.get("/openapi.json")).json()
        chat = await http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, "logprobs": True,
                                                             "top_logprobs": 2, "return_token_ids": True})
        comp = await http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "logprobs": 1})
        stream = await http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 3, "stream": True,
                                                               "stream_options": {"include_usage": True}})
        bad = await http.post("/v1/completions", json={"prompt": "x", "tools": []})
        models, health = await http.get("/v1/models"), await http.get("/health")
        card, unknown = await http.get(f"/v1/models/{MODEL}"), await http.get("/v1/models/nope")
        return doc, chat, comp, stream, bad, models, health, card, unknown

    doc, chat, comp, stream, bad, models, health, card, unknown = _call(app, fn, raw=True)
    for path, method, body in [("/v1/completions", "post", "Completion"),
                               ("/v1/chat/completions", "post", "ChatCompletion")]:
        responses = doc["paths"][path][method]["responses"]
        assert set(responses) == {"200", "400", "401", "404", "413", "422", "429", "500", "503"}
        assert responses["200"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{body}")
        assert "text/event-stream" in responses["200"]["content"]
        assert responses["429"]["headers"]["Retry-After"] and responses["503"]["headers"]["Retry-After"]
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "HTTPValidationError" not in json.dumps(doc)
    _validator(doc, "ChatCompletion").validate(chat.json())
    _validator(doc, "Completion").validate(comp.json())
    events = [e.removeprefix("data: ") for e in stream.text.split("\n\n") if e]
    assert stream.headers["content-type"].startswith("text/event-stream") and events[-1] == "[DONE]"
    for event in events[:-1]:
        _validator(doc, "ChatCompletionChunk").validate(json.loads(event))
    assert bad.status_code == 422  # `tools` is a chat field: on completions it is an unknown one
    _validator(doc, "ErrorResponse").validate(bad.json())
    _validator(doc, "ModelList").validate(models.json())
    _validator(doc, "Health").validate(health.json())
    _validator(doc, "Model").validate(card.json())
    assert card.json() == models.json()["data"][0]
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    _validator(doc, "ErrorResponse").validate(unknown.json())
    assert set(doc["paths"]["/v1/models/{model}"]["get"]["responses"]) == {"200", "401", "404"}
    with pytest.raises(Exception):  # the schemas are strict: an undeclared key fails
        _validator(doc, "Completion").validate({**comp.json(), "surprise": 1})


def test_the_client_retrieves_the_model_and_a_404_names_an_unknown_one(app):
    async def fn(client):
        card = await client.models.retrieve(MODEL)
        try:
            await client.models.retrieve("org/other-model")
        except openai.NotFoundError as e:
            return card, e.body
    card, body = _call(app, fn)
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "specray")
    assert body["param"] == "model" and "'org/other-model' does not exist" in body["message"]


def test_405_names_the_allowed_methods(app):
    async def fn(http):
        return await http.get("/v1/chat/completions"), await http.delete("/v1/models")

    for r, allowed in zip(_call(app, fn, raw=True), ("POST", "GET")):
        assert r.status_code == 405 and r.headers["allow"] == allowed
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
