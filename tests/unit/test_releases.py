"""pipeline.releases, the one table of supported Kubeflow releases: what it holds, and that the docs, the KServe
storage and composition tables and the backend floor read the same rows."""

from __future__ import annotations

import re

from pipeline import kfp_backend, releases
from settings import REPO

README = REPO / "deploy" / "README.md"


def _versions_section() -> str:
    text = README.read_text()
    return text[text.index("## Versions\n"):text.index("\n## ", text.index("## Versions\n") + 1)]


def test_the_matrix_reaches_kubeflow_1_11_and_26_03():
    """What Kubeflow ships, read from kubeflow/manifests at each tag (the api-server and kserve-controller image
    tags)."""
    shipped = {r.kubeflow: (r.kfp_text, r.kserve) for r in releases.RELEASES}
    assert shipped == {"1.9.1": ("2.3.0", "0.13.1"), "1.10.0": ("2.4.1", "0.14.1"), "1.10.1": ("2.5.0", "0.15.0"),
                       "1.10.2": ("2.5.0", "0.15.0"), "1.11.0": ("2.15.0", "0.15.2"),
                       "26.03": ("2.16.0", "0.16.0")}


def test_kserve_0_16_renames_the_modes_and_still_accepts_the_old_names():
    by_kserve = {r.kserve: r for r in releases.RELEASES}
    assert by_kserve["0.16.0"].modes == ("Standard", "Knative")
    assert by_kserve["0.16.0"].accepts == ("RawDeployment", "Serverless")
    assert all(r.modes == ("RawDeployment", "Serverless") and r.accepts is None
               for r in releases.RELEASES if r.kserve != "0.16.0")
    assert releases.RAW_MODE_NAMES == {"RawDeployment", "Standard"}
    assert releases.KNATIVE_MODE_NAMES == {"Serverless", "Knative"}


def test_the_backend_floor_is_the_tables_oldest():
    assert kfp_backend.OLDEST == releases.OLDEST.kfp == min(releases.KFP_VERSIONS)
    assert releases.OLDEST.kubeflow == "1.9.1" and releases.NEWEST.kubeflow == "26.03"
    assert all(feature.since <= releases.NEWEST.kfp for feature in kfp_backend.FEATURES.values())


def test_which_backends_name_their_version():
    """healthz `tag_name` is the image's TAG_NAME: set for 2.3.0 (.cloudbuild.yaml) and 2.16.0 (build-and-push.yml
    passes target_tag), left at backend/Dockerfile's "unknown" by the 2.4.1, 2.5.0 and 2.15.0 image workflows."""
    assert [(r.kubeflow, r.healthz_tag) for r in releases.RELEASES] == [
        ("1.9.1", "2.3.0"), ("1.10.0", "unknown"), ("1.10.1", "unknown"), ("1.10.2", "unknown"),
        ("1.11.0", "unknown"), ("26.03", "2.16.0")]
    assert [r.kubeflow for r in releases.unnamed_kfp()] == ["1.10.0", "1.10.1", "1.10.2", "1.11.0"]


def test_the_docs_table_is_the_code_table():
    section = _versions_section()
    table = re.search(r"<!-- releases table: python -m pipeline.releases -->\n(.*?)<!-- end of releases table -->",
                      section, re.S)
    assert table, "deploy/README.md's Versions section has no releases table between its markers"
    assert table.group(1) == releases.markdown(), "regenerate it: python -m pipeline.releases"


def test_the_docs_name_the_kserve_storage_code_not_exercised():
    from support.kserve_versions import for_release, unexercised

    section = _versions_section()
    assert unexercised() == ["0.14.1", "0.16.0"]
    assert all(f"{version}'s" in section for version in unexercised())
    assert {v: for_release(v).version for v in releases.KSERVE_VERSIONS if for_release(v)} == {
        "0.13.1": "0.13.1", "0.15.0": "0.15.2", "0.15.2": "0.15.2"}



def test_kserve_compose_models_the_tables_kserve_releases():
    """tests/support/kserve_compose.py keeps its own per-KServe pins (Knative, Kubernetes API); its KServe versions
    and mode names must be the table's, so a new row without its composition fails here."""
    from support.kserve_compose import KSERVE_RELEASES

    assert [r.kserve for r in KSERVE_RELEASES] == list(releases.KSERVE_VERSIONS)
    assert {r.kserve: r.mode_names for r in KSERVE_RELEASES} == {r.kserve: r.modes for r in releases.RELEASES}
