"""A written estimate of a tensor-parallel decode step from a measured single-GPU step (issue 26,
item 6): what TP=p saves in weight streaming and what its all-reduces cost.

Each decoder layer all-reduces its activations twice (after the attention output projection and
after the MLP down projection): per step 2 x layers all-reduces of tokens x hidden x bytes. A ring
all-reduce moves 2 (p - 1) / p of the message through each GPU's link, plus a fixed latency per
call (small messages are latency-bound). The weights are split p ways, so the bandwidth-bound
part of the step shrinks about p-fold.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TPEstimate:
    allreduce_bytes: int  # per step, each all-reduce's message summed
    allreduces: int
    comm_s: float
    step_s: float  # estimated TP step


def tp_step_estimate(single_step_s: float, layers: int, hidden: int, tokens: int, dtype_bytes: int, tp: int,
                     link_bytes_per_s: float, latency_s: float) -> TPEstimate:
    """single_step_s: the measured one-GPU step; link_bytes_per_s: one GPU's all-reduce bandwidth
    (one direction); latency_s: fixed cost of one small all-reduce."""
    if tp < 1 or link_bytes_per_s <= 0:
        raise ValueError(f"tp={tp}, link bandwidth={link_bytes_per_s}: tp must be >= 1 and bandwidth > 0")
    calls = 2 * layers
    message = tokens * hidden * dtype_bytes
    if tp == 1:
        return TPEstimate(0, 0, 0.0, single_step_s)
    per_call = 2 * (tp - 1) / tp * message / link_bytes_per_s + latency_s
    comm = calls * per_call
    return TPEstimate(calls * message, calls, comm, single_step_s / tp + comm)
