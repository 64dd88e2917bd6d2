"""Where things are and which ports they use: read from config.properties, the one source of truth."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
CONFIG_FILE = REPO / "config.properties"
MODEL_CONFIG_FILE = REPO / "model-config.yaml"
MODEL_NAME = "embedding"
MODEL_VERSION = "1.0"
DEFAULT_ARTIFACTS = REPO / "artifacts"
DEFAULT_MODEL_STORE = REPO / "model_store"
KEY_FILE = "key_file.json"


def read_properties(path: Path) -> dict[str, str]:
    """Java-style key=value file (comments and blank lines skipped)."""
    props: dict[str, str] = {}
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "!")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        props[key.strip()] = value.strip()
    return props


def write_properties(props: dict[str, str], path: Path) -> None:
    Path(path).write_text("".join(f"{k}={v}\n" for k, v in props.items()))


@dataclass(frozen=True)
class Endpoints:
    inference: str
    management: str
    metrics: str
    grpc_inference_port: int
    grpc_management_port: int

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> "Endpoints":
        return cls(
            inference=props.get("inference_address", "http://127.0.0.1:8080"),
            management=props.get("management_address", "http://127.0.0.1:8081"),
            metrics=props.get("metrics_address", "http://127.0.0.1:8082"),
            grpc_inference_port=int(props.get("grpc_inference_port", 7070)),
            grpc_management_port=int(props.get("grpc_management_port", 7071)),
        )

    def ports(self) -> dict[str, int]:
        return {
            "inference": urlsplit(self.inference).port or 80,
            "management": urlsplit(self.management).port or 80,
            "metrics": urlsplit(self.metrics).port or 80,
            "gRPC inference": self.grpc_inference_port,
            "gRPC management": self.grpc_management_port,
        }


def with_ports(props: dict[str, str], inference: int, management: int, metrics: int,
               grpc_inference: int, grpc_management: int) -> dict[str, str]:
    """A copy of `props` listening on other loopback ports (tests run beside a user's server)."""
    out = dict(props)
    out.update({
        "inference_address": f"http://127.0.0.1:{inference}",
        "management_address": f"http://127.0.0.1:{management}",
        "metrics_address": f"http://127.0.0.1:{metrics}",
        "grpc_inference_port": str(grpc_inference),
        "grpc_management_port": str(grpc_management),
    })
    return out
