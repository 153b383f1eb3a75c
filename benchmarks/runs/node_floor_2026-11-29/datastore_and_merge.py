"""Would a datastore of earlier requests' outputs (a warm server's traffic) find drafts where prompt
lookup finds none? Offline, on the head-alone runs recorded by full_trees_record.py (greedy): at every
step, (a) in-context lookup (longest suffix >= 2 of prompt + output so far that occurred earlier: its
continuation), (b) a datastore of the other prompts' outputs (the other 23 held-out + 24 bench500
answers, or the other set only), longest suffix match n >= N_MIN, most recent continuation; (c) the
head's tree (top-10 nodes, as the default does). Accepted tokens per step against the greedy text."""
import json, sys
from collections import defaultdict
import numpy as np
from cluster.engine import LLMEngine
from cluster.config import EngineConfig
from cluster.prompts import PromptEncoder
from benchmarks.options import select_prompts, PROMPT_SETS

K = 5
eng = LLMEngine(EngineConfig(device="cpu"))
enc = PromptEncoder(eng.tokenizer)
data = {}
for name in ("heldout", "bench500"):
    _, prompts = select_prompts(PROMPT_SETS[name], 24 if name == "bench500" else None, 0)
    res = json.load(open(f"/tmp/s/full_{name}.json"))
    for p, r in zip(prompts, res):
        r["prompt"] = enc.encode(p.messages)
        assert len(r["prompt"]) == r["prompt_len"], (len(r["prompt"]), r["prompt_len"])
    data[name] = res

def longest_match(ctx, hay_index, hay, nmin, nmax=16):
    """(n, continuation start) of the longest suffix of ctx (n >= nmin) found in hay (most recent)."""
    best = None
    if len(ctx) < nmin: return None
    key = tuple(ctx[-nmin:])
    cands = hay_index.get(key, [])
    for start in reversed(cands):  # start: index in hay right after the nmin-gram
        n = nmin
        while n < nmax and n < len(ctx) and start - n - 1 >= 0 and hay[start - n - 1] == ctx[-n - 1]:
            n += 1
        if best is None or n > best[0]:
            best = (n, start)
        if n >= nmax: break
    return best

def index(seq, nmin):
    idx = defaultdict(list)
    for i in range(len(seq) - nmin):
        idx[tuple(seq[i:i + nmin])].append(i + nmin)
    return idx

def acc(cont_draft, truth):
    a = 0
    for x, y in zip(cont_draft, truth):
        if x != y: break
        a += 1
    return a

def head_acc(pool, truth, n=10):
    keep = list(range(min(n, len(pool["tokens"]))))
    kids = defaultdict(list)
    for i in keep: kids[pool["parents"][i]].append(i)
    node, d = -1, 0
    while d < len(truth):
        nxt = [c for c in kids[node] if pool["tokens"][c] == truth[d]]
        if not nxt: break
        node = nxt[0]; d += 1
    return d

for target in ("heldout", "bench500"):
    for nmin in (3, 4, 6):
        tot = defaultdict(float); cnt = defaultdict(int)
        for i, r in enumerate(data[target]):
            others = [x for name in data for j, x in enumerate(data[name]) if not (name == target and j == i)]
            hay = []
            for x in others: hay += x["out"] + [-1]
            hidx = index(hay, nmin)
            full = r["prompt"] + r["out"]
            for pos, pool in r["steps"]:
                ctx = full[:pos]; truth = full[pos:pos + K]
                # (a) in-context lookup, n >= 2
                own = longest_match(ctx[:-1] + [ctx[-1]], index(ctx[:-1], 2), ctx[:-1], 2)  # slow but fine
                a_own = acc(ctx[own[1]:own[1] + K], truth) if own else None
                ds = longest_match(ctx, hidx, hay, nmin)
                a_ds = acc(hay[ds[1]:ds[1] + K], truth) if ds else None
                a_head = head_acc(pool, truth)
                kind = "lookup" if own else ("datastore" if ds else "neither")
                cnt[kind] += 1
                tot[kind + " head"] += a_head
                if own: tot["lookup own"] += a_own
                if ds: tot[kind + " ds"] += a_ds
                if not own and ds:
                    tot["best(ds,head)"] += max(a_ds, a_head)
        n = sum(cnt.values())
        print(f"{target} datastore n>={nmin}: steps {n}; lookup matches {cnt['lookup']} (acc {tot['lookup own']/max(cnt['lookup'],1):.2f}, head there {tot['lookup head']/max(cnt['lookup'],1):.2f}); "
              f"datastore-only {cnt['datastore']} (ds acc {tot['datastore ds']/max(cnt['datastore'],1):.2f}, head {tot['datastore head']/max(cnt['datastore'],1):.2f}, best of both {tot['best(ds,head)']/max(cnt['datastore'],1):.2f}); "
              f"neither {cnt['neither']} (head {tot['neither head']/max(cnt['neither'],1):.2f})", flush=True)

print("lookup steps: a 10-deep lookup chain alone vs merged with the head's floored tree (floor 0.1)")
import math
for target in ("heldout", "bench500"):
    n = a_l = a_m = extra = 0
    for r in data[target]:
        full = r["prompt"] + r["out"]
        for pos, pool in r["steps"]:
            ctx = full[:pos]; truth = full[pos:pos + 10]
            own = longest_match(ctx, index(ctx[:-1], 2), ctx[:-1], 2)
            if not own: continue
            chain = ctx[own[1]:own[1] + 10]
            al = acc(chain, truth)
            keep = [i for i in range(len(pool["tokens"])) if math.exp(pool["scores"][i]) >= 0.1]
            # merged: follow truth through chain or head tree
            ah = head_acc({"tokens": [pool["tokens"][i] for i in keep], "parents": [keep.index(pool["parents"][i]) if pool["parents"][i] >= 0 else -1 for i in keep]}, truth, n=99) if keep else 0
            n += 1; a_l += al; a_m += max(al, ah); extra += len(keep)
    print(f"  {target}: {n} lookup steps, lookup {a_l/n:.2f}, merged {a_m/n:.2f} (+{(a_m-a_l)/n:.2f} tokens for {extra/n:.2f} head nodes a step)")
