#!/bin/sh
# As a user runs it: the commit before this session (worktree /tmp/s/base, 78a1a16) and this tree
# alternated (base, new, new, base), greedy adaptive at c=1 on 24 bench500 + 24 held-out prompts;
# then this tree at c=16 with tree widths 2 and 3 in both orders.
# Usage (repo root): sh benchmarks/runs/t1_draft_cost_2026-11-29/e2e_final.sh OUTDIR
OUT=$1; mkdir -p $OUT; n=0
for arm in base new new base; do
  n=$((n+1)); dir=$PWD; [ $arm = base ] && dir=/tmp/s/base
  (cd $dir && PYTHONPATH=$dir $OLDPWD/.venv/bin/python -m cluster.cli bench --prompts bench500,heldout --sample 24 \
     --draft default --spec-tokens auto --concurrency 1 --threads 2 --out $OLDPWD/$OUT/c1_$n$arm) > $OUT/c1_$n$arm.log 2>&1
  echo "$n $arm done $(date +%T)"
done
for w in 2,3 3,2; do
  .venv/bin/python -m cluster.cli bench --sample 48 --draft default --spec-tokens auto --tree-width $w --tree-nodes 10 \
     --concurrency 16 --threads 2 --out $OUT/c16_w$w > $OUT/c16_w$w.log 2>&1
  echo "c16 $w done $(date +%T)"
done
