"""Structured output: every row masked to what the request's grammar allows after its own path, so the
answer matches the grammar and speculation stays lossless (greedy, seeded, trees); bad grammars and
conflicting fields are refused naming them."""
from __future__ import annotations

import json
import random

import pytest
import torch
from pydantic import ValidationError

from actors.sampling_params import SamplingParams
from actors.sequence import Sequence
from actors.structured_output import GrammarCompiler, StructuredOutput, forbidden_tokens
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.request import RequestError

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
ASK_PERSON = [{"role": "user", "content": "Describe a fictional person as JSON with a name, an age and a city."}]
ASK_POEM = [{"role": "user", "content": "Write a short poem about the sea."}]


# ---- pure parts ------------------------------------------------------------------------------
def test_forbidden_tokens_reads_bit_j_of_word_w_as_token_32w_plus_j():
    gen = torch.Generator().manual_seed(0)
    vocab = 70  # three words, the last one partly past the vocabulary
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 3), dtype=torch.int32, generator=gen)
    got = forbidden_tokens(bitmask, vocab)
    assert got.shape == (3, vocab) and got.dtype is torch.bool
    for r in range(3):
        for t in range(vocab):
            assert bool(got[r, t]) != bool((int(bitmask[r, t // 32]) >> (t % 32)) & 1)


@pytest.mark.parametrize("kind, value, says", [
    ("json_schema", [1, 2], "must be an object"),
    ("json_schema", "{not json", "not valid JSON"),
    ("choice", [], "non-empty list"),
    ("choice", ["a", 3], "non-empty string"),
    ("regex", "", "non-empty string"),
    ("json_object", "x", "takes no value"),
    ("xml", "", "kind"),
])
def test_bad_constraints_are_refused_naming_the_problem(kind, value, says):
    with pytest.raises(ValidationError, match=says):
        StructuredOutput(kind=kind, value=value)


def test_a_schema_keeps_its_key_order():
    so = StructuredOutput(kind="json_schema", value={"properties": {"b": {}, "a": {}}, "type": "object"})
    assert list(json.loads(so.value)["properties"]) == ["b", "a"]


@pytest.mark.parametrize("field", [{"ignore_eos": True}, {"min_tokens": 3}])
def test_fields_that_hold_eos_back_are_refused_with_a_grammar(field):
    with pytest.raises(ValidationError, match=next(iter(field))):
        SamplingParams(structured=StructuredOutput(kind="json_object"), **field)


class _Refusing:
    """A grammar state that refuses everything (what a bug would look like)."""

    def advance(self, tokens):
        return f"refused {list(tokens)}"


def test_a_token_the_grammar_refuses_ends_the_request_with_an_error():
    seq = Sequence("r", [1, 2], SamplingParams(max_tokens=8))
    seq.grammar = _Refusing()
    seq.append_tokens([5, 6], eos_ids={0}, max_model_len=100)
    assert seq.is_finished and seq.finish_reason == "error" and seq.error == "refused [5, 6]"


# ---- against the default model's tokenizer ----------------------------------------------------
@pytest.fixture(scope="module")
def compiler(default_model):
    return GrammarCompiler(default_model.tokenizer, default_model.config.vocab_size, {2})


def _fresh_mask(compiler, so, path):
    """The oracle: a new state that consumed ``path`` alone, its row."""
    state = compiler.state(so)
    assert state.advance(path) is None
    return state.forbidden([-1], [0])[0]


@pytest.mark.model
@pytest.mark.parametrize("so", [StructuredOutput(kind="json_schema", value=PERSON),
                                StructuredOutput(kind="regex", value=r"(ab|cd)[0-9]{2,4}")])
def test_tree_masks_equal_each_path_consumed_alone(compiler, so):
    """Random trees whose tokens are mostly allowed (some forbidden): every live node's row equals a
    fresh state's after that node's path; the state is where it was after the walk."""
    rng = random.Random(0)
    state = compiler.state(so)
    tok = compiler.tokenizer
    prefix = tok.encode('{"name": "Al' if so.kind == "json_schema" else "ab1", add_special_tokens=False)
    assert state.advance(prefix) is None
    before = state.forbidden([-1], [0])
    for _ in range(6):
        parents, tokens, forbidden = [-1], [0], [before[0]]
        for i in range(1, 9):
            p = rng.randrange(i)
            ok = (~forbidden[p]).nonzero().flatten().tolist()
            t = rng.choice(ok) if ok and rng.random() < 0.85 else rng.randrange(compiler.vocab_size)
            parents.append(p)
            tokens.append(t)
            path, node = [], i
            while node > 0:
                path.append(tokens[node])
                node = parents[node]
            path = path[::-1]
            reachable = all(not _fresh_mask(compiler, so, prefix + path[:k])[path[k]] for k in range(len(path)))
            forbidden.append(_fresh_mask(compiler, so, prefix + path) if reachable and 2 not in path else None)
            if forbidden[-1] is None or forbidden[-1].all():
                forbidden[-1] = torch.zeros(compiler.vocab_size, dtype=torch.bool)
        got = state.forbidden(parents, tokens)
        for i in range(len(parents)):
            assert torch.equal(got[i], forbidden[i]), f"node {i}"
        assert torch.equal(state.forbidden([-1], [0]), before)  # rolled back


@pytest.mark.model
def test_warm_up_builds_the_tokenizer_and_a_grammar(default_model):
    fresh = GrammarCompiler(default_model.tokenizer, default_model.config.vocab_size, {2})
    assert fresh._ll_tokenizer is None
    fresh.warm_up()
    assert fresh._ll_tokenizer is not None and fresh._compiled.cache_info().currsize >= 1


@pytest.mark.model
def test_bad_grammars_are_refused_with_the_compilers_message(compiler):
    with pytest.raises(ValueError, match="Invalid type: wat"):
        compiler.state(StructuredOutput(kind="json_schema", value={"type": "wat"}))
    with pytest.raises(ValueError, match="unclosed group"):
        compiler.state(StructuredOutput(kind="regex", value="a(b"))
    with pytest.raises(ValueError, match="unknown name"):
        compiler.state(StructuredOutput(kind="grammar", value="start: foo"))


# ---- the engine --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engines(default_model):
    from cluster.engine import LLMEngine

    out = {name: LLMEngine(EngineConfig(num_kv_blocks=128, num_threads=1, speculative=spec), loaded=default_model)
           for name, spec in (("plain", SpeculativeConfig.from_draft_arg("none", 0)),
                              # every step drafts (no adaptive depth): masks on every node of K=5 chains
                              ("chain", SpeculativeConfig.from_draft_arg("default", 5, adaptive=False, tree_width=1)),
                              # ... and of dynamic trees three candidates wide
                              ("tree", SpeculativeConfig.from_draft_arg("default", 5, adaptive=False, tree_width=3)))}
    yield out
    for e in out.values():
        e.shutdown()


def _answers(engine, messages, so, temperature=0.0, seed=None, max_tokens=60, spec_tokens=None):
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, structured=so,
                            spec_tokens=spec_tokens)
    return engine.generate(messages, params, chat=True)


@pytest.mark.model
def test_a_json_schema_answer_parses_and_matches_the_schema(engines):
    so = StructuredOutput(kind="json_schema", value=PERSON)
    for out in _answers(engines["plain"], [ASK_PERSON, ASK_POEM], so):
        assert out.finish_reason == "stop", out.text
        doc = json.loads(out.text)
        assert list(doc) == ["name", "age", "city"]
        assert isinstance(doc["name"], str) and isinstance(doc["age"], int) and isinstance(doc["city"], str)


@pytest.mark.model
@pytest.mark.parametrize("temperature, seed", [(0.0, None), (1.0, 11)])
def test_speculation_is_lossless_under_a_grammar(engines, temperature, seed):
    """Chains and trees drafted on every step (and the grammar's forced tokens, which the plain engine
    drafts too) give plain decoding's constrained answer, token for token."""
    cases = [([ASK_PERSON, ASK_POEM], StructuredOutput(kind="json_schema", value=PERSON)),
             ([ASK_POEM], StructuredOutput(kind="json_object")),
             ([ASK_POEM], StructuredOutput(kind="regex", value=r"[A-Z][a-z]+( [a-z]+){2,5}\.")),
             ([ASK_PERSON], StructuredOutput(kind="choice", value=["yes", "no", "maybe not"]))]
    for messages, so in cases:
        plain = [o.token_ids for o in _answers(engines["plain"], messages, so, temperature, seed, spec_tokens=0)]
        for name in ("plain", "chain", "tree"):
            outs = _answers(engines[name], messages, so, temperature, seed)
            assert [o.token_ids for o in outs] == plain, (name, so.kind)
    for name in ("chain", "tree"):  # drafts were verified inside the grammar, and many kept
        out = _answers(engines[name], [ASK_PERSON], cases[0][1])[0]
        assert out.num_accepted_tokens > 0.3 * len(out.token_ids), (name, out.num_draft_tokens)


@pytest.mark.model
def test_choice_and_regex_answers_match(engines):
    outs = _answers(engines["plain"], [ASK_POEM, ASK_PERSON], StructuredOutput(kind="choice", value=["yes", "no"]),
                    temperature=1.0, seed=3)
    assert {o.text for o in outs} <= {"yes", "no"} and all(o.finish_reason == "stop" for o in outs)
    out = _answers(engines["plain"], [ASK_POEM], StructuredOutput(kind="regex", value=r"[0-9]{3}-[0-9]{4}"))[0]
    assert out.finish_reason == "stop" and len(out.text) == 8 and out.text[3] == "-"


@pytest.mark.model
def test_the_engine_refuses_a_bad_grammar_naming_response_format(engines):
    engine = engines["plain"]
    with pytest.raises(RequestError, match=r"response_format \(json_schema\): Invalid type: wat") as err:
        engine.add_request("bad", ASK_POEM, SamplingParams(
            structured=StructuredOutput(kind="json_schema", value={"type": "wat"})), chat=True)
    assert err.value.field == "response_format" and "bad" not in engine.seqs


# ---- over HTTP, with the official client ------------------------------------------------------
from tests.test_openai_conformance import _call, _chat, app  # noqa: E402,F401  (app: the in-process server)


@pytest.mark.model
def test_the_official_client_parses_a_pydantic_model(app):  # noqa: F811
    """``client.chat.completions.parse(response_format=Model)`` sends a strict json_schema and parses
    the answer into the model; streamed, the chunks join into the same JSON."""
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    async def parse(client):
        return await client.chat.completions.parse(model="smollm2-135m", messages=ASK_PERSON, max_tokens=40,
                                                   temperature=0, response_format=Person)
    reply = _call(app, parse)
    person = reply.choices[0].message.parsed
    assert isinstance(person, Person) and reply.choices[0].finish_reason == "stop"
    assert json.loads(reply.choices[0].message.content) == person.model_dump()

    async def stream(client):
        chunks = await client.chat.completions.create(
            model="smollm2-135m", messages=ASK_PERSON, max_tokens=40, temperature=0, stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "Person", "schema": {
                **Person.model_json_schema(), "additionalProperties": False}}})  # as parse() sends it
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    assert json.loads(_call(app, stream)) == person.model_dump()


@pytest.mark.model
def test_json_object_and_the_extensions_over_http(app):  # noqa: F811
    doc = json.loads(_chat(app, max_tokens=60, response_format={"type": "json_object"}).choices[0].message.content)
    assert isinstance(doc, dict)
    assert _chat(app, response_format={"type": "choice", "choice": ["red", "blue"]}).choices[0].message.content in (
        "red", "blue")
    text = _chat(app, max_tokens=12, response_format={"type": "regex", "regex": "[a-z]+, [a-z]+"})
    text = text.choices[0].message.content
    assert text.count(", ") == 1 and text.replace(", ", "").isalpha()
    lark = _chat(app, response_format={"type": "grammar", "grammar": 'start: "up" | "down"'})
    assert lark.choices[0].message.content in ("up", "down")

    async def completion(client):  # an extension on completions
        return await client.completions.create(model="smollm2-135m", prompt="Is the sea blue?", max_tokens=4,
                                               temperature=0, extra_body={"response_format": {
                                                   "type": "choice", "choice": ["yes", "no"]}})
    assert _call(app, completion).choices[0].text in ("yes", "no")


@pytest.mark.model
@pytest.mark.parametrize("response_format, says", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}, "Invalid type: wat"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "Input should be a valid dictionary"),
    ({"type": "regex"}, "type 'regex' needs its 'regex' field"),
    ({"type": "json_object", "regex": "a"}, "type 'json_object' takes no 'regex' field"),
    ({"type": "choice", "choice": []}, "non-empty list of strings"),
    ({"type": "regex", "regex": "a(b"}, "unclosed group"),
])
def test_bad_response_formats_are_400s_naming_it(app, response_format, says):  # noqa: F811
    import openai

    with pytest.raises((openai.BadRequestError, openai.UnprocessableEntityError)) as e:
        _chat(app, response_format=response_format)
    assert says in e.value.body["message"]
    assert e.value.status_code == 422 or e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError, match="ignore_eos"):
        _chat(app, response_format={"type": "json_object"}, extra_body={"ignore_eos": True})


