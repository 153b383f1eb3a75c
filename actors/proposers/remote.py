"""RemoteProposer: the driver-side Proposer over one or more DrafterWorker actors.

Every step fans the same requests out to all live workers at once, waits for them with one
deadline, and merges their trees per request (SpecInfer's merge: ``merge_trees`` then
``truncate_tree(..., max_nodes)``). A worker whose answer is missing is left out of the merge.

Faults: a dead worker (RayActorError) or one that misses the deadline (it is killed) is replaced
by a new actor from the same spec, started in the background: it takes calls again once its
``ping`` answers. If no worker answered a step, ``result``/``propose`` raise, and the engine decodes
that step without speculation (nothing lost; greedy output unchanged). A slot that fails more than
``max_restarts`` times without answering a step in between is retired (no endless reloads).

``propose_async`` returns a ``PendingProposal`` so that the driver can verify one micro-batch while
the workers draft the next (see cluster/overlap.py); ``propose`` = ``propose_async(...).result()``.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence

import torch

from actors.proposers.base import DraftRequest, Proposer
from actors.proposers.worker import DraftCall, DrafterSpec, DraftReply, drafter_actor_class
from actors.tree import TokenTree, merge_trees, truncate_tree

log = logging.getLogger("specray.drafters")

_SEED_BOUND = 2**62
_MAX_PENDING_RELEASES = 256  # beyond this, releases go out on their own call instead of the next step's


class _Slot:
    """One drafter position: its spec, current actor, and what the driver knows it holds."""

    __slots__ = ("index", "spec", "handle", "starting", "sent", "pending_release", "failures", "retired")

    def __init__(self, index: int, spec: DrafterSpec):
        self.index, self.spec = index, spec
        self.handle = None
        self.starting = None  # ObjectRef of the first ping while the actor starts
        self.sent: dict[int, int] = {}  # seq_id -> tokens the worker holds
        self.pending_release: list[int] = []
        self.failures = 0  # deaths / timeouts / failed starts since the slot last answered a step
        self.retired = False

    @property
    def live(self) -> bool:
        return self.handle is not None and self.starting is None and not self.retired

    def name(self) -> str:
        return f"drafter {self.index} ({self.spec.describe()})"


class PendingProposal:
    """Trees being drafted for one batch of requests; ``result`` waits (bounded) and merges."""

    def __init__(self, owner: "RemoteProposer", reqs: list[DraftRequest], calls: list[tuple], t0: float):
        self.owner, self.reqs, self.t0 = owner, reqs, t0
        self.calls = calls  # (slot, actor handle called, ObjectRef, token count sent per request)
        self.roots = [r.token_ids[-1] for r in reqs]  # captured now: token_ids may grow meanwhile
        self.latency_s: float | None = None  # submit -> merged trees
        self.compute_s: float | None = None  # the slowest answering worker's own time
        self._trees: list[TokenTree] | None = None

    def result(self, timeout_s: float | None = None) -> list[TokenTree]:
        if self._trees is None:
            self._trees = self.owner._collect(self, self.owner.timeout_s if timeout_s is None else timeout_s)
        return self._trees


class RemoteProposer(Proposer):
    supports_async = True  # drafts in worker processes while the driver verifies

    def __init__(self, specs: Sequence[DrafterSpec], timeout_s: float = 10.0, start_timeout_s: float = 120.0,
                 actor_options: dict | None = None, max_restarts: int = 3):
        """specs: one per worker (e.g. [ngram, draft]); timeout_s: per-step deadline for answers;
        actor_options: Ray options for every worker (num_cpus, scheduling_strategy of a placement
        group bundle, ...). Raises ValueError naming a spec whose worker fails to start."""
        import ray

        if not specs:
            raise ValueError("RemoteProposer needs at least one DrafterSpec")
        self._ray = ray
        self.timeout_s, self.max_restarts = timeout_s, max_restarts
        self.actor_options = {"num_cpus": 0.5, **(actor_options or {})}
        self.slots = [_Slot(i, s) for i, s in enumerate(specs)]
        self.name = "remote[" + "+".join(s.describe() for s in specs) + "]"
        self.num_restarts = 0
        self.num_timeouts = 0
        self.num_worker_errors = 0
        self.num_steps = 0
        self.num_failed_steps = 0
        self.draft_latency_s: deque[float] = deque(maxlen=4096)  # per call: submit -> merged trees
        self.worker_compute_s: deque[float] = deque(maxlen=4096)  # the slowest worker's own time per call
        for slot in self.slots:
            self._start(slot)
        self._wait_started(start_timeout_s)

    # ---- lifecycle ------------------------------------------------------------------------
    def _start(self, slot: _Slot) -> None:
        slot.handle = drafter_actor_class().options(**self.actor_options).remote(slot.spec)
        slot.starting = slot.handle.ping.remote()
        slot.sent, slot.pending_release = {}, []

    def _wait_started(self, timeout_s: float) -> None:
        refs = [s.starting for s in self.slots]
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for slot in self.slots:
            if slot.starting not in ready:
                self.shutdown()
                raise ValueError(f"{slot.name()} did not start within {timeout_s:.0f}s; "
                                 "check the cluster's free CPUs and the draft model's size")
            try:
                self._ray.get(slot.starting)
            except Exception as e:
                self.shutdown()
                raise ValueError(f"{slot.name()} failed to start: {_root_cause(e)}") from None
            slot.starting = None

    def _poll_starting(self) -> None:
        """Replacement workers join once their first ping answered; failed starts are retried."""
        for slot in self.slots:
            if slot.starting is None or slot.retired:
                continue
            ready, _ = self._ray.wait([slot.starting], timeout=0)
            if not ready:
                continue
            try:
                self._ray.get(slot.starting)
                slot.starting = None
                log.info("%s is back", slot.name())
            except Exception as e:
                self._replace(slot, f"failed to start: {_root_cause(e)}")

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Block until every slot that is not retired is live (replacements started); True if so."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._poll_starting()
            pending = [s.starting for s in self.slots if s.starting is not None and not s.retired]
            if not pending:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._ray.wait(pending, num_returns=len(pending), timeout=min(left, 1.0))

    def _replace(self, slot: _Slot, reason: str) -> None:
        """Kill the slot's actor (if still there) and start another from the same spec; a slot that
        failed more than ``max_restarts`` times without answering a step in between is retired."""
        try:
            self._ray.kill(slot.handle, no_restart=True)
        except Exception:
            pass
        slot.failures += 1
        if slot.failures > self.max_restarts:
            slot.retired, slot.handle, slot.starting = True, None, None
            log.error("%s retired after %d failures in a row: %s", slot.name(), slot.failures, reason)
            return
        self.num_restarts += 1
        log.warning("%s %s; starting a replacement (restart %d)", slot.name(), reason, self.num_restarts)
        self._start(slot)

    def shutdown(self) -> None:
        for slot in self.slots:
            if slot.handle is not None:
                try:
                    self._ray.kill(slot.handle, no_restart=True)
                except Exception:
                    pass
            slot.handle, slot.starting, slot.retired = None, None, True

    # ---- proposing ------------------------------------------------------------------------
    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        return self.propose_async(reqs).result()

    def propose_async(self, reqs: list[DraftRequest]) -> PendingProposal:
        """Send the requests to every live worker now; the returned handle collects the trees."""
        t0 = time.perf_counter()
        self._poll_starting()
        seeds = [_draw_seeds(r, len(self.slots)) for r in reqs]  # [len(reqs)] of [num slots] or None
        calls = []
        for slot in self.slots:
            if not slot.live:
                continue
            batch = [_call(r, slot.sent.get(r.seq_id, 0), None if s is None else s[slot.index])
                     for r, s in zip(reqs, seeds)]
            released, slot.pending_release = slot.pending_release, []
            ref = slot.handle.propose.remote(batch, released)
            calls.append((slot, slot.handle, ref, [len(r.token_ids) for r in reqs]))
        return PendingProposal(self, reqs, calls, t0)

    def _collect(self, pending: PendingProposal, timeout_s: float) -> list[TokenTree]:
        self.num_steps += 1
        replies = self._gather(pending, timeout_s)
        if not replies:
            self.num_failed_steps += 1
            raise RuntimeError(f"no drafter answered ({self._state()}); decoding this step without speculation")
        trees = [_merge(root, r.max_nodes, [rep.trees[i] for rep in replies])
                 for i, (root, r) in enumerate(zip(pending.roots, pending.reqs))]
        pending.latency_s = time.perf_counter() - pending.t0
        pending.compute_s = max(rep.compute_s for rep in replies)
        self.draft_latency_s.append(pending.latency_s)
        self.worker_compute_s.append(pending.compute_s)
        return trees

    def _gather(self, pending: PendingProposal, timeout_s: float) -> list[DraftReply]:
        refs = [ref for _, _, ref, _ in pending.calls]
        if not refs:
            return []
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=max(0.0, timeout_s))
        ready = set(ready)
        replies = []
        for slot, handle, ref, lengths in pending.calls:
            current = slot.handle is handle  # else the actor called was already replaced
            if ref not in ready:
                self.num_timeouts += 1
                if current:
                    self._replace(slot, f"missed the {timeout_s:.1f}s deadline")
                continue
            reply = self._get(slot, ref, current)
            if reply is None:
                continue
            if len(reply.trees) != len(pending.reqs):
                self.num_worker_errors += 1
                log.error("%s returned %d trees for %d requests", slot.name(), len(reply.trees), len(pending.reqs))
                continue
            if current:  # a replaced actor's late answer still merges, but says nothing of its successor
                slot.failures = 0
                for r, n in zip(pending.reqs, lengths):
                    slot.sent[r.seq_id] = n
                for seq_id in reply.resend:
                    slot.sent.pop(seq_id, None)
            replies.append(reply)
        return replies

    def _get(self, slot: _Slot, ref, current: bool) -> DraftReply | None:
        from ray.exceptions import RayActorError

        try:
            return self._ray.get(ref)
        except RayActorError as e:
            if current:
                self._replace(slot, f"died ({type(e).__name__})")
        except Exception as e:  # the proposer raised inside a live worker: leave it out of this step
            self.num_worker_errors += 1
            log.error("%s failed a step: %s", slot.name(), _root_cause(e))
        return None

    # ---- releasing / stats ------------------------------------------------------------------
    def release(self, seq_id: int) -> None:
        """Batched: rides along with the next step's call to each worker (or goes out once many wait)."""
        for slot in self.slots:
            slot.sent.pop(seq_id, None)
            if slot.live or slot.starting is not None:
                slot.pending_release.append(seq_id)
        if max(len(s.pending_release) for s in self.slots) >= _MAX_PENDING_RELEASES:
            self.flush()

    def flush(self) -> None:
        """Send pending releases now (e.g. when the engine goes idle)."""
        for slot in self.slots:
            if slot.pending_release and slot.handle is not None and not slot.retired:
                slot.handle.release.remote(slot.pending_release)
            slot.pending_release = []

    @property
    def num_live(self) -> int:
        return sum(s.live for s in self.slots)

    def handles(self) -> list:
        """Current actor handle per slot (None when retired)."""
        return [s.handle for s in self.slots]

    def ping(self, timeout_s: float = 30.0) -> list[dict]:
        return self._ray.get([s.handle.ping.remote() for s in self.slots if s.live], timeout=timeout_s)

    def stats(self) -> dict:
        lat = sorted(self.draft_latency_s)
        return {"num_workers": len(self.slots), "num_live": self.num_live, "num_restarts": self.num_restarts,
                "num_timeouts": self.num_timeouts, "num_worker_errors": self.num_worker_errors,
                "num_steps": self.num_steps, "num_failed_steps": self.num_failed_steps,
                "draft_latency_p50_s": lat[len(lat) // 2] if lat else None,
                "draft_latency_mean_s": sum(lat) / len(lat) if lat else None,
                "worker_compute_mean_s": (sum(self.worker_compute_s) / len(self.worker_compute_s)
                                          if self.worker_compute_s else None)}

    def _state(self) -> str:
        starting = sum(s.starting is not None for s in self.slots)
        retired = sum(s.retired for s in self.slots)
        return f"{self.num_live} live, {starting} starting, {retired} retired of {len(self.slots)}"


def _draw_seeds(req: DraftRequest, n: int) -> list[int] | None:
    """Sampling requests: n worker seeds from the request's own generator (reproducible with
    SamplingParams.seed); drawn for every slot, live or not, so the stream does not depend on faults."""
    if req.params.greedy:
        return None
    return torch.randint(0, _SEED_BOUND, (n,), generator=req.generator).tolist()


def _call(req: DraftRequest, held: int, seed: int | None) -> DraftCall:
    held = held if 0 < held < len(req.token_ids) else 0
    return DraftCall(req.seq_id, held, req.token_ids[held:], list(req.expansion), req.max_nodes, req.params, seed)


def _merge(root: int, max_nodes: int, trees: list[TokenTree]) -> TokenTree:
    """Worker trees for one request -> one tree of at most max_nodes drafts; malformed trees are dropped."""
    good = [t for t in trees if t.tokens[0] == root]
    if not good:
        return TokenTree.root(root)
    return truncate_tree(merge_trees(good), max_nodes)


def _root_cause(err: BaseException) -> str:
    """The innermost error message of a Ray error (an actor's creation-task traceback included)."""
    cause = getattr(err, "cause", None) or err.__cause__
    if cause is not None and cause is not err:
        return _root_cause(cause)
    text = str(err).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):  # the last "SomeError: message" line of a traceback
        if "Error:" in ln or "Exception:" in ln:
            return ln.strip()
    return lines[-1].strip() if lines else type(err).__name__
