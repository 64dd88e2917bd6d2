"""The environment TorchServe (and so every model worker) is started with inside the serving image.

TorchServe 0.12's frontend starts a worker with ``PYTHONPATH`` = the PYTHONPATH it was given, then the
unpacked .mar's directory, then its working directory (``EnvironmentUtils.getEnvString``). The image puts its
own code on PYTHONPATH (``/opt/mnist-embedding``, for the gateway), which holds a ``handler`` package too: left
there, ``from handler...`` in the .mar's entry module would import the image's copy, so a .mar built from
other handler code would be served by the image's handler. TorchServe therefore gets the gateway's
environment without that directory on PYTHONPATH, and the .mar's ``handler/`` is the one its workers import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from settings import REPO


#: The pod's log (kubectl logs) carries the frontend's lifecycle lines: model loaded, workers started and died.
FRONTEND_CONSOLE_LEVEL = "info"


def torchserve_environment(environ: Mapping[str, str], app_root: Path = REPO) -> dict[str, str]:
    """`environ` without `app_root` (nor empty entries, which mean the working directory) on PYTHONPATH, and with
    TS_FRONTEND_CONSOLE_LEVEL (log4j2.xml) at FRONTEND_CONSOLE_LEVEL unless set."""
    env = dict(environ)
    env.setdefault("TS_FRONTEND_CONSOLE_LEVEL", FRONTEND_CONSOLE_LEVEL)
    root = os.path.realpath(app_root)
    kept = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep)
            if entry and os.path.realpath(entry) != root]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    return env
