#!/bin/bash
# base: a git worktree of 9135c82 (before this session) at /tmp/s/base; new: the working tree at /work/main
# alternate base (9135c82) and new (HEAD) c=1 runs of bench500+heldout
out=/tmp/s/runs/e2e; mkdir -p $out
for w in new base base new; do
  if [ $w = base ]; then dir=/tmp/s/base; else dir=/work/main; fi
  i=$(ls $out | grep -c "^c1_$w")
  (cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python -m cluster.cli bench --prompts bench500,heldout --sample 24 --draft default --spec-tokens 5,auto --concurrency 1 --threads 2 --out $out/c1_${w}$((i+1)) > $out/c1_${w}$((i+1)).log 2>&1)
  echo "$w done $(date +%H:%M:%S)"
done
