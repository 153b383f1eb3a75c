cd $1; name=$2; shift 2
/work/main/.venv/bin/python -m cluster.cli generate --ray --json --chat --prompts-file /tmp/s/p8.jsonl --concurrency 1 --draft none --max-tokens 64 "$@" > /tmp/s/raygen_$name.json 2>/tmp/s/raygen_$name.err
python3 -c "
import json
rows=[json.loads(l) for l in open('/tmp/s/raygen_$name.json') if l.startswith('{')]
tp=[(r['e2e_s']-r['ttft_s'])/(r['num_output_tokens']-1) for r in rows]
tp.sort()
print('$name', len(rows), 'answers', sum(len(r['token_ids']) for r in rows), 'tokens; TPOT p50 %.2f ms; sum e2e %.2f s' % (1e3*tp[len(tp)//2], sum(r['e2e_s'] for r in rows)))
"
