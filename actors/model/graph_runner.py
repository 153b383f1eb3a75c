"""CUDA graphs for the target's decode and verify steps: the forward replayed, not re-launched.

A step's batch (B sequences, N tokens: decode tokens, draft chains and trees, small prefill
chunks) is padded to a bucket (B_pad, N_pad) and copied into static input buffers sized once;
the forward captured for that bucket is replayed. Padding is inert:

- padded sequences own no query tokens (``query_start_loc`` stays at N) and see no keys;
- padded tokens belong to no sequence and have KV slot -1, which the fused RoPE + KV-write kernel
  skips: they write no KV and their rows are never read by a real row;
- visibility is data: every bucket is captured with the tree-mask path on, a causal sequence has
  window 0, a tree its ancestor mask in the mask buffer (rows indexed by token).

So one graph serves plain decoding, chains and trees of any shape that fits. Batches that fit no
bucket (long prefill chunks, more tokens than the largest bucket) run eagerly. Every capture
shares one memory pool. The LM head stays outside the graph (it runs on the rows that need
logits only). Graphs need the Triton backend with fused ops (``set_attention_backend``: the
torch reference reads lengths on the host) and CUDA; ``PaddedInputs`` alone runs anywhere
(TRITON_INTERPRET=1 on CPU): the tests check the padded forward equals the unpadded one there.

Host work per replay: one pass over the chunks filling pinned host buffers, one host-to-device
copy of the integer metadata (and one of the mask rows when a tree is present).
"""
from __future__ import annotations

import logging
from bisect import bisect_left

import torch

from actors.model.attention_backends import CACHE_KEY
from actors.model.batch import ForwardBatch
from kernels.triton_attention import TreeMasks, choose_num_segments

log = logging.getLogger("specray.graphs")

TOKENS_PER_SEQ = (1, 2, 4, 8, 16, 32, 64)  # query tokens per sequence the buckets are sized for
MAX_GRAPH_TOKENS = 512  # no bucket holds more tokens than this (bigger steps are prefill-like: eager)


