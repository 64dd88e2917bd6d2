"""Whether a TCP port is free to listen on: one check for the launchers (serving.server) and the python runtime,
standard library only (the python runtime's image has no client libraries)."""

from __future__ import annotations

import socket


def port_taken(host: str, port: int) -> bool:
    """Another process holds `port` on `host` (checked without SO_REUSEPORT, which would let the python runtime's
    workers share it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False
