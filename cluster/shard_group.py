"""The driver's handle on one tensor-parallel verifier group (``VerifierShard`` Ray actors placed in
one placement group). It has the in-process ``Verifier``'s interface, so ``LLMEngine(...,
verifier=ShardGroup.create(...))`` runs the target across the group unchanged.

One Ray call per step goes to rank 0 (the step metadata plus the slot copies the engine asked for
since the previous forward: ``copy_slots`` is deferred and travels with the next forward, which is
the next thing to read the KV cache). Failures never hang: every wait is bounded by ``timeout_s``
and a dead rank raises ``VerifierGroupError``; ``restart()`` rebuilds the whole group (its KV cache
starts empty, so every sequence must be prefilled again).

The per-step call is a plain actor call (~4-6 ms of control overhead on a 2-core box) or, with
``compiled=True``, a Ray compiled graph (~1-2 ms; default on CUDA only, since its shared-memory
channels busy-wait and would take a core from the compute on a small CPU host).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from actors.verifier import SeqChunk
from actors.verifier_shard import ShardSpec
from cluster.topology import ReplicaTopology, create_placement_group, validate_tp

log = logging.getLogger("specray.shard_group")


class VerifierGroupError(RuntimeError):
    """A rank of the TP group died, failed or did not answer in time; the group needs restart()."""


@dataclass
class ShardGroupStats:
    """Per-step control overhead: driver wall time of a step minus rank 0's time inside it."""

    steps: int = 0
    wall_s: float = 0.0  # driver: from the Ray call to the logits in hand
    compute_s: float = 0.0  # rank 0: broadcast + forward + gather

    def record(self, wall_s: float, compute_s: float) -> None:
        self.steps += 1
        self.wall_s += wall_s
        self.compute_s += compute_s

    def reset(self) -> None:
        self.steps, self.wall_s, self.compute_s = 0, 0.0, 0.0

    @property
    def overhead_ms_per_step(self) -> float:
        return 1e3 * (self.wall_s - self.compute_s) / self.steps if self.steps else 0.0

    @property
    def overhead_fraction(self) -> float:
        return (self.wall_s - self.compute_s) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def step_ms(self) -> float:
        return 1e3 * self.wall_s / self.steps if self.steps else 0.0


