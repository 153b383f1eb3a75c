"""One tensor-parallel rank of the target: its weight shards, its KV-cache shard (its KV heads
only) and the step loop. A plain class (in-process with tp_size=1) and, as ``VerifierShardActor``,
a Ray actor.

Data path: the driver sends the step (chunks, logit rows, layer count, pending slot copies) to
rank 0 only. Rank 0 packs it into int64 tensors (``shard_protocol``) and broadcasts them; ranks
1..tp-1 sit in ``serve_loop`` receiving commands and run the same forward (the row-parallel
all-reduces happen inside the model). The LM-head shards are gathered to rank 0 only, for the
requested rows only, and rank 0 returns them with its compute time.

Idle ranks wait in a collective that has a timeout (``timeout_s``), so rank 0 broadcasts a NOOP
heartbeat whenever it has sent nothing for ``timeout_s / 4``; a dead peer then surfaces as an
error within a bounded time instead of a hang.
"""
from __future__ import annotations

import datetime
import gc
import os
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout  # the only way to shorten it after joining

from actors.gc_pauses import freeze_loaded
from actors.model import gguf_weights
from actors.model.attention import copy_kv_slots
from actors.model.attention_backends import set_attention_backend
from actors.model.layers import TPContext
from actors.shard_protocol import (HEADER_LEN, OP_FORWARD, OP_NOOP, OP_STOP, StepCommand, check_command, header,
                                   pack_forward, payload_len, unpack_forward)
from actors.verifier import SeqChunk, Verifier
from kernels import cpu_native

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ShardSpec:
    """What every rank of one TP group is built from (the same for all ranks)."""

    model: str  # local HF model directory (resolve aliases / GGUF on the driver first)
    tp_size: int
    num_blocks: int  # KV blocks; every rank holds the same blocks for its own KV heads
    block_size: int
    dtype: str = "float32"
    device: str = "cpu"
    num_threads: int = 1  # torch threads per rank: the cores a rank owns
    attention_backend: str = "auto"  # auto | torch | triton | native (actors.model.attention_backends)
    cpu_activations: str = "auto"  # auto | int16 | int8 | float32 (kernels.cpu_native.use_activations)
    # CUDA graphs at tp=1 only for now (a TP group would capture its all-reduces in lockstep)
    enforce_eager: bool = False
    max_num_seqs: int = 64  # sizes the graphs' static inputs
    offload_layers: int = 0  # weight offload (actors/model/weight_offload.py): this many last layers per rank
    weights_device_gb: float | None = None  # or: as many as this rank's weights need to fit G GiB
    timeout_s: float = 60.0  # bound on every step's collectives and answers
    start_timeout_s: float = 300.0  # bound on actor start, rendezvous and loading the shards
    gguf: str | None = None  # the GGUF file ``model`` was converted from: CPU products read its blocks

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(_DTYPES)}")
        if self.tp_size < 1 or self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(f"tp_size={self.tp_size}, num_blocks={self.num_blocks}, block_size={self.block_size} "
                             "must all be >= 1")


