import json
import numpy as np
REC = json.load(open("/tmp/s/t1_calib.json"))
print("chains", len(REC), "nodes", sum(len(t) for t in REC))
# conditional acceptance: node d counted only where node d-1 was accepted (or d = 1)
for col, name in ((0, "q(x) of the draw"), (1, "path product of q(x)"), (2, "max q at the node")):
    print("by", name)
    for lo, hi in [(0, .05), (.05, .1), (.1, .2), (.2, .4), (.4, .6), (.6, .8), (.8, .95), (.95, 1.01)]:
        row = []
        for d in (1, 2, 3):
            n = acc = 0
            for t in REC:
                if len(t) >= d and (d == 1 or t[d - 2][3]) and lo <= t[d - 1][col] < hi:
                    n += 1; acc += t[d - 1][3]
            row.append(f"d{d} n={n:4d} acc={acc / n:.2f}" if n else f"d{d} n=   0         ")
        print(f"  [{lo:.2f},{hi:.2f})  " + "   ".join(row))
