"""KServe's storage-initializer code of the KServe releases the project supports (pipeline.releases) and of the
newest upstream, each in its own virtual environment (scripts/kserve-storage-venv.sh <requirements>), and the S3
settings each one reads. `STORAGE` says which exercised code each supported KServe release runs (`for_release`); a
supported release it does not list is named by `unexercised()`, which the docs state.

The table was written after reading each release's storage module (named in `source`); the tests check it against
the module installed in that environment (`s3_settings_in`), so a release that reads other variables fails there
instead of passing on assumptions. KServe's controller (s3_secret.go) turns a Secret's annotations into more
variables than the storage code reads (S3_ENDPOINT and S3_USE_HTTPS too); the download gets only those the release
reads, plus the credentials botocore itself reads.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from support.venvs import venv_python

from pipeline.releases import KSERVE_VERSIONS


@dataclass(frozen=True)
class KServeStorage:
    version: str
    requirements: str
    #: The distribution, and the module holding `Storage` as that release's storage initializer imports it.
    dist: str
    module: str
    #: The module's file inside site-packages.
    file: str
    #: Where the module was read: the repository path at the release's tag, or the wheel's file.
    source: str
    #: S3 variables the module reads itself (os.getenv / os.environ.get).
    s3_env: frozenset[str]
    #: STORAGE_CONFIG (an InferenceService's `storage:` spec, as JSON) key -> the variable it sets.
    storage_config: dict[str, str]


_STORAGE_CONFIG = {"endpoint_url": "AWS_ENDPOINT_URL", "access_key_id": "AWS_ACCESS_KEY_ID",
                   "secret_access_key": "AWS_SECRET_ACCESS_KEY", "region": "AWS_DEFAULT_REGION",
                   "ca_bundle": "AWS_CA_BUNDLE", "verify_ssl": "S3_VERIFY_SSL", "anonymous": "awsAnonymousCredential"}
_S3_ENV_0_13 = frozenset({"AWS_ENDPOINT_URL", "AWS_CA_BUNDLE", "S3_VERIFY_SSL", "CA_BUNDLE_CONFIGMAP_NAME",
                          "CA_BUNDLE_VOLUME_MOUNT_POINT", "awsAnonymousCredential", "S3_USER_VIRTUAL_BUCKET",
                          "S3_USE_ACCELERATE"})

OLDEST = KServeStorage(
    "0.13.1", "requirements/kserve-storage-0.13.txt", "kserve", "kserve.storage", "kserve/storage/storage.py",
    "kserve/kserve python/kserve/kserve/storage/storage.py at tag v0.13.1 (inside the kserve package)",
    _S3_ENV_0_13, _STORAGE_CONFIG)
#: Kubeflow 1.10.1-1.11.0's: 0.15.2 also reads AWS_DEFAULT_REGION itself (the S3 client config, for the legacy endpoint).
KSERVE_0_15 = KServeStorage(
    "0.15.2", "requirements/kserve-storage-0.15.txt", "kserve", "kserve.storage", "kserve/storage/storage.py",
    "kserve/kserve python/kserve/kserve/storage/storage.py at tag v0.15.2 (inside the kserve package)",
    _S3_ENV_0_13 | {"AWS_DEFAULT_REGION"}, _STORAGE_CONFIG)
NEWEST = KServeStorage(
    "0.21.0", "requirements/kserve-storage.txt", "kserve-storage", "kserve_storage", "kserve_storage/kserve_storage.py",
    "kserve_storage/kserve_storage.py in the kserve-storage 0.21.0 wheel (python/storage/ in kserve/kserve)",
    _S3_ENV_0_13 | {"AWS_DEFAULT_REGION", "S3_CONNECT_TIMEOUT", "S3_READ_TIMEOUT", "S3_MAX_ATTEMPTS",
                    "S3_MAX_FILE_CONCURRENCY"},
    _STORAGE_CONFIG)
VERSIONS = (OLDEST, KSERVE_0_15, NEWEST)

#: Supported KServe release (pipeline.releases) -> the exercised storage code it runs: its own, or one whose
#: storage module is the same file at both tags (`git diff v0.15.0 v0.15.2 -- python/kserve/kserve/storage/`
#: in kserve/kserve is empty).
STORAGE: dict[str, KServeStorage] = {"0.13.1": OLDEST, "0.15.0": KSERVE_0_15, "0.15.2": KSERVE_0_15}


def for_release(kserve: str) -> KServeStorage | None:
    """The exercised storage code a supported KServe release runs, None where none is."""
    return STORAGE.get(kserve)


def unexercised() -> list[str]:
    """The supported KServe releases (pipeline.releases) whose storage code no test runs."""
    return [version for version in KSERVE_VERSIONS if version not in STORAGE]

#: Read by botocore, not by KServe's code: what a storage Secret's data gives the storage initializer.
BOTOCORE_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"})
_S3_NAME = re.compile(r"^(AWS_|S3_|CA_BUNDLE_|aws)")
_GETENV = re.compile(r"os\.(?:getenv|environ\.get)\(\s*\"([A-Za-z0-9_]+)\"")
_SPEC_PAIR = re.compile(r"\(\s*\"([A-Za-z0-9_]+)\",\s*\"([a-z_]+)\"\s*\)")


def installed(release: KServeStorage) -> tuple[str, Path]:
    """The installed release's version and the file of its storage module."""
    code = ("import importlib.metadata as m, sys; d = m.distribution(sys.argv[1]); "
            "print(d.version, d.locate_file(sys.argv[2]))")
    result = subprocess.run([venv_python(release.requirements), "-c", code, release.dist, release.file],
                            capture_output=True, text=True, timeout=60, check=True)
    version, origin = result.stdout.split()
    return version, Path(origin)


def s3_settings_in(source: str) -> tuple[frozenset[str], dict[str, str]]:
    """What a storage module's source reads: its S3 variables, and the STORAGE_CONFIG keys it maps to variables."""
    start = source.index("def _update_with_storage_spec")
    body = source[start:source.index("\n    def ", start)]
    return (frozenset(n for n in _GETENV.findall(source) if _S3_NAME.match(n)),
            {key: name for name, key in _SPEC_PAIR.findall(body)})


def download(release: KServeStorage, uri: str, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`Storage.download(uri, out)` as that release's storage initializer runs it, in exactly `env` (no other
    variables of this process leak in)."""
    code = f"import sys; from {release.module} import Storage; print(Storage.download(sys.argv[1], sys.argv[2]))"
    return subprocess.run([venv_python(release.requirements), "-W", "ignore", "-c", code, uri, str(out)],
                          capture_output=True, text=True, timeout=180, env=env)


def storage_config(release: KServeStorage, values: dict[str, str]) -> str:
    """STORAGE_CONFIG for an S3 storage spec: `values` keyed by the variables, written with the release's keys."""
    by_variable = {name: key for key, name in release.storage_config.items()}
    return json.dumps({"type": "s3", **{by_variable[name]: value for name, value in values.items()}})
