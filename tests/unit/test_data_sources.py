"""training.data.sources: every --data-source form parsed once, as loading, path checks and the pipeline's claim
check read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_common import UsageError
from pipeline import params as P
from pipeline.preflight import check_outputs
from training.data.sources import DOWNLOAD, LOCAL, SAMPLE, STORAGE, parse_source, pvc_claim
from training.outputs import source_reads


@pytest.mark.parametrize("text,kind,layout,location,local,claim", [
    ("mnist-sample", SAMPLE, "", "mnist-sample", None, None),
    ("download:mnist", DOWNLOAD, "idx", "mnist", None, None),
    ("idx:/data/mnist", LOCAL, "idx", "/data/mnist", Path("/data/mnist"), None),
    ("folder:imgs", LOCAL, "folder", "imgs", Path("imgs"), None),
    ("data/mnist", LOCAL, "", "data/mnist", Path("data/mnist"), None),
    ("s3://bucket/sets/mnist", STORAGE, "", "s3://bucket/sets/mnist", None, None),
    ("folder:gs://bucket/digits", STORAGE, "folder", "gs://bucket/digits", None, None),
    ("idx:pvc://training-data/mnist", STORAGE, "idx", "pvc://training-data/mnist", None, "training-data"),
    ("C:/odd:name", LOCAL, "", "C:/odd:name", Path("C:/odd:name"), None),
])
def test_each_form_is_parsed_once_for_every_reader(text, kind, layout, location, local, claim):
    source = parse_source(text)
    assert (source.kind, source.layout, source.location, source.local_path, source.claim) == \
        (kind, layout, location, local, claim)
    assert source.uses_cache == (kind in (DOWNLOAD, STORAGE))


def test_what_loading_reads_is_the_local_folder_or_the_cache(tmp_path):
    assert source_reads("folder:imgs") == [Path("imgs")]
    assert source_reads("download:mnist", tmp_path) == [tmp_path]
    assert source_reads("mnist-sample") == [] and source_reads(None) == []


def test_the_pipeline_takes_the_serving_claim_from_the_storage_uri():
    assert pvc_claim("pvc://models/embedding") == "models" and pvc_claim("s3://models/embedding") is None
    values = P.validate({**P.DEFAULTS, "deploy_target": "kserve", "kserve_storage_uri": "pvc://models/embedding"})
    assert values["kserve_pvc_claim"] == "models"


def test_run_local_refuses_a_workdir_inside_the_data_folder_it_reads(tmp_path):
    data = tmp_path / "digits"
    (data / "7").mkdir(parents=True)
    with pytest.raises(UsageError, match=f"the command reads from {data}; name a separate folder"):
        check_outputs(data / "runs", "", f"folder:{data}")
    check_outputs(tmp_path / "runs", "", f"folder:{data}")