class VerifierShard:
    def __init__(self, spec: ShardSpec, rank: int):
        if not 0 <= rank < spec.tp_size:
            raise ValueError(f"rank {rank} is outside tp_size={spec.tp_size}")
        self.spec, self.rank, self.world = spec, rank, spec.tp_size
        self.device = torch.device(spec.device)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.comm_device = self.device if self.backend == "nccl" else torch.device("cpu")
        torch.set_num_threads(spec.num_threads)
        self.verifier: Verifier | None = None
        self.num_layers = self.vocab_size = 0
        self.address: tuple[str, int] | None = None  # the group's rendezvous (host, port); None at tp=1
        self._store = None
        self._lock = threading.Lock()  # one command at a time on rank 0 (forward vs heartbeat)
        self._stopped = threading.Event()
        self._broken: str | None = None
        self._last_send = time.monotonic()

    # ---- set-up -------------------------------------------------------------------------
    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: open the TCPStore on a port the OS picks (no collisions between groups on one
        host) and return (host, port) for the other ranks."""
        if self.rank != 0:
            raise RuntimeError(f"rendezvous() runs on rank 0, not rank {self.rank}")
        host = _node_ip()
        self._store = dist.TCPStore(host, 0, self.world, True, timeout=self._start_timeout(),
                                    wait_for_workers=False)
        return host, int(self._store.port)

    def setup(self, host: str | None = None, port: int | None = None) -> dict:
        """Join the process group (tp > 1), load this rank's weight shards, allocate its KV shard."""
        tp = TPContext.single()
        if self.world > 1:
            store = self._store or dist.TCPStore(host, port, self.world, False, timeout=self._start_timeout())
            self.address = (host or _node_ip(), int(store.port))
            # joining waits for peers that may still be starting; steps then get the short bound
            dist.init_process_group(self.backend, store=store, rank=self.rank, world_size=self.world,
                                    timeout=self._start_timeout())
            _set_pg_timeout(self._timeout(), None)
            tp = TPContext(self.rank, self.world, None)
        from actors.model.loader import load_model
        from actors.model.weight_offload import load_device, offload_layers_for

        dtype = _DTYPES[self.spec.dtype]
        spec = self.spec
        offloading = bool(spec.offload_layers) or spec.weights_device_gb is not None
        cpu_native.use_activations(spec.cpu_activations, self.device)
        loaded = load_model(spec.model, dtype=dtype, device=load_device(self.device, offloading), tp=tp,
                            gguf=spec.gguf)
        set_attention_backend(loaded.model, spec.attention_backend, self.device)
        self.verifier = Verifier(loaded.model, spec.num_blocks, spec.block_size, self.device, dtype,
                                 enforce_eager=spec.enforce_eager or self.world > 1, max_num_seqs=spec.max_num_seqs,
                                 offload_layers=offload_layers_for(spec.offload_layers, spec.weights_device_gb,
                                                                   loaded.model))
        self.num_layers = loaded.config.num_layers
        self.vocab_size = loaded.config.vocab_size
        if self.rank == 0 and self.world > 1:
            self._last_send = time.monotonic()
            threading.Thread(target=self._heartbeat, name="tp-heartbeat", daemon=True).start()
        return self.info()

    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.spec.timeout_s)

    def _start_timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=max(self.spec.start_timeout_s, self.spec.timeout_s))

    # ---- health / figures -----------------------------------------------------------------
    def ping(self) -> int:
        return self.rank

    def param_bytes(self) -> int:
        """Bytes of this rank's parameters (its shards only)."""
        return self._ready().model.param_bytes()

    def info(self) -> dict:
        v = self._ready()
        kv = sum(k.numel() * k.element_size() + vv.numel() * vv.element_size() for k, vv in v.kv_caches)
        return dict(rank=self.rank, tp_size=self.world, pid=os.getpid(), host=_node_ip(), address=self.address,
                    param_bytes=v.model.param_bytes(), kv_cache_bytes=kv, num_layers=self.num_layers,
                    kv_heads_per_rank=v.model.num_kv_heads_per_rank, backend=self.backend if self.world > 1 else None,
                    gguf_matrices=gguf_weights.num_bound(v.model),  # products reading the GGUF's blocks
                    gc_frozen_objects=gc.get_freeze_count())  # actors/gc_pauses.py

    def _ready(self) -> Verifier:
        if self.verifier is None:
            raise RuntimeError(f"rank {self.rank}: setup() has not run")
        return self.verifier

    # ---- rank 0: the driver's entry points ---------------------------------------------------
    def forward(self, chunks: list[SeqChunk], rows: list[int], num_layers: int | None = None,
                copy_src: list[int] = (), copy_dst: list[int] = ()) -> tuple[torch.Tensor, float]:
        """Apply the pending slot copies, then one forward -> (logits [M, V] fp32 on CPU, rank-0
        seconds spent in this call)."""
        t0 = time.perf_counter()
        h, payload = pack_forward(chunks, rows, num_layers, copy_src, copy_dst)
        direct = (chunks, rows, num_layers, list(copy_src), list(copy_dst)) if self.world == 1 else None
        logits = self._lead(h, payload, direct)
        return logits, time.perf_counter() - t0

    def forward_np(self, chunks: list[SeqChunk], rows: list[int], num_layers: int | None = None,
                   copy_src: list[int] = (), copy_dst: list[int] = ()):
        """``forward`` with the logits as a numpy array [M, V] float32: Ray moves numpy arrays
        without pickling their data (about 30% less per-step overhead than a torch tensor)."""
        logits, secs = self.forward(chunks, rows, num_layers, copy_src, copy_dst)
        return logits.numpy(), secs

    def step(self, args: tuple):
        """``forward_np(*args)``: the one-argument form a Ray compiled graph binds to."""
        return self.forward_np(*args)

    def warmup(self) -> float:
        """One small prefill through every rank (writes KV slots [0, n), as Verifier.warmup)."""
        bs = self.spec.block_size
        n = min(4, bs * self.spec.num_blocks)
        chunk = SeqChunk([0] * n, list(range(n)), list(range(n)), n, list(range(-(-n // bs))))
        return self.forward([chunk], [n - 1])[1]

    def stop(self) -> None:
        """Rank 0: tell the other ranks' loops to return; stop the heartbeat."""
        self._stopped.set()
        if self.world > 1 and self.rank == 0:
            with self._lock:
                if self._broken is None:
                    self._send(header(OP_STOP), None)
                    self._broken = "stopped"

    def _lead(self, h: torch.Tensor, payload: torch.Tensor, direct: tuple | None = None) -> torch.Tensor:
        """direct: (chunks, rows, num_layers, copy_src, copy_dst) of a one-rank group, which runs the
        verifier's own path (CUDA graphs on CUDA) instead of the broadcast command's batch."""
        v = self._ready()
        if self.rank != 0:
            raise RuntimeError(f"forward() runs on rank 0; rank {self.rank} serves serve_loop()")
        cmd = unpack_forward(h, payload, self.spec.block_size, torch.device("cpu") if direct else self.device)
        check_command(cmd, self.spec.num_blocks, self.spec.block_size, self.num_layers)  # bad input: no state change
        if direct is not None:
            chunks, rows, num_layers, src, dst = direct
            with self._lock:
                v.copy_slots(src, dst)
                # a chunk that needs no logits still writes its K/V: the forward runs whenever there is one
                logits = v.forward_logits(chunks, rows, num_layers) if chunks else torch.empty(0, self.vocab_size)
            return logits.cpu()
        with self._lock:
            if self._broken is not None:
                raise RuntimeError(f"rank 0: the TP group is unusable ({self._broken}); restart the group")
            try:
                if self.world > 1:
                    self._send(h, payload)
                logits = self._execute(cmd)
            except Exception as e:
                if self.world == 1:
                    raise
                self._broken = f"{type(e).__name__}: {e}"  # the ranks' collectives may be out of step now
                raise RuntimeError(f"rank 0: step failed after it was broadcast: {self._broken}") from e
            finally:
                self._last_send = time.monotonic()
        return logits.cpu() if logits.device.type != "cpu" else logits

    def _heartbeat(self) -> None:
        interval = max(0.2, self.spec.timeout_s / 4)
        while not self._stopped.wait(interval / 4):
            with self._lock:
                if self._broken is not None or self._stopped.is_set():
                    return
                if time.monotonic() - self._last_send < interval:
                    continue
                try:
                    self._send(header(OP_NOOP), None)
                except Exception as e:  # a peer died: the next forward says so at once
                    self._broken = f"heartbeat failed: {type(e).__name__}: {e}"
                    return
                self._last_send = time.monotonic()

    # ---- ranks 1..tp-1 ------------------------------------------------------------------------
    def serve_loop(self) -> int:
        """Ranks > 0: receive and run commands until STOP; returns the number of forwards run.
        Raises (ending the Ray call) when a collective fails, e.g. a peer died."""
        self._ready()
        if self.rank == 0:
            raise RuntimeError("serve_loop() runs on ranks > 0; rank 0 is driven by forward()")
        steps = 0
        while True:
            h = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.comm_device)
            dist.broadcast(h, src=0)
            h = h.cpu()
            op = int(h[0])
            if op == OP_STOP:
                return steps
            if op == OP_NOOP:
                continue
            if op != OP_FORWARD:
                raise RuntimeError(f"rank {self.rank}: unknown command op {op}")
            payload = torch.empty(payload_len(h), dtype=torch.int64, device=self.comm_device)
            dist.broadcast(payload, src=0)
            self._execute(unpack_forward(h, payload, self.spec.block_size, self.device))
            steps += 1

    # ---- every rank ------------------------------------------------------------------------------
    def _send(self, h: torch.Tensor, payload: torch.Tensor | None) -> None:
        """h: [HEADER_LEN] int64, payload: [P] int64 or None -> broadcast from rank 0."""
        dist.broadcast(h.to(self.comm_device), src=0)
        if payload is not None and payload.numel():
            dist.broadcast(payload.to(self.comm_device), src=0)

    def _execute(self, cmd: StepCommand) -> torch.Tensor | None:
        """Slot copies, then the forward -> logits [M, V] fp32 on rank 0, None on the others."""
        v = self._ready()
        with torch.inference_mode():
            copy_kv_slots(v.kv_caches, cmd.copy_src, cmd.copy_dst)
            m = cmd.rows.numel()
            if cmd.batch is None or m == 0:
                if cmd.batch is not None:
                    v.model(cmd.batch, v.kv_caches, num_layers=cmd.num_layers)
                return torch.empty(0, self.vocab_size) if self.rank == 0 else None
            hidden = v.model(cmd.batch, v.kv_caches, num_layers=cmd.num_layers)  # [N, H]
            return v.model.compute_logits(hidden.index_select(0, cmd.rows), gather="rank0")


def _node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # Ray missing or not connected: a single-host run
        pass
    return "127.0.0.1"


class _ShardProcess(VerifierShard):
    """Actor form: the shard owns its process for the group's lifetime, so what setup loaded is moved
    out of the garbage collector's full passes (actors/gc_pauses.py) before the first step."""

    def setup(self, host: str | None = None, port: int | None = None) -> dict:
        super().setup(host, port)
        freeze_loaded()
        return self.info()


def _make_actor_class():
    import ray

    # threaded: serve_loop() runs for the group's lifetime while ping()/param_bytes() still answer
    return ray.remote(max_concurrency=4, max_restarts=0)(_ShardProcess)


def __getattr__(name: str):
    """``VerifierShardActor`` is built on first use, so the module imports where Ray is absent (a
    bare GPU box running the shard in-process)."""
    if name == "VerifierShardActor":
        cls = globals()[name] = _make_actor_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
