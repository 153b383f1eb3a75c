"""Start the specray Serve application for an HTTP test module and stop it again."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cluster.config import EngineConfig, SpeculativeConfig
from tests.ports import free_port


def ngram_engine(k: int = 4) -> EngineConfig:
    """The small engine the HTTP tests serve: the default model, n-gram drafts of K, one thread."""
    return EngineConfig(num_kv_blocks=256, num_threads=1, speculative=SpeculativeConfig.from_draft_arg("ngram", k))


@contextmanager
def serve_app(name: str, **serve_args) -> Iterator[str]:
    """Serve ``build_app(ServeArgs(**serve_args))`` (engine default: ``ngram_engine()``) on a free
    port as application ``name``; yields its base URL, shuts Serve down after."""
    from ray import serve

    from deployments.app import build_app
    from deployments.serve_config import ServeArgs

    serve_args.setdefault("engine", ngram_engine())
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(build_app(ServeArgs(**serve_args)), name=name, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
