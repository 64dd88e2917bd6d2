"""Which image the compiled pipeline names, and which Kubeflow Pipelines backends that image runs on.

`python -m pipeline compile|submit` need an explicit image (`--image REF` or $PIPELINE_IMAGE). A
reference that `scripts/build-images.sh --push` recorded in build/images.json, with the digest the
registry returned, is pinned to that digest (`repo:tag@sha256:...`), so every task of a run pulls the
same bytes even if the tag moves. Nothing here imports kfp: the CLI resolves the image and sets
$PIPELINE_IMAGE before `pipeline.components` (which reads it at import) is first imported.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from settings import REPO

IMAGE_ENV = "PIPELINE_IMAGE"
IMAGES_JSON_ENV = "IMAGES_JSON"
DEFAULT_IMAGES_JSON = REPO / "build" / "images.json"

# The oldest Kubeflow Pipelines backend (API server / launcher release, healthz `tag_name`) whose tasks
# the pipeline image runs in. The image runs as uid 10001 (gid 0). KFP's launcher, running as that
# user inside the task container, writes artifacts under /gcs, /minio and /s3:
#  - backends before 2.3.0 mount nothing there (the emptyDir mounts came with kubeflow/pipelines#10857,
#    first released in 2.3.0), so `mkdir /minio` fails for a non-root user; the image pre-creates
#    the three directories owned by 10001:0, mode 775 (root Dockerfile), which covers 2.0.x-2.2.x;
#  - 2.0.0 and 2.0.1 also create the artifact subdirectories with mode 0644 (launcher_v2.go
#    `os.MkdirAll(dir, 0644)`, kubeflow/pipelines#7629), which the non-root user cannot enter, so
#    outputs fail with "permission denied" whatever the image holds; fixed by #9946 (0755), first
#    released in 2.0.2.
MIN_KFP_BACKEND = (2, 0, 2)
MIN_KFP_BACKEND_REASON = ("its launcher creates artifact directories with mode 0644, which this image's "
                          "non-root user (uid 10001) cannot enter (kubeflow/pipelines#7629, fixed in 2.0.2)")

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REPOSITORY = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


class ImageError(ValueError):
    """The image reference cannot be used; the message is one line (a usage error)."""


@dataclass(frozen=True)
class ImageRef:
    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        return self.repository + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


@dataclass(frozen=True)
class ResolvedImage:
    ref: str  # what the compiled executors name
    how: str  # one phrase: why this reference


def parse_ref(text: str) -> ImageRef:
    """`[host[:port]/]path[:tag][@sha256:hex]`, as a container engine accepts it."""
    rest, _, digest = text.strip().partition("@")
    if digest and not _DIGEST.match(digest):
        raise ImageError(f"image {text!r}: the digest must be sha256: and 64 lowercase hex digits")
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    repository, tag = (rest[:colon], rest[colon + 1:]) if colon > slash else (rest, None)
    if not _REPOSITORY.match(repository) or (tag is not None and not _TAG.match(tag)):
        raise ImageError(f"image {text!r} is not a valid reference ([registry/]repository[:tag][@sha256:...], "
                         "repository in lowercase)")
    return ImageRef(repository, tag, digest or None)


def read_pipeline_entry(path: Path) -> dict | None:
    """build/images.json's "pipeline" entry; None when the file is absent or has no such entry."""
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text()).get("pipeline")
    except (OSError, ValueError, AttributeError) as exc:
        raise ImageError(f"cannot read {path}: {exc}") from None
    if entry is not None and not (isinstance(entry, dict) and isinstance(entry.get("ref"), str)):
        raise ImageError(f"{path}: the \"pipeline\" entry has no \"ref\"")
    return entry


def resolve(given: str | None, images_json: Path) -> ResolvedImage:
    """The reference the compiled pipeline names: `given`, pinned by digest when images_json knows it."""
    if not given or not given.strip():
        raise ImageError(f"no pipeline image: pass --image REF or set ${IMAGE_ENV} (scripts/build-images.sh "
                         "--push REGISTRY/PREFIX builds and pushes one and records it in build/images.json)")
    ref = parse_ref(given)
    if ref.digest:
        return ResolvedImage(str(ref), "pinned by digest as given")
    if ref.tag is None:
        return ResolvedImage(str(ref), "not pinned: no tag, so the cluster pulls :latest")
    entry = read_pipeline_entry(images_json)
    if entry is None:
        return ResolvedImage(str(ref), f"not pinned: no pipeline image in {_shown(images_json)}")
    built = parse_ref(entry["ref"])
    if built.repository != ref.repository or ref.tag not in (entry.get("tags") or [built.tag]):
        return ResolvedImage(str(ref), f"not pinned: {_shown(images_json)} records {entry['ref']}")
    digest = entry.get("digest")
    if not digest:
        return ResolvedImage(str(ref), f"not pinned: {_shown(images_json)} has no pushed digest for it "
                                       "(scripts/build-images.sh --push records one)")
    if not _DIGEST.match(digest):
        raise ImageError(f"{images_json}: pipeline digest {digest!r} is not sha256: and 64 hex digits")
    return ResolvedImage(str(ImageRef(ref.repository, ref.tag, digest)),
                         f"pinned to the digest {_shown(images_json)} records for {ref}")


def refuse_placeholder(ref: str, placeholder: str) -> None:
    """Any tag or digest of the placeholder's repository (pipeline.components' default) is refused."""
    if parse_ref(ref).repository == parse_ref(placeholder).repository:
        raise ImageError(f"{ref} is the placeholder image, which no registry serves: pass --image REF or set "
                         f"${IMAGE_ENV} to the image scripts/build-images.sh --push built")


def backend_version(tag_name: object) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a healthz `tag_name` such as "2.3.0" or "v2.0.5"; None if it names none."""
    match = _VERSION.match(tag_name) if isinstance(tag_name, str) else None
    return tuple(int(g) for g in match.groups()) if match else None  # type: ignore[return-value]


def version_text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)
