"""Request logic of the OpenAI ingress: ``OpenAIServer.start`` is protocol-neutral (the HTTP routes
and the gRPC methods both call it); ``handle`` answers HTTP from it.

One request: refuse it when the replica cannot serve (engine loop dead, draining: 503 with a
Retry-After), check the model and values, admit it (``Admission``: 429 with a Retry-After when the
replica is full), start one engine request per choice (``n`` for each prompt; a completion request
may give a list of prompts, choice j of prompt i at index i * n + j): a ``Generation``. HTTP then
answers a dict or an ``EventStream`` of SSE lines, gRPC protobufs (``deployments.grpc_ingress``).
Streaming chunks carry their choice index; usage counts each prompt once and sums the completion tokens.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass

from cluster.async_engine import AsyncLLMEngine
from cluster.outputs import RequestOutput
from cluster.prompts import PromptEncoder
from deployments.admission import Admission, Ticket
from deployments.openai_api import APIError, SamplingRequest, error_body
from deployments.openai_logprobs import LogprobFormatter
from deployments.openai_responses import (choice_body, completion_response, finish_reason_of, model_card,
                                          models_response, new_id, prompt_heads, running_usage, stream_chunk,
                                          usage_chunk)
from deployments.openai_tools import CallStream, answer_calls, calls_finish_reason

SSE_DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class OpenAIServer:
    def __init__(self, aeng: AsyncLLMEngine, model_name: str, max_model_len: int, admission: Admission,
                 api_key: str | None = None, draining: Callable[[], bool] = lambda: False):
        """api_key: what gRPC metadata must carry (HTTP checks it in ``deployments.http_guard``);
        draining: whether the host (Serve) has begun shutting this replica down."""
        self.aeng, self.model_name, self.max_model_len = aeng, model_name, max_model_len
        self.admission, self.api_key, self._host_draining = admission, api_key, draining
        self.logprobs = LogprobFormatter(aeng.tokenizer)
        self.encoder = PromptEncoder(aeng.tokenizer)  # chat messages under non-default template options
        self.created = int(time.time())
        self._draining = False

    def models(self) -> dict:
        return models_response(self.model_name, self.created)

    def model(self, name: str) -> dict:
        """One model's card (the SDK's ``models.retrieve``); APIError 404 naming an unknown one."""
        self._check_model(name)
        return model_card(self.model_name, self.created)

    def _check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"model {name!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def begin_drain(self) -> None:
        """From now on new requests get 503; requests in flight run to their end."""
        self._draining = True

    @property
    def engine_alive(self) -> bool:
        return self.aeng.is_running

    def stats(self) -> dict:
        """The engine's unfinished requests and KV blocks, and admission (sequences running,
        requests waiting)."""
        return {**self.aeng.stats(), "admission_running": self.admission.running,
                "admission_waiting": self.admission.num_waiting}

    def unavailable_reason(self) -> str | None:
        """Why this replica takes no new requests (engine loop dead, draining), None when it does."""
        if not self.engine_alive:
            return "engine is not running"
        if self._draining or self._host_draining():
            return "replica is draining (shutting down or being redeployed)"
        return None

    def check_available(self) -> None:
        reason = self.unavailable_reason()
        if reason is not None:
            retry = self.admission.retry_after_s
            raise APIError(503, f"{reason}; retry after {retry}s", code="service_unavailable", retry_after_s=retry)

    async def start(self, req: SamplingRequest, chat: bool) -> Generation:
        """Check the request, admit it and start one engine stream per choice: what both protocols
        share. The caller answers from the Generation's outputs and must ``aclose()`` it."""
        self.check_available()
        if req.model is not None:
            self._check_model(req.model)
        prompts, params = req.to_engine(self.max_model_len)
        field = "messages" if chat else "prompt"
        if chat and req.template_options is not None:  # rendered here: the engine renders the default way
            prompts = [self._render(p, req.template_options) for p in prompts]
        pairs = [(prompt, p) for prompt in prompts for p in params]
        if len(prompts) > 1 and len(pairs) > self.admission.max_running:
            raise APIError(400, f"prompt: {len(prompts)} prompts x n={len(params)} = {len(pairs)} sequences; this "
                                f"server runs at most {self.admission.max_running} at once (max_ongoing_requests); "
                                f"send fewer prompts per request", param="prompt")
        labels = [f"{field}[{i}]" if len(prompts) > 1 else field for i in range(len(prompts)) for _ in params]
        ticket = await self.admission.admit(len(pairs))
        rid = new_id("chatcmpl" if chat else "cmpl")
        try:  # a max_tokens the request names must fit the context with the prompt (a 400, not cut short)
            choices = await ChoiceStreams.start(self.aeng, pairs, rid, field, labels,
                                                fit_max_tokens=req.requested_max_tokens is not None)
        except BaseException:
            ticket.release()
            raise
        if chat:
            echo = None if req.echoed is None else [req.echoed] * len(pairs)
        else:
            echo = [self._prompt_text(p) for p in prompts for _ in params] if req.echo else None
        return Generation(rid, choices, ticket, len(params), echo)

    def _render(self, messages: list[dict], options: dict) -> list[int]:
        """Chat messages as token ids under the chat template ``options`` (a 400 naming messages if
        the template cannot render them)."""
        try:
            return self.encoder.apply_chat_template(messages, **options)
        except (ValueError, TypeError) as e:
            raise APIError(400, f"messages: the chat template cannot render them with {options}: {e}",
                           param="messages") from None

    def _prompt_text(self, prompt) -> str:
        """A completion prompt as echoed: its text, or its token ids decoded."""
        return prompt if isinstance(prompt, str) else self.aeng.tokenizer.decode(prompt)

    async def handle(self, req: SamplingRequest, chat: bool):
        """The HTTP answer: a dict (non-streaming) or an ``EventStream`` of SSE lines (``req.stream``)."""
        gen = await self.start(req, chat)
        if req.stream:
            return EventStream(self._events(gen, req, chat), gen)
        outs, logprobs = await gen.finish()
        if req.prompt_only:  # the token generated to end the request is not part of the answer
            outs = [dataclasses.replace(o, text="", token_ids=[], num_output_tokens=0) for o in outs]
            logprobs = [None if lps is None else [] for lps in logprobs]
        bodies, names = [], req.tool_use().names
        for i, (out, lps) in enumerate(zip(outs, logprobs)):
            if gen.echo is None:
                calls = answer_calls(out.text, names, out.finish_reason)
                bodies.append(choice_body(i, out, chat, self._logprobs_body(lps, chat), req.return_token_ids, calls))
                continue
            if chat:  # a continued assistant message: its start before the answer
                body = choice_body(i, out, chat, self._logprobs_body(lps, chat), req.return_token_ids)
                body["message"]["content"] = gen.echo[i] + body["message"]["content"]
            else:
                body = choice_body(i, out, chat, self._echo_logprobs(gen.choices.firsts[i], lps), req.return_token_ids)
                body["text"] = gen.echo[i] + body["text"]
            bodies.append(body)
        return completion_response(gen.rid, self.model_name, bodies, outs, chat, gen.per_prompt)

    def _logprobs_body(self, entries: list | None, chat: bool) -> dict | None:
        if entries is None:
            return None
        return self.logprobs.chat(entries) if chat else self.logprobs.completion(entries)[0]

    def _echo_logprobs(self, first: RequestOutput, entries: list | None) -> dict | None:
        """Completions logprobs of an echoed choice: the prompt's tokens (from its first output), then
        ``entries`` (its output tokens'); None when the request asked for none."""
        if entries is None:
            return None
        return self.logprobs.echoed(first.prompt_token_ids, first.prompt_logprobs, entries)[0]

    async def _events(self, gen: Generation, req: SamplingRequest, chat: bool) -> AsyncIterator[str]:
        chunk = dict(rid=gen.rid, model=self.model_name, chat=chat, created=int(time.time()))
        choices = gen.choices
        finals = list(choices.firsts)
        offsets = [0] * len(finals)  # completions logprobs: text_offset continues across chunks
        echo = list(gen.echo) if gen.echo is not None else None  # prompt text still to send, per choice
        streamed = [0] * len(finals)  # tokens per choice so far (continuous usage)

        prompt_tokens = sum(o.num_prompt_tokens for o in prompt_heads(finals, gen.per_prompt))
        names = req.tool_use().names
        calling = [CallStream(names) for _ in finals] if names else None  # answers that may be tool calls

        def usage() -> dict | None:
            return running_usage(prompt_tokens, streamed) if req.continuous_usage else None

        if chat:
            for i in range(len(finals)):
                yield sse(stream_chunk(index=i, role=True, usage=usage(), **chunk))
        try:
            async with aclosing(choices.merged()) as merged:  # closed (tasks stopped) even on break
                async for i, out in merged:
                    finals[i] = out
                    if out.finish_reason == "error":
                        yield sse(error_body(f"generation failed: {out.error}", "internal_server_error",
                                             code="engine_error"))
                        break
                    ids = out.delta_token_ids if req.return_token_ids else None
                    lp, text, calls = None, out.delta_text, None
                    if calling is not None:
                        text, calls = calling[i].step(text, out.finished, out.finish_reason)
                    echoing = echo is not None and echo[i] is not None  # a choice's first chunk: the echo first
                    if echoing:
                        text, echo[i] = echo[i] + text, None
                    if out.delta_logprobs and chat:
                        lp = self.logprobs.chat(out.delta_logprobs)
                    elif echoing and not chat:  # completions: the prompt tokens' logprobs first
                        if out.delta_logprobs is not None:
                            lp, offsets[i] = self.logprobs.echoed(out.prompt_token_ids, out.prompt_logprobs,
                                                                  out.delta_logprobs)
                    elif out.delta_logprobs:
                        lp, offsets[i] = self.logprobs.completion(out.delta_logprobs, offsets[i])
                    if text or out.finished or ids or lp:
                        streamed[i] = out.num_output_tokens
                        reason = calls_finish_reason(calls, finish_reason_of(out))
                        yield sse(stream_chunk(index=i, text=text, finish_reason=reason, token_ids=ids, logprobs=lp,
                                               usage=usage(), tool_calls=calls, **chunk))
        except RuntimeError as e:  # the engine loop failed or stopped under this request
            yield sse(error_body(f"generation failed: {e}", "service_unavailable_error", code="engine_unavailable"))
        if req.include_usage:
            yield sse(usage_chunk(outs=finals, per_prompt=gen.per_prompt, **chunk))
        yield SSE_DONE


