"""The in-process engine: add_request / step / abort, one target forward per step.

step(): schedule (the draft planner reserves draft slots) -> draft token trees (cluster/drafting.py)
-> one forward over every prefill chunk, decode token and tree node -> verify (greedy longest
match or multi-step speculative sampling) -> commit: move accepted K/V to logical positions,
release the rest -> detokenize, check stops, emit deltas.
"""
from __future__ import annotations

import logging
import os
from time import perf_counter as _now

import torch

from actors.hidden_states import record_hidden_states
from actors.kv_service import KVService, KVServiceLost
from actors.logprobs import prompt_logprob_rows, record_logprobs, record_prompt_logprobs
from actors.model.attention_backends import set_attention_backend
from actors.proposers.base import Proposer, ProposerContext
from actors.sampling import sample_next
from actors.sampling_params import SamplingParams
from actors.scheduler import BatchScheduler, ScheduledSeq
from actors.sequence import Sequence
from actors.spec_policy import SpecPolicy
from actors.structured_output import GrammarCompiler
from actors.tree import TokenTree
from actors.verifier import SeqChunk
from cluster.config import EngineConfig
from cluster.drafting import DraftPlanner
from cluster.metrics import EngineMetrics
from cluster.outputs import Detokenizer, RequestOutput, make_output
from cluster.prompts import PromptEncoder, eos_ids
from cluster.proposers import build_proposer
from cluster.runtime import (kv_blocks_for, kv_cache_dtype_for, kv_tiers_for, load_target, local_verifier,
                             resolve_device_dtype, swap_policy_for)
from cluster.shared_kv import attach_shared_kv
from cluster.step_clock import StepClock
from cluster.verification import processed_logits, step_argmax, tree_of, verify_tree

