"""OpenAI-compatible response bodies: choices, whole answers, SSE chunks, usage and the
``speculation`` extension, and the model list. Pure functions of the engine's ``RequestOutput``s
(``deployments.openai_server`` streams and assembles them; gRPC and batch output reuse the counters)."""
from __future__ import annotations

import time
import uuid

from cluster.outputs import RequestOutput
from deployments.openai_tools import calls_finish_reason


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage_of(out: RequestOutput) -> dict:
    """One choice's token counts, and its prediction's as over HTTP when it had one."""
    return {**total_usage([out]), **_completion_details([out])}


def speculation_of(out: RequestOutput) -> dict:
    rate = out.num_accepted_tokens / out.num_draft_tokens if out.num_draft_tokens else None
    return {"num_drafts": out.num_drafts, "num_draft_tokens": out.num_draft_tokens,
            "num_accepted_tokens": out.num_accepted_tokens, "acceptance_rate": rate,
            "accepted_per_pos": list(out.accepted_per_pos)}


def prompt_heads(outs: list[RequestOutput], per_prompt: int | None = None) -> list[RequestOutput]:
    """The first choice of each prompt of a request whose prompts have ``per_prompt`` choices each
    (None: one prompt, all of ``outs`` its choices): what counts each prompt once."""
    return outs[::per_prompt] if per_prompt else outs[:1]


def total_usage(outs: list[RequestOutput], per_prompt: int | None = None) -> dict:
    """Usage of a request's choices: each prompt counted once (``prompt_heads``), every choice's tokens."""
    prompt = sum(o.num_prompt_tokens for o in prompt_heads(outs, per_prompt))
    completion = sum(o.num_output_tokens for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def openai_usage(outs: list[RequestOutput], per_prompt: int | None = None) -> dict:
    """``total_usage`` plus OpenAI's ``prompt_tokens_details.cached_tokens``: prompt tokens served
    from the prefix cache (device or host KV tier), and for requests with a ``prediction``
    ``completion_tokens_details``. HTTP only (the gRPC Usage message has no cached tokens)."""
    cached = sum(o.num_cached_tokens for o in prompt_heads(outs, per_prompt))
    return {**total_usage(outs, per_prompt), "prompt_tokens_details": {"cached_tokens": cached},
            **_completion_details(outs)}


def _completion_details(outs: list[RequestOutput]) -> dict:
    """``{"completion_tokens_details": prediction_counts}`` for requests with a prediction, else {}."""
    details = prediction_counts(outs)
    return {"completion_tokens_details": details} if details else {}


def prediction_counts(outs: list[RequestOutput]) -> dict:
    """OpenAI's predicted-output counts of a request's choices: the prediction's tokens the answers
    repeat, and the rest ({} for a request without a prediction)."""
    predicted = sum(o.num_prediction_tokens for o in outs)
    if not predicted:
        return {}
    accepted = sum(o.num_accepted_prediction_tokens for o in outs)
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": predicted - accepted}


def total_speculation(outs: list[RequestOutput]) -> dict:
    """Speculation counters summed over the choices (one choice: that choice's own)."""
    if len(outs) == 1:
        return speculation_of(outs[0])
    per_pos = [0] * max(len(o.accepted_per_pos) for o in outs)
    for o in outs:
        for i, count in enumerate(o.accepted_per_pos):
            per_pos[i] += count
    drafted, accepted = sum(o.num_draft_tokens for o in outs), sum(o.num_accepted_tokens for o in outs)
    return {"num_drafts": sum(o.num_drafts for o in outs), "num_draft_tokens": drafted,
            "num_accepted_tokens": accepted, "acceptance_rate": accepted / drafted if drafted else None,
            "accepted_per_pos": per_pos}


def finish_reason_of(out: RequestOutput) -> str | None:
    if not out.finished:
        return None
    return {"abort": "abort", "error": "error"}.get(out.finish_reason, out.finish_reason)


def choice_body(index: int, out: RequestOutput, chat: bool, logprobs: dict | None = None,
                token_ids: bool = False, tool_calls: list[dict] | None = None) -> dict:
    """One choice of a non-streaming answer; ``tool_calls``: the calls the answer made (chat)."""
    if chat:
        message = {"role": "assistant", "content": out.text}
        if tool_calls:
            message.update(content=None, tool_calls=tool_calls)
        choice = {"index": index, "message": message, "logprobs": logprobs,
                  "finish_reason": calls_finish_reason(tool_calls, finish_reason_of(out))}
    else:
        choice = {"index": index, "text": out.text, "logprobs": logprobs, "finish_reason": finish_reason_of(out)}
    if token_ids:
        choice["token_ids"] = list(out.token_ids)
    return choice


def completion_response(rid: str, model: str, choices: list[dict], outs: list[RequestOutput], chat: bool,
                        per_prompt: int | None = None) -> dict:
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": openai_usage(outs, per_prompt),
            "speculation": total_speculation(outs)}


def stream_chunk(rid: str, model: str, chat: bool, index: int = 0, text: str | None = None,
                 finish_reason: str | None = None, role: bool = False, created: int | None = None,
                 token_ids: list[int] | None = None, logprobs: dict | None = None, usage: dict | None = None,
                 tool_calls: list[dict] | None = None) -> dict:
    """One SSE chunk with one choice, ``index`` (``text`` None and ``role`` set: the chat opening chunk);
    ``usage``: the usage so far (``stream_options.continuous_usage_stats``); ``tool_calls``: an
    answer's calls, whole, in one delta (each with its ``index``)."""
    if chat:
        delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
        if tool_calls:
            delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(tool_calls)]
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    chunk = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
             "created": created or int(time.time()), "model": model, "choices": [choice]}
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def running_usage(prompt_tokens: int, completion_tokens: list[int]) -> dict:
    """Usage so far of a streamed request: the prompt once, the tokens each choice has streamed."""
    done = sum(completion_tokens)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": done, "total_tokens": prompt_tokens + done}


def usage_chunk(rid: str, model: str, chat: bool, outs: list[RequestOutput], created: int | None = None,
                per_prompt: int | None = None) -> dict:
    """The last chunk when ``stream_options.include_usage``: no choices, usage and speculation."""
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created or int(time.time()), "model": model, "choices": [],
            "usage": openai_usage(outs, per_prompt), "speculation": total_speculation(outs)}


def model_card(model: str, created: int) -> dict:
    return {"id": model, "object": "model", "created": created, "owned_by": "specray"}


def models_response(model: str, created: int) -> dict:
    return {"object": "list", "data": [model_card(model, created)]}
