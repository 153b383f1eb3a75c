"""The benchmark subcommands of the ``specray`` CLI: ``specray bench`` and ``specray tune``.

``cluster.cli`` calls ``register`` when the benchmarks package is installed beside the serving
code; serving never imports benchmarks otherwise.
"""
from __future__ import annotations


def register(sub) -> None:
    """Add ``bench`` and ``tune`` to the ``specray`` subparsers (each sets its ``func``)."""
    from benchmarks.runner import add_bench_parser
    from benchmarks.tune import add_tune_parser

    add_bench_parser(sub)
    add_tune_parser(sub)