log = logging.getLogger("specray.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded=None, draft_loaded=None, verifier=None, kv=None,
                 proposer: Proposer | None = None, metrics: EngineMetrics | None = None,
                 spec_policy: SpecPolicy | None = None):
        """loaded: a LoadedModel to reuse (tests load once per session); verifier: a backend with
        Verifier's interface (e.g. a Ray tensor-parallel shard group), else a local Verifier;
        kv: a KV service client (e.g. the replica's allocator actor), else a local KVService;
        proposer: e.g. drafter worker actors, else built from config.speculative;
        metrics: where this engine's Prometheus metrics go (default: a registry of its own);
        spec_policy: an adaptive policy to go on learning in (a benchmark's engines share one, as
        the requests of a long-lived server share its engine's), else a fresh one."""
        self.config = config
        self.device, self.dtype = resolve_device_dtype(config.device, config.dtype)
        if self.device.type == "cpu":
            torch.set_num_threads(config.num_threads or os.cpu_count() or 1)
        loaded = loaded or load_target(config, self.device, self.dtype)
        if verifier is None:  # set on every engine: tests share one loaded model between engines
            set_attention_backend(loaded.model, config.attention_backend, self.device)
        if loaded.tokenizer is None:
            raise ValueError(f"model {config.model!r} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
        self.loaded = loaded
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.prompts = PromptEncoder(loaded.tokenizer)
        spec = config.speculative.for_device(self.device.type)  # the draft shape left unset, for this device
        kv_dtype = kv_cache_dtype_for(config, self.dtype, loaded.model, verifier)
        num_blocks, self.max_model_len = kv_blocks_for(config, loaded.config, kv_dtype, spec.max_nodes)
        num_host, disk = kv_tiers_for(config, loaded.config, kv_dtype, verifier is not None, kv is not None)
        self.verifier = verifier or local_verifier(config, loaded.model, self.device, kv_dtype, num_blocks,
                                                   self.max_model_len, num_host, disk)
        if num_host and getattr(self.verifier, "host_pool", None) is None:
            raise ValueError(f"kv_offload (a host tier of {num_host} blocks) needs the in-process verifier; "
                             "this verifier backend has no host tier yet (turn --kv-host-gb off)")
        if self.verifier.num_blocks != num_blocks or self.verifier.block_size != config.block_size:
            raise ValueError(f"verifier KV cache ({self.verifier.num_blocks} blocks of {self.verifier.block_size}) "
                             f"does not match the engine's ({num_blocks} of {config.block_size})")
        self.kv = kv or KVService(num_blocks, config.block_size, config.enable_prefix_caching, num_host,
                                  self.verifier.host_pool.block_bytes if num_host else 0,
                                  disk.num_blocks if disk is not None else 0)
        self.swap = swap_policy_for(config, num_host, self.verifier)  # None: preemption recomputes
        if self.swap is not None:  # a host tier: the KV service is this in-process one
            self.kv.swap = self.swap
        self.scheduler = BatchScheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                        config.block_size)
        if proposer is None and spec.enabled:
            proposer = build_proposer(spec, self.proposer_context(), draft_loaded)
        # per step, per sequence: how deep to draft (0 = plain decoding), from measured costs
        policy = (spec_policy or SpecPolicy(len(spec.expansion))) if proposer is not None and spec.adaptive else None
        self.drafting = DraftPlanner(spec, proposer, policy, self.scheduler, self.max_model_len)
        self.metrics = metrics or EngineMetrics()
        self.metrics.watch(self.scheduler, self.kv, self.drafting.max_depth, self.drafting.guard)
        self.metrics.watch_graphs(target=self.verifier, draft_head=proposer)
        if num_host:
            self.metrics.watch_kv_copies(self.verifier.kv_copy_stats)
        if getattr(self.verifier, "weight_offload", None) is not None:
            self.metrics.watch_weight_offload(self.verifier.weight_offload.stats)
        self.shared_kv = attach_shared_kv(self) if config.kv_tier.enabled else None  # across replicas
        self.detok = Detokenizer(self.tokenizer)
        self.eos_ids = eos_ids(loaded.config, self.tokenizer)
        self.grammars = GrammarCompiler(self.tokenizer, loaded.config.vocab_size, self.eos_ids)  # structured output
        self.seqs: dict[str, Sequence] = {}
        self.num_verifier_restarts, self.max_verifier_restarts = 0, 3
        self.clock = StepClock()  # host seconds per step phase (benchmarks.host_profile)
        self.overlap = None
        if config.draft_overlap_micro_batches > 1 and proposer is not None:
            self.set_draft_overlap(config.draft_overlap_micro_batches)

    def proposer_context(self) -> ProposerContext:
        """What a proposer may use of this engine's target (built before the proposer)."""
        return ProposerContext(self.config.model, self.verifier, self.tokenizer, self.device, self.dtype,
                               self.config.block_size, self.config.attention_backend, self.config.enforce_eager)

    def set_draft_overlap(self, num_micro_batches: int | None):
        """Verify each step in ``num_micro_batches`` parts whose drafts overlap (cluster/overlap.py;
        1 = one part, timed the same way; None = the plain step). Returns the stepper (its timings)."""
        from cluster.overlap import OverlapStepper

        self.overlap = None if num_micro_batches is None else OverlapStepper(self, num_micro_batches)
        return self.overlap

    @property
    def proposer(self) -> Proposer | None:
        return self.drafting.proposer

    @property
    def spec_policy(self) -> SpecPolicy | None:
        return self.drafting.policy

    @property
    def num_proposer_failures(self) -> int:
        return self.drafting.num_failures

    @property
    def allocator(self):
        """The local KVBlockAllocator when the KV service is in-process (tests, figures)."""
        return getattr(self.kv, "allocator", None)

    # ---- requests ---------------------------------------------------------------------
    def add_request(self, request_id: str, prompt, params: SamplingParams | None = None,
                    chat: bool = False, fit_max_tokens: bool = False) -> Sequence:
        """prompt: text, chat messages (list of {role, content}) or token ids. Generation stops at
        max_tokens or where the context ends; ``fit_max_tokens``: refuse (ValueError naming the
        numbers) a prompt that leaves less than max_tokens of the context, as OpenAI does for a
        request that names max_tokens."""
        params = params or SamplingParams()
        if request_id in self.seqs:
            raise ValueError(f"request_id {request_id!r} is already in use")
        ids = self.prompts.encode(prompt, chat)
        self.prompts.check_length(ids, self.max_model_len, self.model_config.vocab_size,
                                  params.max_tokens if fit_max_tokens else None)
        params = self.prompts.encode_prediction(params, self.max_model_len)
        self.prompts.check_params(params, self.model_config.vocab_size)
        if params.return_hidden_states and not hasattr(self.verifier, "forward_logits_and_hidden"):
            raise ValueError(f"return_hidden_states: the verifier {type(self.verifier).__name__} returns no hidden "
                             "states (it needs the in-process verifier)")
        grammar = self.prompts.grammar_state(self.grammars, params)
        seq = Sequence(request_id, ids, params)
        seq.grammar = grammar
        self.seqs[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self.seqs.get(request_id)
        if seq is None:
            return None
        return self._finish_now(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def on_idle(self) -> None:
        """Nothing left to run: let a remote proposer release what finished sequences hold."""
        self.drafting.on_idle()

    def shutdown(self) -> None:
        """Stop what the engine started besides itself (drafter worker actors, the disk KV tier's
        file and directory lock)."""
        if self.proposer is not None:
            self.proposer.shutdown()
        close_tiers = getattr(self.verifier, "close_kv_tiers", None)
        if close_tiers is not None:
            close_tiers()

    # ---- one step ---------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """schedule -> draft -> one target forward -> verify -> commit -> emit the sequences that moved."""
        self.clock.start()
        self.drafting.begin_step()
        if self.shared_kv is not None:  # local misses of the sequences about to be admitted, fetched
            room = self.config.max_num_seqs - self.scheduler.num_running
            self.shared_kv.before_schedule(self.scheduler.waiting, room)
        try:
            sched = self.scheduler.schedule(self.drafting.budgets(self.scheduler.running))
        except KVServiceLost:  # a fresh, empty KV service: every running request recomputes
            log.warning("KV service lost; re-queueing %d running requests", self.scheduler.num_running)
            self._requeue_all()
            return []
        for seq in sched.preempted:  # swapped ones keep their drafting state: their KV comes back
            self.drafting.release(seq)
        if sched.copies:  # KV tier moves (evictions, hits, swaps), before any forward
            self.verifier.apply_block_copies(sched.copies)
        self.clock.lap("schedule")
        if not sched.scheduled:
            return []
        if self.shared_kv is not None:
            self.shared_kv.after_schedule(sched.scheduled, self.scheduler.block_tables)
        prev = {s.seq.seq_id: s.seq.num_output_tokens for s in sched.scheduled}
        if self.overlap is not None:  # drafts of one micro-batch overlap verification of another
            done = self.overlap.verify_in_flight(sched.scheduled)
        else:
            trees, draft_s = self.drafting.propose(sched.scheduled)
            self.clock.lap("draft")
            done = self.verify_part(sched.scheduled, trees, draft_s)
        if not done:  # the verifier was restarted and every running request re-queued
            return []
        if self.shared_kv is not None:  # write-through: the prompt blocks this step computed
            self.shared_kv.publish(sched.scheduled)
        outs = [self._emit(s.seq, prev[s.seq.seq_id]) for s in sched.scheduled
                if s.seq.num_output_tokens > prev[s.seq.seq_id] or s.seq.is_finished]
        self.clock.lap("emit")
        self.clock.steps += 1
        return outs

    def verify_part(self, part: list[ScheduledSeq], trees: dict[int, TokenTree], draft_s: float | None) -> bool:
        """One target forward over ``part`` (all or a micro-batch of the step) with its draft trees,
        verification, commit and what drafting learns from it; ``draft_s``: what drafting cost.
        A failed forward re-queues everything on a restarted verifier (returns False), else finishes
        ``part``'s requests with a clear error."""
        t1 = _now()
        drafted = self.drafting.drafted_sources(part, trees)  # before tokens are appended
        chunks, rows, spans = self._plan_forward(part, trees)
        prompt_rows, prompt_wants = prompt_logprob_rows(part, chunks)
        recording = any(s.seq.hidden_states is not None for s in part)
        self.clock.lap("plan")
        try:
            logits, hidden = self._forward(chunks, rows + prompt_rows, recording)
        except Exception as e:  # nothing lost: re-queue on a restarted verifier, else a clear error
            log.exception("target forward failed")
            if self._restart_verifier():
                return False
            for s in part:
                self._finish_now(s.seq, "error", f"target forward failed: {e}")
            return True
        self.clock.lap("forward")
        computed = {s.seq.seq_id: s.seq.num_computed for s in part}
        if prompt_rows:
            logits = record_prompt_logprobs(prompt_wants, logits, len(rows))
        self._verify_and_commit(part, trees, spans, logits)
        self.clock.lap("verify")
        if hidden is not None:
            if recording:
                record_hidden_states(part, chunks, trees, computed, hidden)
            if self.drafting.needs_hidden:
                self.drafting.observe_features(part, chunks, trees, computed, hidden)
        verify_s = _now() - t1
        if self.swap is not None and not any(s.is_decode for s in part):  # what prefill costs
            self.swap.observe_prefill(sum(s.num_query for s in part), verify_s)
        step = self.drafting.measure(part, trees, computed, (draft_s or 0.0) + verify_s)
        self.metrics.observe_step(draft_s, verify_s, step)
        self.drafting.learn(part, chunks, trees, draft_s, verify_s, drafted)
        self.clock.lap("bookkeeping")
        return True

    def _forward(self, chunks: list[SeqChunk], rows: list[int], recording: bool = False):
        """(logits [len(rows), V], hidden [N, H] of every token or None): hidden states only for a
        proposer that reads the target's features (EAGLE) or ``recording`` requests
        (``return_hidden_states``)."""
        if self.drafting.needs_hidden or recording:
            return self.verifier.forward_logits_and_hidden(chunks, rows)
        return self.verifier.forward_logits(chunks, rows), None

    def _restart_verifier(self) -> bool:
        """A restartable verifier (a TP shard group) lost a rank: restart the whole group and
        re-queue every running request from its last committed token (its KV is gone)."""
        restart = getattr(self.verifier, "restart", None)
        if restart is None or self.num_verifier_restarts >= self.max_verifier_restarts:
            return False
        self.num_verifier_restarts += 1
        try:
            restart()
        except Exception:
            log.exception("verifier restart failed")
            return False
        self._requeue_all()
        return True

    def _requeue_all(self) -> None:
        """The KV cache is gone: every running request goes back to waiting and recomputes from its
        last committed token (nothing lost, nothing emitted twice)."""
        for seq in self.scheduler.requeue_all():
            self.drafting.release(seq)

    def _plan_forward(self, scheduled, trees):
        """Per sequence: its chunk, and (first row, row count) of the logits it needs."""
        chunks, rows, spans = [], [], []
        n = 0
        for s in scheduled:
            seq, nc = s.seq, s.seq.num_computed
            table = self.scheduler.block_tables[seq.seq_id]
            if s.is_decode:
                tree = tree_of(seq, trees)
                ids, pos = tree.tokens, tree.positions(nc)
                mask = tree.ancestor_mask() if tree.size > 1 else None
                need = list(range(n, n + tree.size))
            else:
                ids = seq.token_ids[nc: nc + s.num_query]
                pos, mask = list(range(nc, nc + s.num_query)), None
                need = [n + s.num_query - 1] if nc + s.num_query == seq.num_tokens else []
            slots = self.scheduler.slots(seq, nc, nc + len(ids))
            chunks.append(SeqChunk(ids, pos, slots, nc + len(ids), table, mask))
            spans.append((len(rows), len(need)))
            rows += need
            n += len(ids)
        return chunks, rows, spans

    def _verify_and_commit(self, scheduled, trees, spans, raw: torch.Tensor) -> None:
        """raw: [M, V] target logits of _plan_forward's rows. Verify (against the processed logits),
        move accepted K/V, append tokens, settle KV. Logprobs report the raw distribution."""
        logits = processed_logits(scheduled, trees, spans, raw, self.eos_ids)
        argmax = step_argmax(scheduled, logits)
        self.clock.lap("wait")
        src, dst = [], []
        for s, (r0, nrows) in zip(scheduled, spans):
            seq = s.seq
            if not s.is_decode:
                seq.num_computed += s.num_query
                if nrows:
                    tok = argmax[r0] if seq.params.greedy else sample_next(logits[r0], seq.params, seq.generator,
                                                                           position=seq.num_tokens)
                    seq.append_tokens([tok], self.eos_ids, self.max_model_len)
                    if seq.logprobs is not None:
                        record_logprobs(seq, raw, [r0], [tok])
                continue
            tree = tree_of(seq, trees)
            res = verify_tree(seq, tree, logits[r0:r0 + nrows], argmax and argmax[r0:r0 + nrows])
            nc = seq.num_computed
            for depth, node in enumerate(res.accepted_nodes, start=1):
                if node != depth:
                    src.append(self.scheduler.slot(seq, nc + node))
                    dst.append(self.scheduler.slot(seq, nc + depth))
            seq.num_computed = nc + 1 + len(res.accepted_nodes)
            seq.spec.record(tree.num_draft_tokens, len(res.accepted_nodes))
            self.drafting.record(seq, tree, len(res.accepted_nodes))
            seq.append_tokens(res.accepted_tokens + [res.next_token], self.eos_ids, self.max_model_len)
            if seq.logprobs is not None:  # rows: each accepted node's parent, then the last accepted node
                record_logprobs(seq, raw, [r0 + n for n in [0, *res.accepted_nodes]], res.output_tokens)
        self.verifier.copy_slots(src, dst)
        for s in scheduled:
            self._check_stop_strings(s.seq)
            if s.seq.is_finished:
                self.drafting.release(s.seq)
        self.scheduler.settle([s.seq for s in scheduled])

    # ---- tokens, stops, bookkeeping -----------------------------------------------------
    def _check_stop_strings(self, seq: Sequence) -> None:
        if not seq.is_finished and seq.params.stop:
            if self.detok.find_stop(seq, self.detok.text_of(seq)) is not None:
                seq.finish("stop")

    def _finish_now(self, seq: Sequence, reason: str, error: str | None = None) -> RequestOutput:
        prev = seq.num_output_tokens
        if not seq.is_finished:
            seq.finish(reason, error)
            self.scheduler.remove(seq)
            self.drafting.release(seq)
        return self._emit(seq, prev)

    def _emit(self, seq: Sequence, prev_tokens: int) -> RequestOutput:
        text = self.detok.text_of(seq)
        if seq.is_finished and seq.finish_reason == "stop":
            text = self.detok.final_text(seq, text)
        out = make_output(seq, text, self.detok.streamable_len(seq, text), prev_tokens)
        if seq.is_finished and self.seqs.pop(seq.request_id, None) is None:
            return out  # already emitted as finished (a failed overlap micro-batch): counted once
        self.metrics.record_output(out)
        return out

    # ---- convenience --------------------------------------------------------------------
    def generate(self, prompts: list, params: SamplingParams | list[SamplingParams] | None = None,
                 chat: bool = False, concurrency: int | None = None) -> list[RequestOutput]:
        """Serve ``prompts`` as one continuous batch (at most ``concurrency`` in flight); results
        in input order."""
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        ids = [f"gen-{os.getpid()}-{id(self)}-{i}" for i in range(len(prompts))]
        limit = concurrency or len(prompts)
        final: dict[str, RequestOutput] = {}
        nxt = 0
        while len(final) < len(prompts):
            while nxt < len(prompts) and nxt - len(final) < limit:
                self.add_request(ids[nxt], prompts[nxt], plist[nxt], chat=chat)
                nxt += 1
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        self.on_idle()
        return [final[i] for i in ids]