@pytest.mark.model
def test_forced_tokens_are_drafted_even_without_a_proposer(engines, default_model):
    """A schema's keys are forced: a plain engine drafts them (jump-forward) and the answer is the one
    plain decoding gives token by token (spec_tokens 0 turns that off); with a proposer they are drafted
    instead of the proposer's draft and kept out of what the adaptive policy learns."""
    so = StructuredOutput(kind="json_schema", value=PERSON)
    plain = engines["plain"]
    off = plain.generate([ASK_PERSON], SamplingParams(max_tokens=60, structured=so, spec_tokens=0), chat=True)[0]
    assert off.num_draft_tokens == 0
    jump = _answers(plain, [ASK_PERSON], so)[0]
    assert jump.token_ids == off.token_ids
    assert jump.num_draft_tokens >= 6 and jump.num_accepted_tokens >= 0.8 * jump.num_draft_tokens
    assert len(jump.token_ids) - jump.num_accepted_tokens < len(off.token_ids)  # fewer steps

    from cluster.engine import LLMEngine
    engine = LLMEngine(EngineConfig(num_kv_blocks=128, num_threads=1, speculative=SpeculativeConfig.from_draft_arg(
        "ngram", 5)), loaded=default_model)
    recorded = []
    engine.spec_policy.record = lambda *a, **k: recorded.append(a)  # noqa: E731  (what the policy learns)
    out = _answers(engine, [ASK_PERSON], so)[0]
    assert out.token_ids == off.token_ids and out.num_accepted_tokens > jump.num_accepted_tokens * 0.8
    assert all(depth <= 5 for _, depth, _, *rest in recorded)
    assert len(recorded) < out.num_drafts
    engine.shutdown()


