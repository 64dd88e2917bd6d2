"""HTTP load with wrk (Debian's `wrk`): closed loop, fixed concurrency, its own CPU measured.

A Lua script preformats one POST per request image (raw PNG bytes, ``application/octet-stream``,
optional ``Authorization: Bearer``) and cycles through them; ``done()`` prints the totals, the error
counts and the latency percentiles as one JSON line. The token travels in the script file (mode
0600 in a private directory), not on the command line where other users could read it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

MARKER = "WRKJSON "

LUA = r"""
local files = {FILES}
local path = "{PATH}"
local headers = {HEADERS}
local reqs = {}
local counter = 0

function init(args)
  for i, name in ipairs(files) do
    local f = assert(io.open(name, "rb"))
    local body = f:read("*a")
    f:close()
    reqs[i] = wrk.format("POST", path, headers, body)
  end
  counter = math.random(#reqs)
end

function request()
  counter = counter % #reqs + 1
  return reqs[counter]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{MARKER}{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"mean_us":%.1f,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


class LoadError(RuntimeError):
    """The load generator could not run or produced no result."""


@dataclass
class WrkScript:
    """A Lua script plus the request bodies it reads, in a private temporary directory."""

    directory: Path
    script: Path

    @classmethod
    def create(cls, path: str, bodies: Sequence[bytes], token: str | None,
               content_type: str = "application/octet-stream") -> WrkScript:
        if shutil.which("wrk") is None:
            raise LoadError("wrk not found: apt-get install wrk")
        directory = Path(tempfile.mkdtemp(prefix="bench-wrk-"))
        os.chmod(directory, 0o700)
        names = []
        for i, body in enumerate(bodies):
            name = directory / f"body{i}.png"
            name.write_bytes(body)
            names.append(name)
        headers = {"Content-Type": content_type}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        lua = (LUA.replace("{FILES}", "{" + ", ".join(json.dumps(str(n)) for n in names) + "}")
               .replace("{PATH}", path)
               .replace("{HEADERS}", "{" + ", ".join(f'[{json.dumps(k)}] = {json.dumps(v)}' for k, v in headers.items()) + "}")
               .replace("{MARKER}", MARKER))
        script = directory / "post.lua"
        script.write_text(lua)
        os.chmod(script, 0o600)
        return cls(directory, script)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def exit_cpu_seconds(proc: subprocess.Popen) -> float:
    """CPU seconds of a finished child, read with psutil before it is reaped (it is a zombie then)."""
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    try:
        times = psutil.Process(proc.pid).cpu_times()
        seconds = times.user + times.system
    except psutil.Error:
        seconds = float("nan")
    proc.wait()
    return seconds


def run_wrk(base_url: str, script: WrkScript, concurrency: int, duration_s: int,
            timeout_s: int = 10) -> dict[str, Any]:
    """One closed-loop run: throughput, latency percentiles (ms), errors and wrk's own CPU use."""
    cmd = ["wrk", "-t1", f"-c{concurrency}", f"-d{duration_s}s", f"--timeout={timeout_s}s",
           "-s", str(script.script), base_url]
    out_file, err_file = script.directory / "wrk.out", script.directory / "wrk.err"
    with open(out_file, "w") as out_fh, open(err_file, "w") as err_fh:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out_fh, stderr=err_fh, stdin=subprocess.DEVNULL)
        try:
            cpu = exit_cpu_seconds(proc)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - started
    out, err = out_file.read_text(), err_file.read_text()
    lines = [line for line in out.splitlines() if line.startswith(MARKER)]
    if proc.returncode != 0 or not lines:
        raise LoadError(f"wrk failed (exit {proc.returncode}): {(err or out).strip()[-300:]}")
    r = json.loads(lines[-1][len(MARKER):])
    seconds = r["duration_us"] / 1e6
    errors = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    return {
        "requests": r["requests"],
        "seconds": seconds,
        "throughput": r["requests"] / seconds if seconds > 0 else 0.0,
        "errors": errors,
        "error_kinds": {k: r[k] for k in ("connect", "read", "write", "status", "timeout") if r[k]},
        "mean_ms": r["mean_us"] / 1e3,
        "p50_ms": r["p50_us"] / 1e3,
        "p90_ms": r["p90_us"] / 1e3,
        "p99_ms": r["p99_us"] / 1e3,
        "max_ms": r["max_us"] / 1e3,
        "loadgen_cpu_pct": 100.0 * cpu / wall,
    }
