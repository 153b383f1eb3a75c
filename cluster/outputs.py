"""What the engine hands back per request and step: deltas for streaming, totals at the end."""
from __future__ import annotations

import difflib
import time
from dataclasses import asdict, dataclass, field

from actors.sequence import Sequence


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    text: str  # all output text so far (stop strings removed)
    token_ids: list[int]  # all output token ids so far
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # stop | length | abort | error
    num_prompt_tokens: int
    num_output_tokens: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_pos: list[int] = field(default_factory=list)
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str | None = None
    # actors.logprobs.TokenLogprob of this step's new tokens (aligned with delta_token_ids); None
    # unless the request asked for logprobs. A delta only: whole lists would cost O(n^2) to stream.
    delta_logprobs: list | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (device, host or disk tier)
    num_host_cached_tokens: int = 0  # of those, loaded from the host KV tier
    num_disk_cached_tokens: int = 0  # ... and from the disk KV tier (the rest: found on the device)
    num_shared_cached_tokens: int = 0  # ... and fetched from the shared KV tier across replicas
    # Requests with a prediction, on their final output: its tokens, and how many of them the answer
    # repeats (in order: ``repeated_tokens``)
    num_prediction_tokens: int = 0
    num_accepted_prediction_tokens: int = 0
    # Requests with structured output: its kind (json_schema, ...), and the accepted drafts its grammar
    # forced (counted in num_accepted_tokens too)
    structured: str | None = None
    num_forced_tokens: int = 0
    # Requests with prompt_logprobs, on their first and their final output: the prompt's token ids
    # and one TokenLogprob per prompt token after the first (the first has no row that predicts it)
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list | None = None
    # Requests with return_hidden_states, on their final output when it ends with "stop" or "length":
    # [prompt + output tokens - 1, H] the target's final-normed hidden state of every position but
    # the last (row t is what the target predicted token t + 1 from); a tensor, not in to_dict
    hidden_states: object = None

    def to_dict(self) -> dict:
        d = asdict(self)
        for delta in ("delta_text", "delta_token_ids", "delta_logprobs"):
            d.pop(delta)
        d.pop("hidden_states")  # a tensor: the engine API's, not the wire's
        for key in ("prompt_token_ids", "prompt_logprobs"):  # only requests that asked carry them
            if d[key] is None:
                d.pop(key)
        return d


class Detokenizer:
    """Incremental text with stop strings. Text is re-decoded from the output ids each step (cheap
    at these lengths, and correct for multi-byte tokens); the tail that could still become a stop
    string or is an incomplete UTF-8 character is held back until it is settled."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def text_of(self, seq: Sequence) -> str:
        """The output's text; a stop token that ended it is not in it (unless the request includes
        stop strings in its output)."""
        ids = seq.output_ids
        stopped = seq.is_finished and ids and ids[-1] in seq.params.stop_token_ids
        if stopped and not seq.params.include_stop_str_in_output:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def find_stop(self, seq: Sequence, text: str) -> int | None:
        """Index where the earliest stop string starts in ``text``, or None."""
        span = self.stop_span(seq, text)
        return None if span is None else span[0]

    def stop_span(self, seq: Sequence, text: str) -> tuple[int, int] | None:
        """(start, end) of the earliest stop string in ``text`` (of those starting there, the
        shortest: the one that completed first), or None."""
        hits = [(i, i + len(s)) for i, s in ((text.find(s), s) for s in seq.params.stop if s) if i >= 0]
        return min(hits) if hits else None

    def final_text(self, seq: Sequence, text: str) -> str:
        """A request that ended at a stop string: its text up to the string (through it, with
        ``include_stop_str_in_output``)."""
        span = self.stop_span(seq, text)
        if span is None:
            return text
        return text[:span[1]] if seq.params.include_stop_str_in_output else text[:span[0]]

    def streamable_len(self, seq: Sequence, text: str) -> int:
        if seq.is_finished:
            return len(text)
        end = len(text)
        while end > 0 and text[end - 1] == "\ufffd":
            end -= 1  # an incomplete multi-byte character
        hold = max((len(s) - 1 for s in seq.params.stop if s), default=0)
        for k in range(min(hold, end), 0, -1):
            if any(s.startswith(text[end - k:end]) for s in seq.params.stop if s):
                return end - k
        return end


def make_output(seq: Sequence, text: str, stream_len: int, prev_tokens: int) -> RequestOutput:
    now = time.perf_counter()
    delta_text = text[seq.text_offset:stream_len]
    seq.text_offset = max(seq.text_offset, stream_len)
    out_ids = seq.output_ids
    return RequestOutput(
        request_id=seq.request_id,
        text=text[:stream_len] if not seq.is_finished else text,
        token_ids=out_ids,
        delta_text=delta_text,
        delta_token_ids=out_ids[prev_tokens:],
        finished=seq.is_finished,
        finish_reason=seq.finish_reason,
        num_prompt_tokens=seq.num_prompt_tokens,
        num_output_tokens=len(out_ids),
        num_drafts=seq.spec.num_drafts,
        num_draft_tokens=seq.spec.num_draft_tokens,
        num_accepted_tokens=seq.spec.num_accepted_tokens,
        accepted_per_pos=list(seq.spec.accepted_per_pos),
        ttft_s=None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time,
        e2e_s=(seq.finish_time or now) - seq.arrival_time if seq.is_finished else None,
        error=seq.error,
        delta_logprobs=None if seq.logprobs is None else seq.logprobs[prev_tokens:],
        num_cached_tokens=seq.num_cached_tokens,
        num_host_cached_tokens=seq.num_host_cached_tokens,
        num_disk_cached_tokens=seq.num_disk_cached_tokens,
        num_shared_cached_tokens=seq.num_shared_cached_tokens,
        structured=None if seq.params.structured is None else seq.params.structured.kind,
        num_forced_tokens=seq.spec.num_forced_tokens,
        **(_prediction_fields(seq, out_ids) if seq.is_finished and seq.params.prediction_ids else {}),
        **(_prompt_fields(seq) if seq.prompt_logprobs is not None and (prev_tokens == 0 or seq.is_finished) else {}),
        hidden_states=_hidden_states(seq),
    )


def repeated_tokens(prediction: list[int] | tuple[int, ...], output: list[int]) -> int:
    """How many of ``prediction``'s tokens ``output`` repeats, in order (the matching blocks of
    difflib's alignment): OpenAI's ``accepted_prediction_tokens``; the rest of the prediction is its
    ``rejected_prediction_tokens``. Once per finished request: with difflib's junk heuristic, two
    unrelated 8,000-token texts take ~40 ms (without it ~140), an edited copy ~17 ms, and the count of
    the edited copy is within 0.1% of the exact one."""
    matcher = difflib.SequenceMatcher(None, prediction, output)
    return sum(b.size for b in matcher.get_matching_blocks())


def _prediction_fields(seq: Sequence, out_ids: list[int]) -> dict:
    pred = seq.params.prediction_ids
    return {"num_prediction_tokens": len(pred), "num_accepted_prediction_tokens": repeated_tokens(pred, out_ids)}


def _hidden_states(seq: Sequence):
    """[num_tokens - 1, H] of a request that asked and ended normally (an aborted one may not have
    computed every position), else None."""
    if seq.hidden_states is None or not seq.is_finished or seq.finish_reason not in ("stop", "length"):
        return None
    return seq.hidden_states.gather(seq.num_tokens - 1)


def _prompt_fields(seq: Sequence) -> dict:
    return {"prompt_token_ids": seq.token_ids[:seq.num_prompt_tokens], "prompt_logprobs": list(seq.prompt_logprobs)}
