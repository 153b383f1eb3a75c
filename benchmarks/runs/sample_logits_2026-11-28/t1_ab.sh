#!/bin/bash
# T=1.0 unseeded, held-out set, c=1: base (a worktree of c6e824d at /tmp/s/base) and new (/work/main)
# alternated base, new, new, base; each run's bench output under $out/<arm><i>/
out=$(cd "$(dirname "$0")" && pwd)
for w in base new new base; do
  if [ $w = base ]; then dir=/tmp/s/base; else dir=/work/main; fi
  n=$(ls -d $out/${w}* 2>/dev/null | wc -l)
  (cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python -m cluster.cli bench --prompts heldout --draft default \
     --spec-tokens auto --temperature 1.0 --unseeded --concurrency 1 --threads 2 --out $out/$w$n 2>&1 | tail -4)
done
