#!/bin/sh
# The commit before this session (worktree at /tmp/s/base, 78a1a16) and this tree, alternated base,
# new, new, base: T=1.0 unseeded held-out adaptive, then greedy adaptive on bench500 + held-out.
# Usage (repo root): sh benchmarks/runs/t1_draft_cost_2026-11-29/e2e_ab.sh OUTDIR
OUT=$1; mkdir -p $OUT; n=0
for arm in base new new base; do
  n=$((n+1)); dir=$PWD; [ $arm = base ] && dir=/tmp/s/base
  (cd $dir && PYTHONPATH=$dir $OLDPWD/.venv/bin/python -m cluster.cli bench --prompts heldout --draft default \
     --spec-tokens auto --temperature 1.0 --unseeded --concurrency 1 --threads 2 --out $OLDPWD/$OUT/t1_$n$arm) \
     > $OUT/t1_$n$arm.log 2>&1
  (cd $dir && PYTHONPATH=$dir $OLDPWD/.venv/bin/python -m cluster.cli bench --prompts bench500,heldout --sample 24 \
     --draft default --spec-tokens auto --concurrency 1 --threads 2 --out $OLDPWD/$OUT/greedy_$n$arm) \
     > $OUT/greedy_$n$arm.log 2>&1
  echo "$n $arm done $(date +%T)"
done
