"""`python -m serving start|stop|status|predict|samples`: run the model with the project's config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from settings import CONFIG_FILE, DEFAULT_MODEL_STORE, MODEL_NAME, REPO
from .server import Instance, ServerError, model_status, start, stop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m serving", description=__doc__)
    p.add_argument("--config", type=Path, default=CONFIG_FILE, help="TorchServe config.properties")
    p.add_argument("--workdir", type=Path, default=REPO, help="where logs/ and key_file.json go")
    p.add_argument("--model-name", default=MODEL_NAME)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="start TorchServe and wait until the model's workers are READY")
    s.add_argument("--model-store", type=Path, default=DEFAULT_MODEL_STORE)
    s.add_argument("--timeout", type=float, default=120.0)
    sub.add_parser("stop", help="stop TorchServe and its workers")
    sub.add_parser("status", help="describe the model's versions and workers")
    pr = sub.add_parser("predict", help="classify image files over REST with the inference token")
    pr.add_argument("images", nargs="+", type=Path)
    sm = sub.add_parser("samples", help="write sample digit PNGs")
    sm.add_argument("--out", type=Path, default=REPO / "samples")
    args = p.parse_args(argv)
    instance = Instance(args.workdir.resolve(), args.config.resolve(), args.model_name)
    try:
        return _run(args, instance)
    except ServerError as exc:
        print(f"serving: error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, instance: Instance) -> int:
    if args.command == "start":
        seconds = start(instance, args.model_store.resolve(), timeout=args.timeout)
        url = instance.endpoints.inference
        print(f"TorchServe READY in {seconds:.1f}s: {url}/predictions/{instance.model_name}")
        print(f"tokens: {instance.key_file} (inference key under \"inference\")")
        print("try:  curl -H \"Authorization: Bearer $(python3 -c 'import json;print(json.load(open("
              f"\"{instance.key_file}\"))[\"inference\"][\"key\"])')\" "
              f"-T samples/digit_7.png {url}/predictions/{instance.model_name}")
        print("stop: .venv/bin/python -m serving stop")
        return 0
    if args.command == "stop":
        print("TorchServe stopped" if stop(instance) else "TorchServe was not running")
        return 0
    if args.command == "status":
        if instance.pid() is None:
            print("TorchServe is not running")
            return 3
        print(json.dumps(model_status(instance), indent=2))
        return 0
    if args.command == "samples":
        from .samples import write_samples

        for path in write_samples(args.out):
            print(path)
        return 0
    from client.api import EmbeddingClient
    from client.errors import BadImageError, ClientError

    failed = 0
    try:
        with EmbeddingClient(instance.endpoints.inference, model=instance.model_name,
                             token=instance.keys().get("inference")) as client:
            for image in args.images:
                try:
                    data = image.read_bytes()
                except OSError as exc:
                    raise ServerError(f"{image}: {exc.strerror}") from None
                try:
                    answer = client.predict(data)
                except BadImageError as exc:  # this image was refused: say why and go on with the others
                    answer = exc.answer()
                failed += "error" in answer
                print(json.dumps({"image": str(image), **answer}))
    except ClientError as exc:
        raise ServerError(str(exc)) from None
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
