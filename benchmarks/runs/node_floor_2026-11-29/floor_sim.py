import json, math, sys
import numpy as np
T0, CROW, CHEAD, CCU = 6.5, 0.45, 0.35, 0.6
def acc_len(pool, keep, cont):
    kids = {}
    for i in keep: kids.setdefault(pool["parents"][i], []).append(i)
    node, d = -1, 0
    while d < len(cont):
        nxt = [c for c in kids.get(node, []) if pool["tokens"][c] == cont[d]]
        if not nxt: break
        node = nxt[0]; d += 1
    return d
for name in sys.argv[1:]:
    res = json.load(open(f"/tmp/s/full_{name}.json"))
    print(name)
    rows = []
    for r in res:
        plen = None
        # prompt length: first step's len(token_ids) - 1 ... output starts at prompt_len; derive: steps record len(token_ids) = plen + emitted
        for pos, pool in r["steps"]:
            rows.append((r, pos, pool))
    # prompt length per response: out has all output tokens; the first step happens after >=1 output token
    def run(select, label):
        tok = t = 0.0; nodes = 0
        for r, pos, pool in rows:
            plen = r["prompt_len"]
            cont = r["out"][pos - plen:]
            keep = select(pool)
            a = acc_len(pool, keep, cont) if keep else 0
            depth = max([pool["depths"][i] for i in keep], default=0)
            heads = min(depth, 4)  # forwards beyond the catch-up
            tok += 1 + a; nodes += len(keep)
            t += T0 + len(keep) * CROW + CCU + heads * CHEAD
        print(f"  {label:28s} tok/step {tok/len(rows):.2f} nodes/step {nodes/len(rows):.2f} speedup {tok/t*T0:.3f}")
    run(lambda p: [], "none (catch-up only)")
    for n in (3, 5, 6, 8, 10, 16, 24):
        run(lambda p, n=n: list(range(min(n, len(p["tokens"])))), f"top-{n}")
    for tau in (0.02, 0.05, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3):
        for cap in (10, 24):
            run(lambda p, tau=tau, cap=cap: [i for i in range(min(cap, len(p["tokens"]))) if math.exp(p["scores"][i]) >= tau], f"tau {tau} cap {cap}")
