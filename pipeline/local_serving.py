"""Deploy target `local`: serve a freshly built archive with the project's TorchServe lifecycle."""

from __future__ import annotations

from pathlib import Path

from settings import CONFIG_FILE, REPO
from serving.server import Instance, LocalServerError, start, stop

DEFAULT_WORKDIR = REPO / "local_outputs" / "serve"


def local_instance(model_name: str, workdir: str | Path = "", config: str | Path = "") -> Instance:
    """The Instance for a workdir/config pair; '' picks local_outputs/serve and the project's config."""
    return Instance(Path(workdir or DEFAULT_WORKDIR).resolve(), Path(config or CONFIG_FILE).resolve(), model_name)


def serve_archive(model_store: Path, model_name: str, workdir: str | Path = "", config: str | Path = "",
                  timeout_s: float = 180.0) -> Instance:
    """Serve `<model_store>/<model_name>.mar`, replacing whatever TorchServe runs for that workdir.

    One TorchServe per workdir: stopping the old one first frees its ports, so the new
    archive can take them; the call returns only once a worker of the model is READY.
    """
    instance = local_instance(model_name, workdir, config)
    if not (Path(model_store) / f"{model_name}.mar").is_file():
        raise LocalServerError(f"{Path(model_store) / f'{model_name}.mar'} not found")
    if not instance.config.is_file():
        raise LocalServerError(f"{instance.config}: TorchServe config not found")
    instance.workdir.mkdir(parents=True, exist_ok=True)
    if stop(instance):
        print(f"stopped the TorchServe previously running for {instance.workdir}")
    start(instance, Path(model_store).resolve(), models=f"{model_name}={model_name}.mar", timeout=timeout_s)
    return instance
