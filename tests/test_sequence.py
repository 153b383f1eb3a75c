"""Sequence.append_tokens: the conditions that finish a request while tokens are committed."""
from __future__ import annotations

import pytest

from actors.sampling_params import SamplingParams
from actors.sequence import Sequence, SeqStatus

EOS = {2}
PROMPT = [5, 6, 7]


def _seq(**params) -> Sequence:
    return Sequence("r", PROMPT, SamplingParams(**params))


@pytest.mark.parametrize("params, tokens, max_len, kept, reason", [
    ({"max_tokens": 8}, [9, 9, 9], 100, [9, 9, 9], None),  # nothing ends it
    ({"max_tokens": 8}, [9, 2, 9], 100, [9, 2], "stop"),  # EOS kept, what follows dropped
    ({"max_tokens": 8, "ignore_eos": True}, [9, 2, 9], 100, [9, 2, 9], None),
    ({"max_tokens": 8, "ignore_eos": True, "stop_token_ids": [9]}, [2, 9, 4], 100, [2, 9], "stop"),
    ({"max_tokens": 2}, [9, 9, 9], 100, [9, 9], "length"),  # max_tokens
    ({"max_tokens": 8}, [9, 9, 9], 5, [9, 9], "length"),  # the model's length: 3 prompt + 2
    ({"max_tokens": 2}, [9, 2], 100, [9, 2], "stop"),  # both on one token: the stop wins
])
def test_append_finishes_on_the_first_ending_token(params, tokens, max_len, kept, reason):
    seq = _seq(**params)
    seq.append_tokens(tokens, EOS, max_len)
    assert seq.output_ids == kept and seq.finish_reason == reason
    assert seq.is_finished == (reason is not None) and (seq.finish_time is not None) == (reason is not None)
    assert seq.first_token_time is not None


def test_finish_records_reason_error_and_time():
    seq = _seq(max_tokens=4)
    assert seq.first_token_time is None and seq.status is SeqStatus.WAITING
    seq.finish("error", "target forward failed: boom")
    assert (seq.status, seq.finish_reason, seq.error) == (SeqStatus.FINISHED, "error", "target forward failed: boom")
    assert seq.finish_time >= seq.arrival_time
