"""EagleProposer: drafts chains with the EAGLE head from the target's own features.

The engine hands over the features of every committed position (``observe``; prefill chunks and
each step's root + accepted nodes). ``propose`` first feeds each sequence's newly committed
entries (x_{t+1}, f_t) into its head cache (catch-up); the last of them already predicts the first
draft token, and every further depth feeds (drafted token, predicted feature) back in. One batched
head forward per depth for every sequence, its K/V in one paged pool read through the target's
attention backend (actors/proposers/head_kv.py), replayed as a CUDA graph where the target's are.

An expansion wider than 1 at some depth adds the top-w (greedy) or w sampled tokens as siblings
and continues the chain from the first. Greedy requests get deterministic drafts; unseeded sampled
ones get distinct draws from the head's distribution q (over the draft vocabulary, 0 elsewhere),
each recorded with the q it was drawn from, as multi-step speculative sampling needs (the engine
gives them ``sampled_siblings`` draws at the first depth); seeded ones get the winners of that
position's race under q (the race the target's token is drawn with, actors/sampling.py), which
match the target's token more often than independent draws. Verification stays lossless either way.
"""
from __future__ import annotations

from time import perf_counter

import numpy as np
import torch

from actors.model.attention import paged_attention
from actors.model.batch import rows_of
from actors.model.graph_runner import TOKENS_PER_SEQ
from actors.proposers.base import DraftRequest, Proposer
from actors.proposers.dynamic_tree import DraftPool
from actors.proposers.head_kv import HeadGraphRunner, HeadKVPool, HeadScores, head_step, scored_rows
from actors.eagle.head import EagleHead
from actors.sampling import params_probs, race_top_among, sample, sample_distinct
from actors.tree import SubsetProposal, TokenTree
from actors.verifier import SeqChunk, build_forward_batch


class _SeqState:
    """One sequence's head entries: cache indices [0, fed) hold positions [base, base + fed);
    ``pending`` holds the features not yet fed. The K/V live in the proposer's HeadKVPool."""

    __slots__ = ("base", "fed", "pending", "num_pending")

    def __init__(self, base: int):
        self.base, self.fed = base, 0
        self.pending: list[torch.Tensor] = []  # [n_i, H] features of positions base + fed ...
        self.num_pending = 0  # their rows (summing len() over a long backlog per step cost ~0.1 ms)

    def add(self, features: torch.Tensor) -> None:
        self.pending.append(features)
        self.num_pending += features.shape[0]

    def fed_pending(self) -> None:
        """Every pending entry is now in the head's cache."""
        self.fed, self.pending, self.num_pending = self.fed + self.num_pending, [], 0

    @property
    def next_pos(self) -> int:
        return self.base + self.fed + self.num_pending


