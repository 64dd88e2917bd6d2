"""What `python -m pipeline run-local` checks before the first task runs, so that a run which cannot finish fails
in seconds with one line, not after training: the data source's local folder, and for deploy_target=local Java,
the TorchServe config and its ports. Also the paths the command writes (owned_paths)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from owned_paths import replaceable_dir
from settings import CONFIG_FILE, SettingsError
from training.data.sources import parse_source

#: run-local's --workdir: the kfp.local pipeline root, one `mnist-embedding-<time>/` per run, the default serve
#: workdir and the sample images (names of folders made before the marker existed).
RUNS_KIND = "pipeline-run-local"
RUNS_KNOWN = ("mnist-embedding-*", "serve", "samples")
#: --serve-workdir: what TorchServe and serving.server write into a working directory.
SERVE_KIND = "torchserve-workdir"
SERVE_KNOWN = (".ts-tmp", "logs", "key_file.json", "config.properties")


class PreflightError(Exception):
    """A run-local that cannot finish as given; the message is one line naming the fix."""


def check_outputs(workdir: Path, serve_workdir: str, data_source: str) -> None:
    """The folders run-local writes replace nothing a user owns (cli_common.UsageError otherwise)."""
    reads = [parse_source(data_source).local_path]
    replaceable_dir(workdir, RUNS_KIND, "--workdir", reads=reads, known=RUNS_KNOWN)
    if serve_workdir:
        replaceable_dir(Path(serve_workdir), SERVE_KIND, "--serve-workdir", reads=reads, known=SERVE_KNOWN)


def check_run(values: dict[str, Any]) -> None:
    """PreflightError for the first thing that would make the run fail after training; `values` are validated
    run parameters with serve_workdir and serve_config resolved."""
    data = parse_source(values["data_source"]).local_path
    if data is not None and not data.is_dir():
        raise PreflightError(f"data_source {values['data_source']}: {data} is not a folder")
    if values["deploy_target"] == "local":
        _check_local_serving(values)


def _check_local_serving(values: dict[str, Any]) -> None:
    from serving.python_server import served_ports
    from serving.server import Instance, holder_of, port_in_use, recorded_here

    python = values["serving_runtime"] == "python"
    if not python and shutil.which("java") is None:
        raise PreflightError("java not found: deploy_target=local starts TorchServe, which needs Java 17 "
                             "(apt-get install openjdk-17-jre-headless); or pass --serving-runtime python (no Java) "
                             "or --deploy-target none")
    config = Path(values["serve_config"] or CONFIG_FILE)
    instance = Instance(Path(values["serve_workdir"]), config, values["model_name"])
    try:
        ports = served_ports(instance) if python else instance.endpoints.ports()
    except OSError as exc:
        raise PreflightError(f"--serve-config {config}: cannot read it ({exc.strerror})") from None
    except (SettingsError, ValueError) as exc:
        raise PreflightError(f"--serve-config {config}: {exc}") from None
    if instance.pid() is not None or recorded_here(instance) is not None:
        return  # the server of this serve workdir holds its ports; deploy-local stops it first
    taken = [f"{port} ({what}){holder_of(port)}" for what, port in ports.items() if port_in_use(port)]
    if taken:
        raise PreflightError(f"port {', '.join(taken)} of {config} already in use: stop what holds it "
                             "(python -m serving stop, for a TorchServe) or pass --serve-config with other ports")
