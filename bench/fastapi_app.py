"""FastAPI + uvicorn serving `EmbeddingService` (``python -m bench.fastapi_app``), launched by `bench.peers`.

``--workers N`` starts N uvicorn worker processes (``--worker-index i``), each loading the model and
serving the app from `bench.peers.create_fastapi_app` on its OWN listening socket, bound to the same
port with ``SO_REUSEPORT``: Linux then spreads incoming connections over the workers by a hash of
each connection's addresses and ports.

Why not ``uvicorn --workers N``: there every worker inherits one shared listening socket, and the
worker that wakes first accepts every pending connection (asyncio accepts up to the backlog per
wake-up). wrk opens its keep-alive connections all at once, so at c=16 one worker often held all
16 connections for the whole trial while the other idled (2026-11-27, 16 connections opened at
once, 5 rounds: 16/0 in 3, 14/2 and 13/3 in the others; with per-worker sockets 6/10 to 9/7), and
the server ran at one core. uvicorn 0.54 has no option for per-worker sockets (a flag for it is an
open uvicorn pull request), so this module does what that flag does.
The accepted sockets are TCP sockets (``IPPROTO_TCP``), so asyncio sets ``TCP_NODELAY`` on them as
single-process uvicorn does.

Linux only (``SO_REUSEPORT`` load balancing); the supervisor stops every worker when one exits or
when it gets SIGTERM / SIGINT.
"""

import argparse
import signal
import socket
import subprocess
import sys
import time

WORKER_FLAG = "--worker-index"


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT, not yet listening (uvicorn calls listen)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def serve_worker(host: str, port: int) -> int:
    """One uvicorn server on its own SO_REUSEPORT socket; the app (and the model) loads before it listens."""
    import uvicorn

    sock = reuse_port_socket(host, port)
    config = uvicorn.Config("bench.peers:create_fastapi_app", factory=True, host=host, port=port,
                            log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def supervise(host: str, port: int, workers: int, grace_s: float = 10.0) -> int:
    """Start `workers` worker processes and wait; stop them all when one exits or on SIGTERM / SIGINT."""
    stop = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.append(True))
    children = [subprocess.Popen([sys.executable, "-m", "bench.fastapi_app", "--host", host, "--port", str(port),
                                  WORKER_FLAG, str(index)]) for index in range(workers)]
    code = 0
    while not stop:
        exited = [child for child in children if child.poll() is not None]
        if exited:
            code = exited[0].returncode or 1
            break
        time.sleep(0.2)
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fastapi_app", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", type=int, default=2, help="uvicorn worker processes, one socket each")
    p.add_argument(WORKER_FLAG, type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_index is not None:
        return serve_worker(args.host, args.port)
    if args.workers < 1:
        p.error("--workers must be >= 1")
    return supervise(args.host, args.port, args.workers)


if __name__ == "__main__":
    sys.exit(main())
