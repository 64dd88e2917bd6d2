"""What a ``--data-source`` names, parsed in one place (standard library only: the pipeline's checks at submission
time and run-local's path checks use it without loading any data).

Forms, one :data:`KINDS` entry each: the bundled ``mnist-sample``; ``download:NAME`` (fetched into the cache);
a local folder, ``idx:DIR``, ``folder:DIR`` or a bare ``DIR`` (IDX files); a storage URI, ``s3://``, ``gs://``
or ``pvc://CLAIM/PATH``, alone (IDX layout) or after ``idx:`` / ``folder:``. Loading is
:func:`training.data.load_dataset`'s; the URI's own syntax is :func:`training.data.remote.parse_uri`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from settings import DEFAULT_DATA_SOURCE

#: How a source's files are laid out: IDX files, or one folder of images per label.
LAYOUTS = ("idx", "folder")
SAMPLE, DOWNLOAD, LOCAL, STORAGE = "sample", "download", "local", "storage"
#: kind -> what it reads.
KINDS = {SAMPLE: "the images bundled with the project", DOWNLOAD: "a download into the cache",
         LOCAL: "a folder on this machine", STORAGE: "a bucket or a claim (s3://, gs://, pvc://)"}
PVC_SCHEME = "pvc://"


@dataclass(frozen=True)
class Source:
    """One parsed data source: its kind (:data:`KINDS`), layout (:data:`LAYOUTS`, "" when the name says none:
    a bare folder or URI is read as IDX) and location (the folder, the URI, or the download's name)."""

    text: str
    kind: str
    layout: str
    location: str

    @property
    def local_path(self) -> Path | None:
        """The folder on this machine a local source reads; None for every other kind."""
        return Path(self.location) if self.kind == LOCAL else None

    @property
    def uses_cache(self) -> bool:
        """Whether loading it reads (and fills) the download cache."""
        return self.kind in (DOWNLOAD, STORAGE)

    @property
    def claim(self) -> str | None:
        """The PersistentVolumeClaim a ``pvc://`` source reads; None for every other source."""
        return pvc_claim(self.location) if self.kind == STORAGE else None


def parse_source(text: str) -> Source:
    """The :class:`Source` a ``--data-source`` value names (its form only: nothing is opened)."""
    if text == DEFAULT_DATA_SOURCE:
        return Source(text, SAMPLE, "", text)
    if text.startswith("download:"):
        return Source(text, DOWNLOAD, "idx", text.partition(":")[2])
    layout, colon, rest = text.partition(":")
    if not (colon and layout in LAYOUTS):
        layout, rest = "", text
    return Source(text, STORAGE if "://" in rest else LOCAL, layout, rest)


def pvc_claim(uri: str) -> str | None:
    """The claim of a ``pvc://CLAIM/PATH`` URI; None for any other URI."""
    return uri[len(PVC_SCHEME):].split("/", 1)[0] if uri.startswith(PVC_SCHEME) else None
