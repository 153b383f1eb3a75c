"""Per-request sequence state: counts are stored, everything else is derived."""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from actors.hidden_states import HiddenRecord
from actors.sampling_params import SamplingParams

_seq_counter = itertools.count()


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class SpecStats:
    """Speculation counters of one request (vLLM's definitions)."""

    num_drafts: int = 0  # verification steps that carried at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [depth-1] -> accepted count
    num_forced_tokens: int = 0  # of the accepted, those a grammar forced (structured output's free drafts)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        while len(self.accepted_per_pos) < num_accepted:
            self.accepted_per_pos.append(0)
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0


class Sequence:
    """One request. ``token_ids`` = prompt + output; ``num_computed`` = tokens whose K/V are in
    the target's cache. While decoding, ``num_computed == num_tokens - 1`` (the last token is the
    root of the next token tree)."""

    __slots__ = (
        "seq_id", "request_id", "token_ids", "num_prompt_tokens", "num_computed", "params",
        "status", "finish_reason", "arrival_time", "first_token_time", "finish_time",
        "generator", "spec", "num_preemptions", "text_offset", "error", "logprobs", "prompt_logprobs",
        "hidden_states", "grammar",
        "num_cached_tokens", "num_host_cached_tokens", "num_disk_cached_tokens", "num_shared_cached_tokens",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams):
        self.seq_id = next(_seq_counter)
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed = 0
        self.params = params
        self.status = SeqStatus.WAITING
        self.finish_reason: str | None = None
        self.arrival_time = time.perf_counter()
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.generator = _make_generator(params)
        self.spec = SpecStats()
        self.num_preemptions = 0
        self.text_offset = 0  # characters of output text already streamed
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache (last admission)
        self.num_host_cached_tokens = 0  # of those, loaded from the host KV tier
        self.num_disk_cached_tokens = 0  # ... and from the disk KV tier
        self.num_shared_cached_tokens = 0  # ... and fetched from the shared tier across replicas
        self.error: str | None = None
        # one actors.logprobs.TokenLogprob per output token when params.logprobs is set, else None
        self.logprobs: list | None = None if params.logprobs is None else []
        # params.prompt_logprobs set: one TokenLogprob per prompt token after the first (entry i is
        # token i + 1's, from the row of position i), filled as the prompt is prefilled; else None
        self.prompt_logprobs: list | None = None if params.prompt_logprobs is None else []
        # params.return_hidden_states: the hidden rows of every committed position, else None
        self.hidden_states: HiddenRecord | None = HiddenRecord() if params.return_hidden_states else None
        # params.structured: the request's place in its grammar (actors.structured_output.GrammarState,
        # set by the engine, advanced by append_tokens), else None
        self.grammar = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def computes_every_prompt_row(self) -> bool:
        """The request reads a row of every prompt position (prompt logprobs, hidden states), so its
        prompt is computed whole, not served from the prefix cache."""
        return self.prompt_logprobs is not None or self.hidden_states is not None

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def in_prefill(self) -> bool:
        """More than the root token still needs its K/V computed."""
        return self.num_uncomputed > 1 or self.num_output_tokens == 0

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    @property
    def remaining_tokens(self) -> int:
        return self.params.max_tokens - self.num_output_tokens

    def append_tokens(self, tokens: list[int], eos_ids, max_model_len: int) -> None:
        """Commit output tokens in order; the first that ends the request (an EOS unless ignored, a
        stop token id, max_tokens or the model length reached) finishes it, and the rest are dropped.
        A request's grammar state advances over the committed tokens (a token it refuses, which
        masked rows never produce, ends the request with an error)."""
        n0, reason = len(self.token_ids), None
        for tok in tokens:
            tok = int(tok)
            self.token_ids.append(tok)
            if self.first_token_time is None:
                self.first_token_time = time.perf_counter()
            if (tok in eos_ids and not self.params.ignore_eos) or tok in self.params.stop_token_ids:
                reason = "stop"
                break
            if self.num_output_tokens >= self.params.max_tokens or self.num_tokens >= max_model_len:
                reason = "length"
                break
        error = self.grammar.advance(self.token_ids[n0:]) if self.grammar is not None else None
        if error is not None:
            self.finish("error", error)
        elif reason is not None:
            self.finish(reason)

    def finish(self, reason: str, error: str | None = None) -> None:
        self.status = SeqStatus.FINISHED
        self.finish_reason = reason
        self.error = error
        self.finish_time = time.perf_counter()

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: the KV is dropped, the tokens are kept."""
        self.num_computed = 0
        self.status = SeqStatus.WAITING
        self.num_preemptions += 1

    def preempt_by_swap(self) -> None:
        """Preemption by swap: the KV waits in the host tier; ``num_computed`` holds when swapped in."""
        self.status = SeqStatus.WAITING
        self.num_preemptions += 1


def _make_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    g = torch.Generator()
    if params.seed is not None:
        g.manual_seed(params.seed)
    else:
        g.seed()
    return g
