import sys, time, collections
from actors.sampling_params import SamplingParams
from benchmarks.options import select_prompts
from cluster.config import EngineConfig, SpeculativeConfig
from cluster.engine import LLMEngine
_, prompts = select_prompts(None, 64, 0)
msgs = [p.messages for p in prompts]
T = float(sys.argv[1])
for draft in sys.argv[2].split(","):
    spec = SpeculativeConfig.from_draft_arg(draft, 5, None, adaptive=True)
    engine = LLMEngine(EngineConfig(device="cpu", speculative=spec, max_num_seqs=64, num_threads=2))
    params = [SamplingParams(max_tokens=64, temperature=T, ignore_eos=True) for _ in prompts]
    engine.generate(msgs[:4], params[:4], chat=True, concurrency=64)
    pol = engine.spec_policy
    stats = collections.Counter()
    if pol is not None:
        orig = pol.choose
        def choose(slots, **kw):
            d = orig(slots, **kw)
            stats["calls"] += 1; stats["slots"] += len(slots); stats["drafting"] += sum(1 for x in d if x)
            return d
        pol.choose = choose
    b = engine.clock.snapshot(); t = time.perf_counter()
    outs = engine.generate(msgs, params, chat=True, concurrency=64)
    wall = time.perf_counter() - t; a = engine.clock.snapshot(); n = a["steps"] - b["steps"]
    print(draft, "tok/s", round(sum(len(o.token_ids) for o in outs) / wall, 1), "steps", n,
          {k: round((a[k] - b[k]) * 1e3 / n, 1) for k in a if k != "steps"}, dict(stats), flush=True)
    engine.shutdown()
