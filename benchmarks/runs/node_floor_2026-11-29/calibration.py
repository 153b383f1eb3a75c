import json, math
import numpy as np
d = json.load(open("/tmp/s/scores.json"))
for name, trees in d.items():
    nodes = [n for t in trees for n in t]
    s = np.array([n[0] for n in nodes]); a = np.array([n[2] for n in nodes])
    print(name, "trees", len(trees), "nodes", len(nodes), "nodes/tree %.2f" % (len(nodes)/len(trees)), "accepted/tree %.2f" % (a.sum()/len(trees)))
    # calibration: bucket by exp(score)
    p = np.exp(s)
    for lo, hi in [(0,.05),(.05,.1),(.1,.15),(.15,.2),(.2,.3),(.3,.4),(.4,.6),(.6,.8),(.8,1.01)]:
        m = (p >= lo) & (p < hi)
        if m.sum(): print(f"  q in [{lo:.2f},{hi:.2f}): n={m.sum():4d} acc={a[m].mean():.3f}")
    for tau in [0, .02, .05, .08, .1, .12, .15, .2, .25, .3]:
        keep = p >= tau
        # always keep the best node of each tree
        kept = 0; acc = 0
        for t in trees:
            ps = [math.exp(n[0]) for n in t]
            k = [i for i, x in enumerate(ps) if x >= tau] or [int(np.argmax(ps))]
            kept += len(k); acc += sum(t[i][2] for i in k)
        print(f"  tau {tau:.2f}: nodes/tree {kept/len(trees):.2f} accepted/tree {acc/len(trees):.2f}")
