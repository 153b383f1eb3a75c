#!/bin/bash
# usage: benchmarks/runs/gc_2026-11-28/soak_gc.sh FREEZE(0|1) PORT MINUTES: `specray serve` (SPECRAY_GC_FREEZE=FREEZE),
# a soak against it, then its /metrics (gc pauses, TPOT) and the soak's last lines
set -u
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
F=$1; PORT=$2; MIN=$3; OUT=benchmarks/runs/gc_2026-11-28/freeze$F
mkdir -p $OUT
sed "s/port: 8000 /port: $PORT /; s/port: 9000 /port: $((PORT+1)) /" ray_configs/serve_local.yaml > $OUT/serve.yaml
SPECRAY_GC_FREEZE=$F .venv/bin/specray serve --config $OUT/serve.yaml > $OUT/serve.log 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 2; done
.venv/bin/python -m benchmarks.soak --url http://127.0.0.1:$PORT --minutes $MIN --concurrency 8 --report-every 60 > $OUT/soak.log 2>&1
curl -s http://127.0.0.1:$PORT/metrics > $OUT/metrics.txt
kill -INT $SP; wait $SP
grep -E 'gc_pause_seconds_(count|sum)' $OUT/metrics.txt
grep -E 'time_per_output_token_seconds_(count|sum)|generation_tokens_total' $OUT/metrics.txt
tail -5 $OUT/soak.log
