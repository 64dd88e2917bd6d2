"""Deploy target `local`: serve a freshly built archive with the project's server lifecycle (TorchServe, or the
python runtime)."""

from __future__ import annotations

from pathlib import Path

from settings import CONFIG_FILE, REPO
from serving.runtimes import DEFAULT_SERVING_RUNTIME, SERVING_RUNTIMES
from serving.server import Instance, LocalServerError, start, stop

DEFAULT_WORKDIR = REPO / "local_outputs" / "serve"


def local_instance(model_name: str, workdir: str | Path = "", config: str | Path = "") -> Instance:
    """The Instance for a workdir/config pair; '' picks local_outputs/serve and the project's config."""
    return Instance(Path(workdir or DEFAULT_WORKDIR).resolve(), Path(config or CONFIG_FILE).resolve(), model_name)


def serve_archive(model_store: Path, model_name: str, workdir: str | Path = "", config: str | Path = "",
                  timeout_s: float = 180.0, runtime: str = DEFAULT_SERVING_RUNTIME) -> Instance:
    """Serve `<model_store>/<model_name>.mar` on `runtime` (serving.runtimes.SERVING_RUNTIMES), replacing whatever
    server runs for that workdir.

    One server per workdir: stopping the old one (either runtime) first frees its ports, so the new
    archive can take them; the call returns only once a worker of the model is READY.
    """
    if runtime not in SERVING_RUNTIMES:
        raise LocalServerError(f"serving runtime {runtime!r} is not one of {', '.join(SERVING_RUNTIMES)}")
    instance = local_instance(model_name, workdir, config)
    if not (Path(model_store) / f"{model_name}.mar").is_file():
        raise LocalServerError(f"{Path(model_store) / f'{model_name}.mar'} not found")
    if not instance.config.is_file():
        raise LocalServerError(f"{instance.config}: TorchServe config not found")
    instance.workdir.mkdir(parents=True, exist_ok=True)
    if stop(instance):
        print(f"stopped the server previously running for {instance.workdir}")
    models = f"{model_name}={model_name}.mar"
    if runtime == "python":
        from serving import python_server

        python_server.start(instance, Path(model_store).resolve(), models, timeout=timeout_s)
    else:
        start(instance, Path(model_store).resolve(), models=models, timeout=timeout_s)
    return instance