class ShardGroup:
    """Verifier interface over ``spec.tp_size`` actors: forward_logits, copy_slots, warmup,
    block_size, num_blocks, num_layers. Build it with ``ShardGroup.create``."""

    def __init__(self, spec: ShardSpec, topology: ReplicaTopology, placement_group, owns_placement_group: bool,
                 compiled: bool | None = None):
        """compiled: drive rank 0 through a Ray compiled graph (falls back to plain actor calls if it
        cannot compile); None = only on CUDA, see ``create``."""
        from actors.model.config import ModelConfig

        self.spec, self.topology = spec, topology
        self.compiled = torch.device(spec.device).type == "cuda" if compiled is None else compiled
        self._pg, self._owns_pg = placement_group, owns_placement_group
        self.block_size, self.num_blocks = spec.block_size, spec.num_blocks
        model_config = ModelConfig.from_dir(Path(spec.model))
        self.num_layers, self.vocab_size = model_config.num_layers, model_config.vocab_size
        self.device = torch.device("cpu")  # where forward_logits returns the logits
        self.step_stats = ShardGroupStats()
        self.epoch = 0  # +1 per restart(): KV contents from an older epoch are gone
        self.rank_info: list[dict] = []
        self._actors: list = []
        self._loops: list = []  # serve_loop() refs of ranks 1..tp-1; one finishing = group broken
        self._dag = None  # the compiled graph driving rank 0's step(), when compiled
        self._pending: tuple[list[int], list[int]] = ([], [])
        self._broken: str | None = None
        self._start()

    @classmethod
    def create(cls, model: str, tp_size: int, num_blocks: int, block_size: int, *, topology: ReplicaTopology | None = None,
               placement_group=None, compiled: bool | None = None, **spec_options) -> "ShardGroup":
        """model: alias, HF dir or GGUF (resolved here, once). spec_options: ShardSpec fields (dtype,
        device, num_threads, timeout_s). Without ``placement_group`` one is created from
        ``topology`` (default: tp_size verifier bundles) and removed again by shutdown().
        compiled: a Ray compiled graph for the per-step call (about 1 ms less overhead per step), but
        its channels busy-wait: rank 0 burns a core while idle and the driver one while it waits
        for a step. None (default) = on for CUDA groups, off on CPU, where cores do the compute."""
        from actors.model.config import ModelConfig
        from actors.model.loader import gguf_file, resolve_model_dir

        model_dir, gguf = resolve_model_dir(model), gguf_file(model)
        validate_tp(ModelConfig.from_dir(model_dir), tp_size, str(model))
        spec = ShardSpec(str(model_dir), tp_size, num_blocks, block_size, gguf=None if gguf is None else str(gguf),
                         **spec_options)
        use_gpu = torch.device(spec.device).type == "cuda"
        topology = topology or ReplicaTopology(tp_size=tp_size, use_gpu=use_gpu)
        if topology.tp_size != tp_size:
            raise ValueError(f"topology has tp_size={topology.tp_size} but tp_size={tp_size} was asked for")
        owns = placement_group is None
        if owns:
            placement_group = create_placement_group(topology, timeout_s=spec.timeout_s)
        try:
            return cls(spec, topology, placement_group, owns, compiled)
        except BaseException:
            if owns:
                _remove_pg(placement_group)
            raise

    # ---- lifecycle ----------------------------------------------------------------------
    def _start(self) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from actors.verifier_shard import VerifierShardActor

        bundle = self.topology.verifier_bundle()
        self._actors = [
            VerifierShardActor.options(
                num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=self.topology.verifier_bundle_index(r)),
            ).remote(self.spec, r)
            for r in range(self.spec.tp_size)
        ]
        try:
            start = max(self.spec.start_timeout_s, self.spec.timeout_s)  # loading shards takes a while
            addr = (self._get(self._actors[0].rendezvous.remote(), "rendezvous", start)
                    if self.spec.tp_size > 1 else ())
            self.rank_info = [self._get(ref, f"set-up of rank {r}", start)
                              for r, ref in enumerate([a.setup.remote(*addr) for a in self._actors])]
        except BaseException:
            self._kill_actors()
            raise
        self._loops = [a.serve_loop.remote() for a in self._actors[1:]]
        self._dag = self._compile() if self.compiled else None
        self._broken = None

    def _compile(self):
        """Compiled graph for rank 0's step() (shared-memory channels); None: plain actor calls."""
        from ray.dag import InputNode

        try:
            with InputNode() as inp:
                dag = self._actors[0].step.bind(inp)
            return dag.experimental_compile(_buffer_size_bytes=max(1 << 20, 16 * 4 * self.vocab_size))
        except Exception:  # compiled graphs are beta in Ray: keep serving with plain calls
            log.warning("Ray compiled graph unavailable; the TP group uses plain actor calls", exc_info=True)
            return None

    def _teardown_dag(self) -> None:
        if self._dag is not None:
            try:
                self._dag.teardown()
            except Exception:  # rank 0 already dead
                pass
            self._dag = None

    def restart(self) -> None:
        """Kill every rank and start a fresh group (new rendezvous port, empty KV cache)."""
        log.warning("restarting TP verifier group (tp=%d, epoch %d)", self.spec.tp_size, self.epoch)
        self._teardown_dag()
        self._kill_actors()
        self._pending = ([], [])
        self.epoch += 1
        self._start()

    def shutdown(self) -> None:
        """Stop the loops (bounded wait), kill the actors, remove an owned placement group. Idempotent."""
        import ray

        if self._actors and self._broken is None and self.spec.tp_size > 1:
            try:
                ray.get(self._actors[0].stop.remote(), timeout=5)
                ray.wait(self._loops, num_returns=len(self._loops), timeout=5)
            except Exception:  # best effort: the actors are killed next anyway
                pass
        self._teardown_dag()
        self._kill_actors()
        self._broken = "shut down"
        if self._owns_pg and self._pg is not None:
            _remove_pg(self._pg)
            self._pg = None

    def _kill_actors(self) -> None:
        import ray

        for a in self._actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already gone
                pass
        self._actors, self._loops = [], []

    def __enter__(self) -> "ShardGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def is_compiled(self) -> bool:
        """True when steps go through a Ray compiled graph rather than plain actor calls."""
        return self._dag is not None

    @property
    def actors(self) -> list:
        """The rank actors, rank order (tests kill one to check fault handling)."""
        return list(self._actors)

    # ---- the Verifier interface ---------------------------------------------------------------
    def forward_logits(self, chunks: list[SeqChunk], logit_rows: list[int],
                       num_layers: int | None = None) -> torch.Tensor:
        """chunks: one per sequence; logit_rows: flat token indices needing logits -> [M, V] fp32."""
        self._check_usable()
        args = (chunks, logit_rows, num_layers, *self._pending)
        t0 = time.perf_counter()
        logits, compute_s = self._step_compiled(args) if self._dag is not None else self._step_plain(args)
        self._pending = ([], [])
        self.step_stats.record(time.perf_counter() - t0, compute_s)
        return logits

    def _step_plain(self, args: tuple) -> tuple[torch.Tensor, float]:
        arr, secs = self._await(self._actors[0].step.remote(args), "forward")
        # a read-only array lives in Ray's object store: copy it once (callers may write the logits)
        return torch.from_numpy(arr if arr.flags.writeable else arr.copy()), secs

    def _step_compiled(self, args: tuple) -> tuple[torch.Tensor, float]:
        import ray

        if self._loops:
            ended, _ = ray.wait(self._loops, num_returns=1, timeout=0)
            if ended:
                self._fail(f"rank {1 + self._loops.index(ended[0])} left its step loop ({_outcome(ended[0])})")
        try:
            out = self._dag.execute(args).get(timeout=self.spec.timeout_s)
        except ValueError:  # RayTaskError(ValueError): rejected before any state changed, group intact
            raise
        except Exception as e:  # rank died (channel closed), step failed, or no answer in time
            self._fail(f"forward failed: {_first_line(e)}", e)
        logits, secs = torch.from_numpy(out[0].copy()), out[1]  # out[0] is a view of the channel buffer
        del out
        return logits, secs

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        """Queue K/V moves (all layers, every rank); they run first thing in the next forward."""
        if len(src) != len(dst):
            raise ValueError(f"copy_slots: {len(src)} source slots but {len(dst)} destination slots")
        cap = self.num_blocks * self.block_size
        bad = [s for s in (*src, *dst) if not 0 <= s < cap]
        if bad:
            raise ValueError(f"copy_slots: slot {bad[0]} is outside the KV cache [0, {cap})")
        self._pending[0].extend(src)
        self._pending[1].extend(dst)

    def warmup(self) -> None:
        """One small prefill through every rank (not counted in stats)."""
        n = min(4, self.block_size * self.num_blocks)
        chunk = SeqChunk([0] * n, list(range(n)), list(range(n)), n, list(range(-(-n // self.block_size))))
        st = self.step_stats
        before = (st.steps, st.wall_s, st.compute_s)
        self.forward_logits([chunk], [n - 1])
        st.steps, st.wall_s, st.compute_s = before

    # ---- figures ------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Per-step figures for metrics: steps, ms per step, control overhead (ms and fraction)."""
        st = self.step_stats
        return {"tp_size": self.spec.tp_size, "epoch": self.epoch, "steps": st.steps, "step_ms": st.step_ms,
                "overhead_ms_per_step": st.overhead_ms_per_step, "overhead_fraction": st.overhead_fraction}

    def param_bytes(self) -> list[int]:
        """Bytes of parameters held by each rank (rank order), measured in the actors."""
        return [self._get(a.param_bytes.remote(), f"param_bytes of rank {r}") for r, a in enumerate(self._actors)]

    def ping(self) -> list[int]:
        return [self._get(a.ping.remote(), f"ping of rank {r}") for r, a in enumerate(self._actors)]

    # ---- failure handling ------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._broken is not None:
            raise VerifierGroupError(f"TP verifier group (tp={self.spec.tp_size}) is unusable: {self._broken}; "
                                     "call restart()")

    def _fail(self, reason: str, cause: BaseException | None = None):
        self._broken = reason
        raise VerifierGroupError(f"TP verifier group (tp={self.spec.tp_size}, epoch {self.epoch}) failed: "
                                 f"{reason}; call restart()") from cause

    def _await(self, ref, what: str):
        """The result of a rank-0 call, watching the other ranks' loops: a loop that ends (its rank
        died or failed) or no answer within timeout_s raises VerifierGroupError."""
        import ray

        ready, _ = ray.wait([ref, *self._loops], num_returns=1, timeout=self.spec.timeout_s)
        if not ready:
            self._fail(f"rank 0 gave no answer to {what} within {self.spec.timeout_s:g} s")
        if ready[0] is not ref:
            rank = 1 + self._loops.index(ready[0])
            self._fail(f"rank {rank} left its step loop ({_outcome(ready[0])})")
        return self._get(ref, what)

    def _get(self, ref, what: str, timeout_s: float | None = None):
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

        timeout_s = self.spec.timeout_s if timeout_s is None else timeout_s
        try:
            return ray.get(ref, timeout=timeout_s)
        except GetTimeoutError as e:
            self._fail(f"no answer to {what} within {timeout_s:g} s", e)
        except RayTaskError as e:
            if isinstance(e, ValueError):  # rejected before any state changed: bad input, group intact
                raise
            self._fail(f"{what} failed: {_first_line(e)}", e)
        except (RayActorError, RayError) as e:
            self._fail(f"a rank died during {what}: {_first_line(e)}", e)


def _outcome(ref) -> str:
    import ray

    try:
        return f"returned after {ray.get(ref, timeout=1)} steps"
    except Exception as e:
        return _first_line(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"[:300]


def _remove_pg(pg) -> None:
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(pg)
    except Exception:  # already removed
        pass