@pytest.mark.model
def test_the_metrics_count_structured_requests_and_forced_tokens(engines):
    from deployments.openai_tools import ToolUse
    from tests.test_metrics import sample_value

    engine = engines["plain"]
    before = engine.metrics.snapshot()
    out = _answers(engine, [ASK_PERSON], StructuredOutput(kind="json_schema", value=PERSON))[0]
    choice = _answers(engine, [ASK_POEM], StructuredOutput(kind="choice", value=["a", "b"]))[0]
    calls = ToolUse.model_validate({"tools": [{"type": "function", "function": {"name": "f"}}],
                                    "choice": "required"}).constraint()
    called = _answers(engine, [ASK_POEM], calls)[0]
    after = engine.metrics.snapshot()

    def delta(name, **labels):
        return sample_value(after, name, **labels) - sample_value(before, name, **labels)
    assert delta("specray:structured_output_requests_total", kind="json_schema") == 1
    assert delta("specray:structured_output_requests_total", kind="choice") == 1
    assert delta("specray:structured_output_requests_total", kind="regex") == 0
    assert delta("specray:structured_output_requests_total", kind="tool_calls") == 1  # not counted as grammar
    assert delta("specray:structured_output_requests_total", kind="grammar") == 0
    assert out.structured == "json_schema" and out.num_forced_tokens >= 6
    assert delta("specray:grammar_forced_tokens_total") == (out.num_forced_tokens + choice.num_forced_tokens
                                                         + called.num_forced_tokens)
    assert out.num_forced_tokens <= out.num_accepted_tokens
