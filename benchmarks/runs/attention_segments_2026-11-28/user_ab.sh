#!/bin/bash
# alternated base (5a5de48 worktree) vs new, plain and default draft, c=1 on 4 long-document prompts
out=/work/main/benchmarks/runs/attention_segments_2026-11-28/long_prompts
mkdir -p $out
for rep in 1 2; do
  if [ $rep = 1 ]; then arms="base new"; else arms="new base"; fi
  for arm in $arms; do
    dir=/work/main; [ $arm = base ] && dir=/tmp/s/base
    for draft in none default; do
      (cd $dir && /work/main/.venv/bin/python -m cluster.cli generate --json --chat --prompts-file /tmp/s/long_prompts.jsonl \
        --concurrency 1 --draft $draft > $out/${arm}_${draft}_${rep}.jsonl 2>/dev/null)
    done
  done
done
