"""Per-token log-probabilities under the target's raw distribution (OpenAI ``logprobs``), pure math.

The raw distribution is log_softmax of the target logits row that predicted the token, before
temperature, top-k or top-p (what OpenAI and vLLM report). With speculation, an accepted draft
token was predicted by its parent node's row and the bonus/recovered token by the last accepted
node's row, so the figures equal plain decoding's. A prompt's logprobs (``prompt_logprobs``, the
completions API's echo) come from the rows of its prefill chunks, computed in the same forward.
Only requests that ask pay for it.
"""
from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from actors.sequence import Sequence


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the k most likely (token id, logprob), most likely first


def token_logprobs(rows: torch.Tensor, tokens: Seq[int], k: int) -> list[TokenLogprob]:
    """rows: [m, V] target logits, row i the one that predicted tokens[i] (m == len(tokens));
    k: alternatives per token (0 = only the chosen token's logprob)."""
    if rows.dim() != 2 or rows.shape[0] != len(tokens):
        raise ValueError(f"rows must be [{len(tokens)}, V] for {len(tokens)} tokens, got {tuple(rows.shape)}")
    logp = torch.log_softmax(rows.float(), dim=-1)
    ids = torch.tensor(list(tokens), dtype=torch.long, device=rows.device)
    chosen = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1).tolist()
    if k > 0:
        values, indices = logp.topk(min(k, logp.shape[-1]), dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
    else:
        tops = [()] * len(tokens)
    return [TokenLogprob(int(t), c, top) for t, c, top in zip(tokens, chosen, tops)]


def record_logprobs(seq: Sequence, logits: torch.Tensor, rows: Seq[int], tokens: Seq[int]) -> None:
    """Extend ``seq.logprobs`` for the tokens of this step that were kept (appending stops early at
    EOS or the length limit, so only the first ``num_output_tokens - len(seq.logprobs)`` count).
    logits: [M, V] the step's logits rows; rows: index into them per token. Only for requests that
    asked (``seq.logprobs`` is a list)."""
    kept = seq.num_output_tokens - len(seq.logprobs)
    if kept <= 0:
        return
    index = torch.tensor(list(rows[:kept]), dtype=torch.long, device=logits.device)
    seq.logprobs.extend(token_logprobs(logits.index_select(0, index), tokens[:kept], seq.params.logprobs))


def prompt_logprob_rows(scheduled, chunks) -> tuple[list[int], list[tuple[Sequence, list[int]]]]:
    """The rows of a step's prefill chunks whose logits give prompt logprobs (requests with
    ``prompt_logprobs``; ``scheduled``: the step's ScheduledSeqs, ``chunks``: their SeqChunks, in
    order): the row of prompt position p predicts token p + 1, for p < prompt length - 1 and not yet
    recorded (a recompute after preemption records nothing twice). Returns the flat token indices
    and, per sequence, the prompt tokens they score."""
    rows, wants, start = [], [], 0
    for s, chunk in zip(scheduled, chunks):
        seq = s.seq
        if not s.is_decode and seq.prompt_logprobs is not None:
            nc = seq.num_computed
            first = max(nc, len(seq.prompt_logprobs))
            last = min(nc + s.num_query, seq.num_prompt_tokens - 1)
            if first == len(seq.prompt_logprobs) and first < last:
                rows += range(start + first - nc, start + last - nc)
                wants.append((seq, seq.token_ids[first + 1:last + 1]))
        start += len(chunk.token_ids)
    return rows, wants


def record_prompt_logprobs(wants: list[tuple[Sequence, list[int]]], logits: torch.Tensor,
                           num_rows: int) -> torch.Tensor:
    """Extend each sequence's prompt logprobs (``prompt_logprob_rows``' wants) from the rows after the
    first ``num_rows`` of logits [num_rows + extra, V]; returns the first ``num_rows`` (what
    verification reads)."""
    at = num_rows
    for seq, tokens in wants:
        seq.prompt_logprobs.extend(token_logprobs(logits[at:at + len(tokens)], tokens, seq.params.prompt_logprobs))
        at += len(tokens)
    return logits[:num_rows]
