"""`specray serve`: the OpenAI-compatible HTTP endpoint (and, with --grpc-port, the gRPC API) on Ray
Serve, until Ctrl-C.

Starts a local Ray instance (or connects to RAY_ADDRESS), starts Serve's HTTP proxy on
--host/--port and runs ``deployments.app.build_app(ServeArgs(engine=config))`` at route prefix
``/``. With ``--config FILE`` (``ray_configs/serve_*.yaml``) the proxies and applications come from a Serve
config file instead, checked whole before Ray starts (``cluster.serve_config_file``)."""
from __future__ import annotations

import argparse
import os
import signal
import time


def add_serve_parser(sub) -> argparse.ArgumentParser:
    from cluster.cli import add_engine_args

    p = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API on Ray Serve (until Ctrl-C)")
    add_engine_args(p)
    p.set_defaults(func=cmd_serve)
    p.add_argument("--host", default="127.0.0.1", help="address the HTTP proxy listens on")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs reserved for the engine replica")
    p.add_argument("--grpc-port", type=int, default=None,
                   help="also serve the gRPC API (specray.v1.Generation) on this port, e.g. 9000, on all "
                        "interfaces (Serve's gRPC proxy has no host option); off unless given")
    p.add_argument("--config", default=None, metavar="PATH",
                   help="a Serve config file (e.g. ray_configs/serve_local.yaml): proxies, ports and every "
                        "application come from it; the other flags then conflict")
    return p


def _check_port(port: int, flag: str = "--port") -> None:
    from cluster.cli import BadInput

    if not 0 < port < 65536:
        raise BadInput(f"{flag} {port}: must be between 1 and 65535")


def usage_text(host: str, port: int, model: str) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"http://{shown}:{port}"
    body = '{"model": "%s", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}' % model
    return (f"specray: serving {model!r} at {url}/v1 (Ctrl-C to stop)\n"
            f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'\n"
            f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key='none'); "
            f"print(c.chat.completions.create(model='{model}', messages=[{{'role': 'user', 'content': 'Hello!'}}]"
            f").choices[0].message.content)\"")


def grpc_usage_text(host: str, port: int, app_name: str = "specray") -> str:
    """How to call the gRPC API (the proxy routes by the `application` metadata; reflection is on)."""
    target = f"{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    return (f"specray: gRPC specray.v1.Generation at {target} (metadata application: {app_name})\n"
            f"  grpcurl -plaintext -H 'application: {app_name}' -d '{{\"prompt\": \"Hello\", \"max_tokens\": 32}}' "
            f"{target} specray.v1.Generation/Generate\n"
            f"  python -c \"import grpc; from deployments.protos import specray_pb2 as pb, specray_pb2_grpc as rpc; "
            f"s = rpc.GenerationStub(grpc.insecure_channel('{target}')); print(s.Generate(pb.GenerateRequest("
            f"prompt='Hello', max_tokens=32), metadata=[('application', '{app_name}')]).text)\"")


def check_models(apps: list) -> None:
    """A replica's tensor-parallel size must fit its model (heads divisible), found here and not by
    a replica that fails to start."""
    from cluster.cli import BadInput
    from cluster.replica import load_model_meta
    from cluster.topology import validate_tp

    for a in apps:
        if a.args is not None and a.args.tensor_parallel_size > 1:
            try:
                validate_tp(load_model_meta(a.args.engine.model).config, a.args.tensor_parallel_size,
                            a.args.engine.model)
            except ValueError as e:
                raise BadInput(f"application {a.name!r}: tensor_parallel_size: {e}") from None


def check_placement(apps: list, nodes: list[dict], owned: bool) -> None:
    """Every application's replicas fit the cluster's nodes. On a cluster this command started
    (nothing will join it) a misfit is an error naming the resources; on a joined cluster, which
    may autoscale, a warning."""
    import sys

    from cluster.cli import BadInput
    from cluster.topology import unplaceable_reason

    for a in apps:
        if a.args is None:
            continue
        replica, group = a.args.replica_resources()
        reason = unplaceable_reason(replica, group, a.args.min_replicas, nodes)
        if reason is None:
            continue
        text = (f"application {a.name!r} cannot be placed: {reason}; lower tensor_parallel_size, drafters or "
                "num_cpus, or add resources")
        if owned:
            raise BadInput(text)
        print(f"specray: warning: {text} (unless the cluster scales up)", file=sys.stderr, flush=True)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def cmd_serve(args) -> int:
    from cluster.cli import engine_config_from_args
    from cluster.serve_config_file import ServeApp
    from deployments.app import build_app
    from deployments.grpc_ingress import grpc_options
    from deployments.serve_config import ServeArgs

    if args.config:
        return _serve_config_file(args)
    _check_port(args.port)
    if args.grpc_port is not None:
        _check_port(args.grpc_port, "--grpc-port")
    config = engine_config_from_args(args)  # bad flags fail here, before Ray starts
    start = {"http_options": {"host": args.host, "port": args.port},
             "grpc_options": None if args.grpc_port is None else grpc_options(args.grpc_port)}
    banner = usage_text(args.host, args.port, config.model)
    if args.grpc_port is not None:
        banner += "\n" + grpc_usage_text(args.host, args.grpc_port)
    sargs = ServeArgs(engine=config, num_cpus=args.num_cpus)
    return serve_until_interrupted(start, [ServeApp("specray", "/", build_app(sargs), config.model, args=sargs)], banner)


def _flags_given(args) -> list[str]:
    """The `specray serve` flags set to something other than their defaults."""
    from cluster.cli import build_parser

    defaults = vars(build_parser().parse_args(["serve"]))
    return ["--" + k.replace("_", "-") for k, v in vars(args).items()
            if k != "config" and k in defaults and v != defaults[k]]


def _serve_config_file(args) -> int:
    """`--config FILE`: everything comes from the file, validated whole before Ray starts."""
    from cluster.cli import BadInput
    from cluster.serve_config_file import load_serve_file

    given = _flags_given(args)
    if given:
        raise BadInput(f"{', '.join(given)} conflict with --config {args.config}: set them in the file "
                       "(applications[].args, http_options, grpc_options) instead")
    served = load_serve_file(args.config)
    http, grpc = served.config.http_options, served.config.grpc_options
    banner = [usage_text(http.host, http.port, a.model_name) for a in served.apps]
    if grpc.grpc_servicer_functions:
        banner += [grpc_usage_text(http.host, grpc.port, a.name) for a in served.apps]
    return serve_until_interrupted(served.start_options(), served.apps, "\n".join(banner))


def serve_until_interrupted(start_options: dict, apps: list, banner: str) -> int:
    """Start (or join) Ray and Serve, run ``apps`` (``ServeApp``), print the banner, block until Ctrl-C
    or SIGTERM; then remove only what this command started."""
    import ray
    from ray import serve

    check_models(apps)  # before Ray starts
    started = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False, log_to_driver=False)
    try:
        check_placement(apps, [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")], owned=started)
        serve.start(**start_options)
        for a in apps:
            serve.run(a.app, name=a.name, route_prefix=a.route_prefix, **a.run_options)
        print(banner, flush=True)
        for sig in (signal.SIGINT, signal.SIGTERM):  # also when started in the background (SIGINT ignored)
            signal.signal(sig, _interrupt)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("specray: shutting down", flush=True)
    finally:  # only what this command started: its apps always, Serve and Ray when they are ours
        if started:
            serve.shutdown()
            ray.shutdown()
        else:
            for a in apps:
                serve.delete(a.name)
    return 0