class EagleProposer(Proposer):
    name = "eagle"
    needs_hidden = True  # the engine must call observe() with the target's features

    def __init__(self, head: EagleHead, tree_width: int = 1, sampled_siblings: int | None = None):
        """tree_width > 1: greedy and seeded requests get a dynamic tree (actors/proposers/dynamic_tree.py)
        keeping that many candidates per depth, of at most the request's max_nodes nodes (the
        engine's W x depth, or its tree_nodes cap); unseeded sampled ones ``sampled_siblings`` distinct
        draws at their chain's first depth (None: tree_width)."""
        if tree_width < 1:
            raise ValueError(f"tree_width={tree_width}: must be at least 1")
        siblings = tree_width if sampled_siblings is None else sampled_siblings
        if not 1 <= siblings <= tree_width:
            raise ValueError(f"sampled_siblings={sampled_siblings}: must be between 1 and tree_width ({tree_width})")
        self.head, self.tree_width, self.siblings = head, tree_width, siblings
        c = head.cfg
        self.dtype, self.device = head.fc.weight.dtype, head.fc.weight.device
        self.states: dict[int, _SeqState] = {}
        self.kv = HeadKVPool(c.num_kv_heads, c.head_dim, self.dtype, self.device)
        self.attend = paged_attention  # the target's attention backend (build_eagle_proposer sets it)
        self.graphs: HeadGraphRunner | None = None  # CUDA graphs of the head's step (use_graphs)

    def use_graphs(self, max_num_seqs: int, max_model_len: int, capture: bool = True) -> None:
        """Run the head's steps as CUDA graphs (capture=False: their padded inputs, eagerly): a fixed
        pool for max_num_seqs sequences of max_model_len positions plus a draft's nodes. Needs the
        Triton backend's attention and fused RoPE + KV write (padded rows write no KV)."""
        if self.states:
            raise RuntimeError("use_graphs() before any sequence is observed: it replaces the head's KV pool")
        if self.head.rope_write_kv is None:
            raise ValueError("head CUDA graphs need the fused RoPE + KV write of the triton attention backend")
        entries = max_model_len + max(TOKENS_PER_SEQ)
        c, bs = self.head.cfg, self.kv.block_size
        self.kv = HeadKVPool(c.num_kv_heads, c.head_dim, self.dtype, self.device, bs,
                             num_blocks=max_num_seqs * -(-entries // bs), growable=False)
        self.graphs = HeadGraphRunner(self.head, self.kv, self.attend, max_num_seqs, entries, capture,
                                      top_k=self.tree_width)

    # ---- features from the engine --------------------------------------------------------------
    def observe(self, seq_id: int, start: int, features: torch.Tensor) -> None:
        """features [n, H]: the target's final-normed hidden states of positions start .. start+n-1."""
        st = self.states.get(seq_id)
        if st is None or start != st.next_pos:  # new sequence, or a gap (prefix-cache hit, recompute)
            st = self.states[seq_id] = _SeqState(start)  # its head blocks (if any) are reused from index 0
        st.add(features.to(self.dtype))

    def release(self, seq_id: int) -> None:
        self.states.pop(seq_id, None)
        self.kv.release(seq_id)

    # ---- drafting ------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, reqs: list[DraftRequest]) -> list[TokenTree]:
        trees = [TokenTree.root(r.token_ids[-1]) for r in reqs]
        live = [i for i, r in enumerate(reqs) if self._ready(r)]
        self.catch_up_s, self.catch_up_entries = 0.0, 0
        if not live:
            return trees
        # the top-k each step's scores keep: the widest any depth takes
        self.top_k = max([self.tree_width] + [max(reqs[i].expansion) for i in live])
        self.catch_up_entries = sum(self.states[reqs[i].seq_id].num_pending for i in live)
        t0 = perf_counter()
        feats, scores, idx = self._catch_up([reqs[i] for i in live])  # f̂ [B, H] after the last committed entry
        self.catch_up_s = perf_counter() - t0
        dyn = [j for j, i in enumerate(live) if self.grows_tree(reqs[i])]
        if dyn:
            grown = self._grow_trees([reqs[live[j]] for j in dyn], rows_of(feats, dyn), scores.take(dyn),
                                     [idx[j] for j in dyn])
            for j, tree in zip(dyn, grown):
                trees[live[j]] = tree
            keep = [j for j in range(len(live)) if j not in set(dyn)]
            if not keep:
                return trees
            live, idx = [live[j] for j in keep], [idx[j] for j in keep]
            feats, scores = rows_of(feats, keep), scores.take(keep)
        tips = [0] * len(live)
        depth = 0
        while True:
            toks = self._choose(scores, [reqs[i] for i in live], depth, trees, live, tips)
            depth += 1
            go = [j for j, i in enumerate(live) if depth < len(reqs[i].expansion)]
            if not go:
                return trees
            live, idx, tips = [live[j] for j in go], [idx[j] for j in go], [tips[j] for j in go]
            feats, scores = self._draft_step([toks[j] for j in go], rows_of(feats, go), [reqs[i] for i in live], idx)
            idx = [a + 1 for a in idx]

    def _ready(self, r: DraftRequest) -> bool:
        st = self.states.get(r.seq_id)
        return bool(r.expansion) and st is not None and st.next_pos == r.root_position and bool(st.pending)

    def _catch_up(self, reqs: list[DraftRequest]) -> tuple[torch.Tensor, HeadScores, list[int]]:
        """Feed every pending (x_{t+1}, f_t) entry; returns f̂ of each sequence's last entry [B, H],
        the head's scores of it and the cache index where each sequence's first speculative entry goes."""
        toks, feats, pos, sizes = [], [], [], []
        for r in reqs:
            st = self.states[r.seq_id]
            f = torch.cat(st.pending) if len(st.pending) > 1 else st.pending[0]
            start = st.base + st.fed
            toks += r.token_ids[start + 1: start + 1 + len(f)]
            feats.append(f)
            pos += range(start, start + len(f))
            sizes.append(len(f))
        last = (np.cumsum(sizes) - 1).tolist()
        out, scores = self._block(toks, torch.cat(feats), pos, reqs, sizes, committed=True, score=last)
        return out, scores, [self.states[r.seq_id].fed for r in reqs]

    def _draft_step(self, toks: list[int], feats: torch.Tensor, reqs: list[DraftRequest],
                    idx: list[int]) -> tuple[torch.Tensor, HeadScores]:
        """One speculative entry per sequence at cache index idx (not committed) -> f̂ [B, H], its scores."""
        pos = [self.states[r.seq_id].base + i for r, i in zip(reqs, idx)]
        return self._block(toks, feats, pos, reqs, [1] * len(reqs), committed=False, at=idx)

    def _block(self, toks: list[int], feats: torch.Tensor, pos: list[int], reqs, sizes, committed: bool,
               at: list[int] | None = None, windows: list | None = None,
               score: list[int] | None = None) -> tuple[torch.Tensor, HeadScores]:
        """One head forward over every sequence's new entries, tokens ``toks`` at RoPE positions
        ``pos`` with feats [N, H]; sequence j's ``sizes[j]`` entries go at cache indices from its
        ``fed`` (committed) or ``at[j]``; ``windows[j]`` [n_j, w] bool: which of the last w entries
        each one sees (None: causal). One attention call for the batch, through the pool's block
        tables, replayed as a CUDA graph where one is captured -> f̂ of the rows ``score`` (None: all)
        [R, H] and the head's scores of them (its top ``self.top_k``)."""
        chunks, o = [], 0
        for j, (r, n) in enumerate(zip(reqs, sizes)):
            st = self.states[r.seq_id]
            where = st.fed if at is None else at[j]
            table = self.kv.reserve(r.seq_id, where + n)
            chunks.append(SeqChunk(toks[o: o + n], pos[o: o + n], self.kv.slots(r.seq_id, where, n), where + n,
                                   table, None if windows is None else windows[j]))
            o += n
            if committed:  # n: every pending entry (_catch_up)
                st.fed_pending()
        score = list(range(o)) if score is None else score
        out = None if self.graphs is None else self.graphs.run(chunks, feats)
        if out is not None and self.top_k <= self.graphs.top_k:  # scored in the graph too
            return self.graphs.scored(out, o, score, self.top_k)
        if out is not None:  # the graph's static output: this step's rows, kept past the next replay
            return scored_rows(self.head, out[0][:o].clone(), score, self.top_k)
        batch = build_forward_batch(chunks, self.kv.block_size, self.device)
        return head_step(self.head, batch, feats, self.kv, self.attend, score, self.top_k)

    def _choose(self, scores: HeadScores, reqs, depth, trees, live, tips) -> list[int]:
        """Add depth+1's nodes under each chain tip from the head's ``scores`` of it; returns the
        token each chain continues with."""
        logits, vocab = scores.logits, self.head.draft_vocab  # [B, Vd]
        nxt = []
        for j, (i, r) in enumerate(zip(live, reqs)):
            width, tree = r.expansion[depth], trees[i]
            if r.params.greedy:
                picks = scores.ids[j][:width]
                nodes = [tree.add(tips[j], t) for t in picks]
            elif r.params.seed is None:  # draws from q, siblings distinct: multi-step speculative sampling
                p = r.params
                q_small = params_probs(logits[j], p)
                if width == 1:  # one draw: q's CDF at one uniform
                    rows, proposals = [sample(q_small, r.generator)], q_small[None]
                else:
                    rows, proposals = sample_distinct(q_small, width, r.generator)
                    rows = rows.tolist()
                picks = vocab[rows].tolist()
                nodes = [tree.add(tips[j], t, SubsetProposal(q, vocab, float(q[row])))
                         for t, q, row in zip(picks, proposals, rows)]
            else:  # seeded: the target picks argmax(p / E) with this position's race; guess its top-width
                p = r.params  # (keyed verification reads no q, so none is stored)
                q_small = params_probs(logits[j], p)
                rows = race_top_among(q_small, vocab, self.head.cfg.target_vocab_size, p.seed,
                                      r.root_position + depth + 1, width)
                picks = vocab[rows].tolist()
                nodes = [tree.add(tips[j], t) for t in picks]
            tips[j] = nodes[0]
            nxt.append(picks[0])
        return nxt

    # ---- dynamic trees ---------------------------------------------------------------------------
    def grows_tree(self, r: DraftRequest) -> bool:
        """Dynamic tree for this request: a width > 1, a budget beyond a chain, and drafts the
        target checks deterministically (greedy, or seeded: the race decides, q plays no part)."""
        return (self.tree_width > 1 and r.max_nodes > len(r.expansion) and all(w == 1 for w in r.expansion)
                and r.params.deterministic)

    def nodes_per_depth(self, source: str | None) -> int:
        return self.tree_width if source == self.name else 1

    def sampled_siblings(self, source: str | None) -> int:
        """Unseeded sampled requests cannot take a dynamic tree (its top-w picks are not draws
        from q); their chain gets distinct draws at the first depth instead."""
        return self.siblings if source == self.name else 1

    def _grow_trees(self, reqs: list[DraftRequest], feats: torch.Tensor, scores: HeadScores,
                    idx: list[int]) -> list[TokenTree]:
        """feats [B, H]: f̂ after each request's last committed entry, ``scores`` the head's of them;
        idx: the cache index of its first speculative entry. One batched head forward per depth over
        every frontier node."""
        w = self.tree_width
        pools = [DraftPool(r.token_ids[-1]) for r in reqs]
        rows = [(j, -1) for j in range(len(reqs))]  # (request, pool node whose children the row scores)
        entry = [dict() for _ in reqs]  # pool node -> its head entry's cache index
        nxt = list(idx)
        for depth in range(max(len(r.expansion) for r in reqs)):
            added = [[] for _ in reqs]
            for (j, parent), cands in zip(rows, self._candidates(scores, rows, reqs, depth)):
                added[j] += [pools[j].add(parent, tok, lp) for tok, lp in cands]
            grow = [j for j, r in enumerate(reqs) if depth + 1 < len(r.expansion)]
            front = [(j, c) for j in grow for c in pools[j].best(added[j], w, reqs[j].min_score)]
            if not front:
                break
            src = {row: i for i, row in enumerate(rows)}
            feats, scores = self._tree_step(front, rows_of(feats, [src[(j, pools[j].parents[c])] for j, c in front]),
                                            pools, reqs, idx, entry, nxt)
            rows = front
        return [p.to_tree(r.max_nodes, r.min_score) for p, r in zip(pools, reqs)]

    def _candidates(self, scores: HeadScores, rows, reqs, depth) -> list[list[tuple[int, float]]]:
        """Per row: the ``tree_width`` best next tokens and their draft log-probabilities."""
        logits, vocab, w = scores.logits, self.head.draft_vocab, self.tree_width  # [R, Vd]
        out = []
        for row, (j, _) in enumerate(rows):
            r = reqs[j]
            if r.params.greedy:
                out.append(list(zip(scores.ids[row][:w], scores.logprobs[row][:w])))
                continue
            p = r.params
            q_small = params_probs(logits[row], p)
            picks = race_top_among(q_small, vocab, self.head.cfg.target_vocab_size, p.seed,
                                   r.root_position + depth + 1, w)
            out.append(list(zip(vocab[picks].tolist(), q_small[picks].clamp_min(1e-30).log().tolist())))
        return out

    def _tree_step(self, front, feats, pools, reqs, idx, entry, nxt) -> tuple[torch.Tensor, HeadScores]:
        """Head entries for the frontier nodes ``front`` [(request, pool node)] from their parents'
        feats [R, H]; each attends to its request's context, its ancestors and itself -> f̂ [R, H] and
        the head's scores of each."""
        toks = [pools[j].tokens[c] for j, c in front]
        pos = [reqs[j].root_position + pools[j].depths[c] - 1 for j, c in front]
        order = list(dict.fromkeys(j for j, _ in front))  # front lists each request's nodes together, in order
        sizes, at, windows = [], [], []
        for j in order:
            rows = [i for i, (jj, _) in enumerate(front) if jj == j]
            start, n = nxt[j], len(rows)
            visible = np.zeros((n, start + n - idx[j]), dtype=bool)  # over entries [idx, start + n): the tree so far
            for i, row in enumerate(rows):
                c = front[row][1]
                entry[j][c] = start + i
                anc = pools[j].parents[c]
                while anc >= 0:
                    visible[i, entry[j][anc] - idx[j]] = True
                    anc = pools[j].parents[anc]
                visible[i, start + i - idx[j]] = True
            sizes.append(n)
            at.append(start)
            windows.append(torch.from_numpy(visible))
            nxt[j] = start + n
        return self._block(toks, feats, pos, [reqs[j] for j in order], sizes, committed=False, at=at,
                           windows=windows)


def build_eagle_proposer(head_path: str | None, model: str, verifier, tree_width: int = 1,
                         sampled_siblings: int | None = None) -> EagleProposer:
    """The proposer for ``--draft default`` (head_path None: the head committed for ``model``) or
    ``--draft eagle:PATH``. Needs the in-process verifier: the head reads the target's features.
    sampled_siblings None: tree_width (SpeculativeConfig.for_device sets it for the device)."""
    from actors.eagle.head import DEFAULT_HEADS, load_head
    from actors.model.attention_backends import backend_runs, uses_native
    from actors.verifier import Verifier

    if head_path is None:
        if model not in DEFAULT_HEADS:
            raise ValueError(f"--draft default: no EAGLE head is committed for model {model!r} (only for "
                             f"{sorted(DEFAULT_HEADS)}); train one with `python -m training.train --model "
                             f"{model} --out DIR` and pass --draft eagle:DIR/head.safetensors")
        head_path = str(DEFAULT_HEADS[model])
    if not isinstance(verifier, Verifier) or verifier.model.tp.size != 1:
        raise ValueError("--draft default / eagle:PATH / default:PATH needs the in-process verifier (the head reads the target's "
                         "hidden states); the Ray tensor-parallel verifier (--ray) does not support it yet: "
                         "use --draft ngram or layerskip:N with --ray")
    target = verifier.model
    # The head is memory-bound at batch 1: its matrices are read in bf16 whatever the target's dtype.
    # With the native CPU kernels the head computes in fp32 over Q8_0 blocks of its matrices (3.8x
    # fewer bytes than fp32; on the 2-core VM of 2026-11-27 a K=5 chain propose 4.7 -> 4.0 ms with
    # bf16 -> Q8_0 and the layer as one op, the same accepted lengths on 10 bench prompts) and runs
    # the target's fused kernels; elsewhere it is a bf16 model (oneDNN's bf16 products, torch attention).
    native = uses_native(target)
    head = load_head(head_path, dtype=torch.float32 if native else torch.bfloat16).to(verifier.device)
    head.attach(target, f"target {model!r}")
    if native:
        from kernels import cpu_native

        head.store_matrices("Q8_0")
        head.norm, head.act = cpu_native.rmsnorm, cpu_native.silu_and_mul
        head.native_layer = True
    proposer = EagleProposer(head, tree_width, sampled_siblings)
    attn = next((m for m in target.modules() if hasattr(m, "rope_write_kv")), None)
    if attn is not None and backend_runs(attn.attend, proposer.dtype):
        # the head runs the target's attention backend (and its fused RoPE + KV write)
        proposer.attend, head.rope_write_kv = attn.attend, attn.rope_write_kv
    if verifier.graphs is not None:  # the target replays graphs: so does the head
        inputs = verifier.graphs.inputs
        proposer.use_graphs(inputs.max_seqs, inputs.max_blocks * inputs.block_size)
    return proposer
