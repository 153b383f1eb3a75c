#!/bin/sh
# T=1.0 unseeded held-out, c=1: the commit before (worktree at /tmp/s/base) and this tree, alternated
# base, new, new, base. Usage (repo root): sh benchmarks/runs/t1_draft_cost_2026-11-29/t1_ab.sh OUTDIR
OUT=$1; mkdir -p $OUT
for arm in base new new base; do
  dir=$PWD; [ $arm = base ] && dir=/tmp/s/base
  i=$(ls $OUT | grep -c "^$arm") ; tag=$arm$((i+1))
  (cd $dir && PYTHONPATH=$dir $OLDPWD/.venv/bin/python -m cluster.cli bench --prompts heldout --draft default \
     --spec-tokens 2,auto --temperature 1.0 --unseeded --concurrency 1 --threads 2 --out $OLDPWD/$OUT/$tag) \
     > $OUT/$tag.log 2>&1
  echo "$tag done $(date +%T)"
done
