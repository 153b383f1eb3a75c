#!/bin/bash
# base: a git worktree of 9135c82 (before this session) at /tmp/s/base; new: the working tree at /work/main
# alternate base and new: optime (other ms/step) for a draft
d=$1; n=${2:-2}
for i in $(seq 1 $n); do
  for w in base new; do
    if [ $w = base ]; then dir=/tmp/s/base; else dir=/work/main; fi
    echo -n "$w: "; (cd $dir && PYTHONPATH=$dir /work/main/.venv/bin/python benchmarks/runs/step_python_2026-11-28/step_python.py $d 2>&1 | grep -v "Convert\|Loading\|USDT" | tail -1)
  done
done
