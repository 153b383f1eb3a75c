"""benchmarks.gpu_http's pieces on the CPU, without serving: the Serve config it runs (a valid
`specray serve --config` file carrying the in-process engine config), the table (ratio and goal), and
the server's lifecycle (a server that exits early is an error quoting its log; one that ignores
SIGTERM is killed). The whole stage (Ray, the model, both sides) takes minutes: it is run by hand
(`python -m benchmarks.gpu_bench --stage http --device cpu --sample 3 --max-tokens 32 --out DIR`)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from benchmarks import gpu_http
from benchmarks.engine_bench import engine_config
from cluster.config import EngineConfig


def test_serve_config_is_a_serve_file_with_the_in_process_engine(tmp_path):
    from actors.model.registry import DEFAULT_MODEL
    from cluster.serve_config_file import load_serve_file

    adaptive, plain = gpu_http.variants("default")
    assert adaptive.adaptive and adaptive.spec_tokens == 5 and plain.spec_tokens == 0 and not plain.adaptive
    cfg = engine_config(DEFAULT_MODEL, "default", (adaptive, plain), {"device": "cpu", "kv_cache_gb": None,
                                                                       "num_threads": gpu_http.replica_cpus()})
    dump = cfg.model_dump(mode="json", exclude_defaults=True)
    assert EngineConfig.model_validate(dump) == cfg and cfg.speculative.adaptive
    doc = gpu_http.serve_config(dump, 8123, 1.0)
    assert "grpc_options" not in doc and doc["http_options"] == {"host": "127.0.0.1", "port": 8123}
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(doc))
    (app,) = load_serve_file(path).apps
    assert app.args.engine == cfg and app.args.num_gpus == 1.0 and app.args.num_cpus == gpu_http.replica_cpus()


def _row(spec: str, tpot: float | None) -> dict:
    return {"spec": spec, "tpot_p50_s": tpot, "tokens_per_s": 50.0, "ttft_p50_s": 0.02, "mean_accepted_length": None,
            "num_errors": 0}


def test_table_rows_give_the_ratio_and_the_goal():
    rows = gpu_http.table_rows([_row("auto K<=5", 0.010), _row("K=0", 0.010), _row("x", None)],
                               [_row("auto K<=5", 0.014), _row("K=0", 0.016), _row("x", 0.01)])
    assert [r[1:5] for r in rows] == [["10.00 ms", "14.00 ms", "1.40x", "met"],
                                      ["10.00 ms", "16.00 ms", "1.60x", "missed"], ["-", "10.00 ms", "-", "-"]]
    assert len(rows[0]) == len(gpu_http.HEAD)


def test_served_quotes_the_log_of_a_server_that_exits(tmp_path):
    doc = gpu_http.serve_config({"device": "cpu", "no_such_field": 1}, gpu_http.free_port(), 0.0)
    with pytest.raises(RuntimeError, match=r"specray serve exited 2 before serving; its log ends: .*no_such_field"):
        with gpu_http.served(doc, tmp_path / "serve.log", start_timeout_s=120):
            pass


def test_stop_kills_a_server_that_ignores_sigterm():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"up\n"
    t0 = time.monotonic()
    gpu_http.stop(proc, timeout_s=0.5)
    assert proc.returncode == -9 and time.monotonic() - t0 < 10


def test_warm_up_prompts_are_not_measured():
    prompts, warmup = gpu_http.prompt_sets(12)
    assert len(prompts) == 12 and len(warmup) == gpu_http.WARMUP_PROMPTS
    assert not {p.id for p in prompts} & {p.id for p in warmup}