class ChoiceStreams:
    """The engine streams of one request's choices: started together, merged as outputs arrive,
    closed together (closing a stream that has not finished aborts its request, freeing its KV)."""

    def __init__(self, gens: list):
        self.gens = gens
        self.firsts: list[RequestOutput] = []

    @classmethod
    async def start(cls, aeng: AsyncLLMEngine, pairs: list[tuple], rid: str, prompt_field: str,
                    labels: list[str] | None = None, fit_max_tokens: bool = False) -> ChoiceStreams:
        """One engine stream per (prompt, SamplingParams) choice. Bad input surfaces here (400 naming
        ``prompt_field``, the message the choice's label, e.g. ``prompt[2]``), before any byte of the answer."""
        ids = [rid] if len(pairs) == 1 else [f"{rid}-{i}" for i in range(len(pairs))]
        self = cls([aeng.generate(prompt, p, request_id=i, fit_max_tokens=fit_max_tokens)
                    for (prompt, p), i in zip(pairs, ids)])
        firsts = await asyncio.gather(*(g.__anext__() for g in self.gens), return_exceptions=True)
        bad = next((i for i, f in enumerate(firsts) if isinstance(f, BaseException)), None)
        if bad is not None:
            await self.aclose()
            raise _first_error(firsts[bad], prompt_field, labels[bad] if labels else prompt_field)
        self.firsts = firsts
        return self

    async def merged(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) in arrival order, the first outputs first."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, gen) -> None:
            try:
                async for out in gen:  # (a finished choice's stream just ends)
                    queue.put_nowait((i, out))
                queue.put_nowait((i, None))
            except Exception as e:  # handed to the consumer
                queue.put_nowait((i, e))

        for i, first in enumerate(self.firsts):
            yield i, first
        tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(self.gens)]
        try:
            for _ in range(len(tasks)):
                while True:
                    i, item = await queue.get()
                    if item is None:
                        break
                    if isinstance(item, Exception):
                        raise item
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def collect(self) -> tuple[list[RequestOutput], list[list | None]]:
        """Final output and all logprobs (None when not asked) of every choice."""
        finals = list(self.firsts)
        logprobs: list[list | None] = [None if f.delta_logprobs is None else [] for f in self.firsts]
        try:
            async with aclosing(self.merged()) as merged:  # a cancelled handler (client gone) aborts every choice
                async for i, out in merged:
                    finals[i] = out
                    if out.delta_logprobs:
                        logprobs[i].extend(out.delta_logprobs)
        except RuntimeError as e:
            raise APIError(503, f"engine unavailable: {e}", code="engine_unavailable", retry_after_s=ENGINE_RETRY_AFTER_S) from None
        return finals, logprobs

    async def aclose(self) -> None:
        for g in self.gens:
            await g.aclose()


