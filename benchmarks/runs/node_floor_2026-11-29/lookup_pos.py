import json, sys
sys.argv = ["x"]
exec(open("/tmp/s/datastore.py").read().split("for target in")[0])  # data, helpers
for target in ("heldout", "bench500"):
    reach = [0] * 11; accd = [0] * 11; byn = {}
    for r in data[target]:
        full = r["prompt"] + r["out"]
        for pos, pool in r["steps"]:
            ctx = full[:pos]; truth = full[pos:pos + 10]
            own = longest_match(ctx, index(ctx[:-1], 2), ctx[:-1], 2)
            if not own: continue
            a = acc(ctx[own[1]:own[1] + 10], truth)
            L = min(10, len(ctx) - own[1], len(truth))
            for j in range(1, L + 1):
                if a >= j - 1: reach[j] += 1
                if a >= j: accd[j] += 1
            n = min(own[0], 8); b = byn.setdefault(n, [0, 0, 0]); b[0] += 1; b[1] += a; b[2] += (a >= 1)
    print(target, "P(pos j | j-1):", " ".join(f"{j}:{accd[j]/max(reach[j],1):.2f}" for j in range(1, 11)))
    print("  by match length n: ", " ".join(f"n{n}: steps {v[0]} acc {v[1]/v[0]:.2f} first {v[2]/v[0]:.2f}" for n, v in sorted(byn.items())))
