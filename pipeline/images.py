"""Which image the compiled pipeline names.

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

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REPOSITORY = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


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


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)
