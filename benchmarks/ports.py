"""Free local TCP ports for the servers a benchmark or a test starts."""
from __future__ import annotations

import socket

_handed_out: set[int] = set()


def free_port() -> int:
    """A local TCP port that is free now and that this process has not handed out before: the probe
    socket closes before the port is used, so two calls in a row could otherwise return the same
    port (a Ray start given it for two components refuses to come up)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no fresh free local TCP port after 200 tries")
