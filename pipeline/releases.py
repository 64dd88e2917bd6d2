"""The Kubeflow releases the project supports: one row each, the one table the version check, the tests and the docs
read. Adding a release is one row here (then `python -m pipeline.releases` for deploy/README.md's table).

Each row was read from the release itself:
- KFP backend: the api-server image tag in kubeflow/manifests at the Kubeflow tag
  (apps/pipeline/upstream/base/pipeline/kustomization.yaml, applications/... from 1.10.2 on);
- whether that image's healthz names its version: GET /apis/v2beta1/healthz answers `tag_name` from the image's
  TAG_NAME (backend/src/apiserver/main.go; backend/Dockerfile's default is "unknown"). kubeflow/pipelines 2.3.0 was
  built by .cloudbuild.yaml with `--build-arg TAG_NAME="$(cat /workspace/VERSION)"`; 2.4.1, 2.5.0 and 2.15.0 by
  GitHub workflows passing no build args (.github/workflows/image-builds.yml, build-and-push.yml at those tags), so
  they answer "unknown"; 2.16.0's build-and-push.yml passes TAG_NAME=<target tag>;
- KServe: the kserve-controller image tag in kubeflow/manifests at the Kubeflow tag;
- deployment-mode names: pkg/constants/constants.go in kserve/kserve at the KServe tag ("RawDeployment" /
  "Serverless" up to 0.15; 0.16.0 writes "Standard" / "Knative" and still accepts the old names,
  GetDeploymentMode in pkg/controller/v1beta1/inferenceservice/utils/utils.go).

Standard library only: `python -m pipeline submit` reads it before importing kfp.
"""

from __future__ import annotations

from dataclasses import dataclass

Version = tuple[int, int, int]

#: Deployment-mode names, (raw, knative): KServe up to 0.15, and from 0.16 on.
LEGACY_MODES = ("RawDeployment", "Serverless")
RENAMED_MODES = ("Standard", "Knative")


@dataclass(frozen=True)
class Release:
    kubeflow: str
    kfp: Version
    #: Whether the KFP API server image names its version in healthz (`tag_name`), or answers "unknown".
    kfp_names_version: bool
    kserve: str
    #: (raw, knative) as this KServe writes them (status.deploymentMode, the webhook's annotation).
    modes: tuple[str, str] = LEGACY_MODES
    #: Older (raw, knative) names this KServe still accepts in the deploymentMode annotation.
    accepts: tuple[str, str] | None = None

    @property
    def kfp_text(self) -> str:
        return ".".join(map(str, self.kfp))

    @property
    def healthz_tag(self) -> str:
        """The `tag_name` this release's KFP API server answers."""
        return self.kfp_text if self.kfp_names_version else "unknown"


RELEASES: tuple[Release, ...] = (
    Release("1.9.1", (2, 3, 0), True, "0.13.1"),
    Release("1.10.0", (2, 4, 1), False, "0.14.1"),
    Release("1.10.1", (2, 5, 0), False, "0.15.0"),
    Release("1.10.2", (2, 5, 0), False, "0.15.0"),
    Release("1.11.0", (2, 15, 0), False, "0.15.2"),
    Release("26.03", (2, 16, 0), True, "0.16.0", RENAMED_MODES, LEGACY_MODES),
)

OLDEST = min(RELEASES, key=lambda r: r.kfp)
NEWEST = max(RELEASES, key=lambda r: r.kfp)
#: Every KFP backend version the table names, oldest first.
KFP_VERSIONS: tuple[Version, ...] = tuple(sorted({r.kfp for r in RELEASES}))
#: Every KServe version the table names, oldest first.
KSERVE_VERSIONS: tuple[str, ...] = tuple(sorted({r.kserve for r in RELEASES},
                                                key=lambda v: tuple(map(int, v.split(".")))))
#: Every name a supported KServe gives, or accepts for, each deployment mode.
RAW_MODE_NAMES = frozenset(n for r in RELEASES for n in (r.modes[0], *(r.accepts or ())[:1]))
KNATIVE_MODE_NAMES = frozenset(n for r in RELEASES for n in (r.modes[1], *(r.accepts or ())[1:]))


def unnamed_kfp() -> list[Release]:
    """The releases whose KFP API server answers healthz without its version."""
    return [r for r in RELEASES if not r.kfp_names_version]


def markdown() -> str:
    """The docs' table of the supported releases (deploy/README.md, between the releases-table markers)."""
    rows = ["| Kubeflow | KFP backend | its healthz `tag_name` | KServe | deployment modes (raw / Knative) |",
            "|---|---|---|---|---|"]
    for r in RELEASES:
        modes = " / ".join(r.modes) + (f" (also {' / '.join(r.accepts)})" if r.accepts else "")
        rows.append(f"| {r.kubeflow} | {r.kfp_text} | {r.healthz_tag} | {r.kserve} | {modes} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
