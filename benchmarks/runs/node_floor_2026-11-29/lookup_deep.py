import json, sys
exec(open("/tmp/s/datastore.py").read().split("for target in")[0])
T0, CROW = 6.5, 0.45
for target in ("heldout", "bench500"):
    steps = []
    for r in data[target]:
        full = r["prompt"] + r["out"]
        for pos, pool in r["steps"]:
            ctx = full[:pos]; truth = full[pos:pos + 48]
            own = longest_match(ctx, index(ctx[:-1], 2), ctx[:-1], 2)
            if own: steps.append((own[0], ctx[own[1]:own[1] + 48], truth))
    for rule in ("cap10", "cap16", "cap24", "cap32", "n>=8:16", "n>=8:24", "n>=8:32", "n>=6:32"):
        tok = t = 0
        for n, chain, truth in steps:
            if rule.startswith("cap"): C = int(rule[3:])
            else:
                nmin, c = rule[3:].split(":"); C = int(c) if n >= int(nmin) else 10
            ch = chain[:C]; a = acc(ch, truth)
            tok += 1 + a; t += T0 + len(ch) * CROW
        print(f"{target} {rule:8s} lookup steps {len(steps)} tokens/step {tok/len(steps):.2f} ms/step {t/len(steps):.2f} tok/ms {tok/t:.3f}")
