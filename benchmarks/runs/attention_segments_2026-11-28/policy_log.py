"""Log the adaptive policy's choices on the long-document prompts (default draft, c=1)."""
import collections, json, sys, time
from cluster import cli
from cluster.engine import LLMEngine
from actors.spec_policy import SpecPolicy

path = sys.argv[1]
args = cli.build_parser().parse_args(["generate", "--chat", "--prompts-file", path, "--draft", sys.argv[2] if len(sys.argv) > 2 else "default"])
cfg = cli.engine_config_from_args(args)
pred = []; pending = {}; calib = collections.defaultdict(list); log = collections.Counter(); rec = collections.defaultdict(lambda: [0, 0, 0]); vt = collections.defaultdict(list)
class P(SpecPolicy):
    def choose(self, slots, base_tokens, base_yield=None, num_seqs=None):
        d = super().choose(slots, base_tokens, base_yield, num_seqs)
        if self.last_goodput and self.verify_cost.measured and any(d):
            plain = 1.0 / self.verify_model(num_seqs)(1)
            if plain: pred.append(self.last_goodput / plain)
        for s, k in zip(slots, d):
            log[(s.source, k)] += 1
            if k > 0 and s.source is not None:
                import numpy as np
                r = self.estimator(s.source).rates(s.seq_id)[:k]
                pending[s.seq_id] = (s.source, k, float(np.cumprod(r).sum()))
        return d
    def record(self, seq_id, depth, num_accepted, source=""):
        r = rec[source]; r[0] += 1; r[1] += depth; r[2] += num_accepted
        p = pending.pop(seq_id, None)
        if p is not None:
            calib[p[0]].append((p[2], num_accepted))
        super().record(seq_id, depth, num_accepted, source)
    def observe_verify(self, n, seconds, num_seqs=None):
        vt[n].append(seconds); super().observe_verify(n, seconds, num_seqs)
eng = LLMEngine(cfg, spec_policy=P(len(cfg.speculative.expansion)))
from cluster.request import engine_request
from cluster.prompt_file import read_prompt_file
reqs = cli.engine_requests(args, read_prompt_file(path, "--prompts-file"))
prompts = [r.prompt for r in reqs]; params = [r.params for r in reqs]
t0 = time.time(); outs = eng.generate(prompts, params, chat=True, concurrency=1)
print("wall", round(time.time() - t0, 2), "tokens", sum(o.num_output_tokens for o in outs))
print("choices (source, depth): count", sorted(log.items(), key=lambda x: (str(x[0][0]), x[0][1])))
for s, (n, dep, acc) in rec.items(): print("source", s, "drafts", n, "draft tokens", dep, "accepted", acc, "per draft", round(acc / n, 2))
for n in sorted(vt): print("verify n", n, "steps", len(vt[n]), "median ms", round(sorted(vt[n])[len(vt[n]) // 2] * 1e3, 2))
import statistics
for src, xs in sorted(calib.items(), key=lambda x: -len(x[1])):
    print("calibration", src, "n", len(xs), "predicted accepted mean", round(sum(a for a, _ in xs) / len(xs), 2), "actual", round(sum(b for _, b in xs) / len(xs), 2))
if pred: print("predicted goodput / plain on drafting steps: median", round(statistics.median(pred), 3), "n", len(pred))
print("policy est rates:", {s: [round(x, 2) for x in e.global_rates()] for s, e in eng.drafting.policy.acceptance.items()})
pol = eng.drafting.policy
print("verify points (n, ms):", [(round(n, 1), round(s * 1e3, 2)) for n, s in pol.verify_cost.points()])
for src, t in pol.draft_cost_by_source.items():
    print("draft", src, [(round(n, 1), round(s * 1e3, 2)) for n, s in t.points()])