# An engine that failed its requests is replaced by Serve (its health check fails after repeated
# failed steps, cluster/async_engine.py): clients may come back after a few seconds.
ENGINE_RETRY_AFTER_S = 5


def _first_error(e: BaseException, prompt_field: str, label: str) -> BaseException:
    field = getattr(e, "field", None)  # a RequestError naming another field than the prompt (logit_bias)
    if isinstance(e, ValueError) and field:
        return APIError(400, str(e), param=field)
    if isinstance(e, ValueError):
        msg = str(e)
        code = "context_length_exceeded" if "context" in msg else None
        return APIError(400, f"{label}: {msg}", param=prompt_field, code=code)
    if isinstance(e, RuntimeError):
        return APIError(503, f"engine unavailable: {e}", code="engine_unavailable", retry_after_s=ENGINE_RETRY_AFTER_S)
    return e


@dataclass(slots=True)
class Generation:
    """An admitted request: its id, one engine stream per choice, its admission ticket. ``aclose()``
    aborts what is still running and gives the admission room back; call it on every exit path."""

    rid: str
    choices: ChoiceStreams
    ticket: Ticket
    per_prompt: int | None = None  # choices per prompt (n); None: one prompt, every choice its own
    echo: list[str] | None = None  # completions' echo: each choice's prompt text, sent before its own

    async def finish(self) -> tuple[list[RequestOutput], list[list | None]]:
        """Every choice's final output and logprobs (a non-streaming answer), then closed; APIError 500
        when a choice failed."""
        try:
            outs, logprobs = await self.choices.collect()
        finally:
            await self.aclose()
        if any(o.finish_reason == "error" for o in outs):
            raise APIError(500, f"generation failed: {next(o.error for o in outs if o.error)}", code="engine_error")
        return outs, logprobs

    async def aclose(self) -> None:
        try:
            await self.choices.aclose()
        finally:
            self.ticket.release()


class EventStream:
    """A streaming HTTP answer: SSE lines, then ``aclose()`` (the Generation's). Call it on every exit
    path; it also works when the stream was never iterated (a client gone before the first byte),
    which an async generator's finally does not."""

    def __init__(self, events: AsyncIterator[str], gen: Generation):
        self._events, self._gen = events, gen

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> str:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            await self._gen.aclose()
