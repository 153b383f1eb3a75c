"""`specray serve`: the OpenAI-compatible HTTP endpoint on Ray Serve, until Ctrl-C.

Starts a local Ray instance (or connects to RAY_ADDRESS), starts Serve's HTTP proxy on
--host/--port and runs ``deployments.app.build_app(config)`` at route prefix ``/``."""
from __future__ import annotations

import argparse
import os
import signal
import time


def add_serve_parser(sub) -> argparse.ArgumentParser:
    from cluster.cli import _add_engine_args

    p = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API on Ray Serve (until Ctrl-C)")
    _add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address the HTTP proxy listens on")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs reserved for the engine replica")
    return p


def _check_port(port: int) -> None:
    from cluster.cli import BadInput

    if not 0 < port < 65536:
        raise BadInput(f"--port {port}: must be between 1 and 65535")


def usage_text(host: str, port: int, model: str) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"http://{shown}:{port}"
    body = '{"model": "%s", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}' % model
    return (f"specray: serving {model!r} at {url}/v1 (Ctrl-C to stop)\n"
            f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'\n"
            f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key='none'); "
            f"print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'Hello!'}}]"
            f").choices[0].message.content)\"")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def cmd_serve(args) -> int:
    import ray
    from ray import serve

    from cluster.cli import engine_config_from_args
    from deployments.app import build_app

    _check_port(args.port)
    config = engine_config_from_args(args)  # bad flags fail here, before Ray starts
    started = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_app(config, ray_actor_options={"num_cpus": args.num_cpus}), name="specray",
                  route_prefix="/")
        print(usage_text(args.host, args.port, config.model), flush=True)
        for sig in (signal.SIGINT, signal.SIGTERM):  # also when started in the background (SIGINT ignored)
            signal.signal(sig, _interrupt)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("specray: shutting down", flush=True)
    finally:  # only what this command started: the app always, Serve and Ray when they are ours
        if started:
            serve.shutdown()
            ray.shutdown()
        else:
            serve.delete("specray")
    return 0