def batch_buckets(max_num_seqs: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, then steps of 8 up to 64 and of 16 beyond, ending at max_num_seqs."""
    out = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    b = 16
    while b < max_num_seqs:
        out.append(b)
        b += 8 if b < 64 else 16
    return out + [max_num_seqs]


def bucket_shapes(max_num_seqs: int, max_tokens: int = MAX_GRAPH_TOKENS,
                  tokens_per_seq: tuple[int, ...] = TOKENS_PER_SEQ) -> list[tuple[int, int]]:
    """Every (B_pad, N_pad) captured: each batch bucket times each tokens-per-sequence cap, at most max_tokens."""
    return sorted({(b, b * q) for b in batch_buckets(max_num_seqs) for q in tokens_per_seq if b * q <= max_tokens})


def pick_bucket(shapes: list[tuple[int, int]], num_seqs: int, num_tokens: int) -> tuple[int, int] | None:
    """The smallest (B_pad, N_pad) of ``shapes`` (sorted) holding num_seqs sequences and num_tokens tokens."""
    i = bisect_left(shapes, (num_seqs, num_tokens))
    for b, n in shapes[i:]:
        if b >= num_seqs and n >= num_tokens:
            return b, n
    return None


def field_offsets(max_seqs: int, max_tokens: int, max_blocks: int) -> dict[str, tuple[int, int]]:
    """(start, end) of each int64 metadata field in one flat buffer (one host-to-device copy per step)."""
    sizes = (("qsl", max_seqs + 1), ("kv_lens", max_seqs), ("win", max_seqs), ("row_start", max_seqs),
             ("ids", max_tokens), ("pos", max_tokens), ("slots", max_tokens), ("tables", max_seqs * max_blocks))
    out, at = {}, 0
    for name, n in sizes:
        out[name] = (at, at + n)
        at += n
    return out


class PaddedInputs:
    """Static metadata buffers (device) with pinned host mirrors; ``fill`` writes one step into
    them and returns the bucket's ``ForwardBatch`` of views (the same tensors every step)."""

    def __init__(self, max_seqs: int, max_tokens: int, max_blocks: int, mask_width: int, block_size: int,
                 num_kv_heads: int, device: torch.device):
        self.max_seqs, self.max_blocks = max_seqs, max_blocks
        self.fields = field_offsets(max_seqs, max_tokens, max_blocks)
        size = self.fields["tables"][1]
        self.block_size, self.mask_width, self.num_kv_heads = block_size, mask_width, num_kv_heads
        self.device = torch.device(device)
        pin = self.device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=pin)  # [L]
        self.host_mask = torch.zeros(max_tokens, mask_width, dtype=torch.int8, pin_memory=pin)  # [T, W]
        self.dev = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.dev_mask = torch.zeros(max_tokens, mask_width, dtype=torch.int8, device=self.device)
        self._np = self.host.numpy()
        self._np_mask = self.host_mask.numpy()
        self._copied = torch.cuda.Event() if pin else None  # host buffers are free again once this fires
        self._batches: dict[tuple[int, int], ForwardBatch] = {}

    def fits(self, chunks) -> bool:
        """Every window fits the mask width and every block table the table width."""
        w, m = self.mask_width, self.max_blocks
        return all((c.window_mask is None or c.window_mask.shape[1] <= w) and len(c.block_table) <= m for c in chunks)

    def _view(self, name: str, buf=None) -> torch.Tensor:
        lo, hi = self.fields[name]
        return (self.dev if buf is None else buf)[lo:hi]

    def batch(self, num_seqs: int, num_tokens: int) -> ForwardBatch:
        """The bucket's batch over the device buffers (built once per bucket)."""
        key = (num_seqs, num_tokens)
        if key not in self._batches:
            b, n = key
            qsl, kv = self._view("qsl")[: b + 1], self._view("kv_lens")[:b]
            tables = self._view("tables").view(self.max_seqs, self.max_blocks)[:b]
            tree = TreeMasks(self._view("win")[:b], self._view("row_start")[:b], self.dev_mask[:n])
            context = self.max_blocks * self.block_size  # an upper bound of every kv_len
            segments = choose_num_segments(n, b, self.num_kv_heads, context)
            self._batches[key] = ForwardBatch(
                input_ids=self._view("ids")[:n], positions=self._view("pos")[:n], slot_mapping=self._view("slots")[:n],
                query_start_loc=qsl, kv_lens=kv, block_tables=tables, block_size=self.block_size,
                window_masks=[None] * b, cache={CACHE_KEY: (tree, segments, (qsl, kv, tables))})
        return self._batches[key]

    def fill(self, chunks, num_seqs: int, num_tokens: int) -> ForwardBatch:
        """Write ``chunks`` (verifier SeqChunks) padded to (num_seqs, num_tokens) into the buffers."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copy has read the host buffers
        f, h, mask = self.fields, self._np, self._np_mask
        n = sum(len(c.token_ids) for c in chunks)
        qsl, trees = [0], False
        for b, c in enumerate(chunks):
            q0, q = qsl[-1], len(c.token_ids)
            lo = f["ids"][0] + q0
            h[lo: lo + q] = c.token_ids
            lo = f["pos"][0] + q0
            h[lo: lo + q] = c.positions
            lo = f["slots"][0] + q0
            h[lo: lo + q] = c.slots
            lo = f["tables"][0] + b * self.max_blocks
            h[lo: lo + len(c.block_table)] = c.block_table
            h[f["kv_lens"][0] + b] = c.kv_len
            w = 0 if c.window_mask is None else c.window_mask.shape[1]
            h[f["win"][0] + b] = w
            h[f["row_start"][0] + b] = q0
            if w:
                mask[q0: q0 + q, :w] = c.window_mask.numpy()
                trees = True
            qsl.append(q0 + q)
        b = len(chunks)
        h[f["qsl"][0]: f["qsl"][0] + b + 1] = qsl
        h[f["qsl"][0] + b + 1: f["qsl"][0] + num_seqs + 1] = n  # padded sequences: no queries
        h[f["kv_lens"][0] + b: f["kv_lens"][0] + num_seqs] = 0
        h[f["win"][0] + b: f["win"][0] + num_seqs] = 0
        pad = slice(n, num_tokens)
        for name in ("ids", "pos"):
            h[f[name][0] + pad.start: f[name][0] + pad.stop] = 0
        h[f["slots"][0] + pad.start: f["slots"][0] + pad.stop] = -1  # padded tokens write no KV
        self.dev.copy_(self.host, non_blocking=True)
        if trees:
            self.dev_mask[:n].copy_(self.host_mask[:n], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        return self.batch(num_seqs, num_tokens)


class GraphRunner:
    """Captures ``forward(batch) -> Tensor`` (a ForwardBatch over the static inputs) for every bucket
    of ``bucket_shapes`` and replays it. ``run(chunks)`` -> the forward's static output (read or copy
    it before the next run), or None when the batch fits no bucket (the caller runs it eagerly)."""

    def __init__(self, forward, device: torch.device, num_kv_heads: int, block_size: int, max_num_seqs: int,
                 max_model_len: int, max_tokens: int = MAX_GRAPH_TOKENS, capture: bool = True):
        """capture=False: the same padded inputs run eagerly (CPU tests, debugging)."""
        self.forward = forward
        self.shapes = bucket_shapes(max_num_seqs, max_tokens)
        max_blocks = -(-max_model_len // block_size)
        self.inputs = PaddedInputs(max_num_seqs, max(n for _, n in self.shapes), max_blocks,
                                   max(TOKENS_PER_SEQ), block_size, num_kv_heads, device)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # forwards replayed; run padded but eagerly (not captured); left to the caller (no bucket fits)
        self.num_replays = self.num_eager = self.num_fallbacks = 0
        if capture:
            self._capture_all()

    def bucket(self, chunks) -> tuple[int, int] | None:
        if not self.inputs.fits(chunks):
            return None
        return pick_bucket(self.shapes, len(chunks), sum(len(c.token_ids) for c in chunks))

    def before_replay(self, num_tokens: int) -> None:
        """Per-step inputs beyond the batch's metadata (a subclass copies them into static buffers)."""

    @torch.inference_mode()
    def run(self, chunks) -> torch.Tensor | None:
        key = self.bucket(chunks)
        if key is None:
            self.num_fallbacks += 1
            return None
        batch = self.inputs.fill(chunks, *key)
        self.before_replay(sum(len(c.token_ids) for c in chunks))
        graph = self.graphs.get(key)
        if graph is None:  # not captured (capture=False): the padded forward, eagerly
            self.num_eager += 1
            return self.forward(batch)
        graph[0].replay()
        self.num_replays += 1
        return graph[1]

    def _dummy(self, num_seqs: int, num_tokens: int) -> list:
        """A batch of this bucket's shape that writes no KV (slots -1) with tree masks on."""
        from actors.verifier import SeqChunk

        q, extra = divmod(num_tokens, num_seqs)
        out = []
        for b in range(num_seqs):
            n = q + (extra if b == num_seqs - 1 else 0)
            mask = torch.ones(n, n, dtype=torch.bool).tril() if n <= self.inputs.mask_width else None
            out.append(SeqChunk([0] * n, list(range(n)), [-1] * n, n, [0] * -(-n // self.inputs.block_size), mask))
        return out

    @torch.inference_mode()
    def _capture_all(self) -> None:
        import time

        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for key in sorted(self.shapes, reverse=True):  # largest first: later captures reuse its pool blocks
            batch = self.inputs.fill(self._dummy(*key), *key)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.forward(batch)  # warm-up: compiles the Triton kernels of this shape
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.forward(batch)
            self.graphs[key] = (graph, out)
        torch.cuda.synchronize()
        log.info("%s: captured %d CUDA graphs in %.1f s", type(self).__name__, len(self.graphs),
                 time.perf_counter() - t0)


class CudaGraphRunner(GraphRunner):
    """The target's forward: ``run(chunks)`` -> the final-normed hidden states [N_pad, H]."""

    def __init__(self, model: torch.nn.Module, kv_caches: list, block_size: int, max_num_seqs: int,
                 max_model_len: int, max_tokens: int = MAX_GRAPH_TOKENS, capture: bool = True):
        self.model, self.kv_caches = model, kv_caches
        super().__init__(lambda batch: model(batch, kv_caches), kv_caches[0][0].device, model.num_kv_heads_per_rank,
                         block_size, max_num_seqs, max_model_len, max_tokens, capture)
