"""training.params: the build's parameters defined once, so `python -m training` and the pipeline build the same
model from the same words (#38): the pipeline's table holds the training table's entries, the compiled train and
evaluate tasks take each of them from the run parameter of the same name, and both routes make the same
TrainConfig from the same values."""

from __future__ import annotations

import pytest

from pipeline import params as P
from training.__main__ import parse_args
from training.params import AUTO, CONFIG_FIELDS, NAMES, TRAINING_PARAMS, train_config
from training.train import TrainConfig

#: Every training parameter away from its default.
WORDS = {"preprocessing": "digits", "epochs": 3, "embedding_dim": 16, "width": 8, "batch_size": 64, "lr": 0.01,
         "seed": 7, "index_type": "hnsw", "k": 3, "open_set_score": "kth_distance", "kth": 9, "negatives": 0,
         "printed": 120, "oe_weight": 0.5, "oe_loss": "uniform", "oe_margin": 0.1, "quantize": "none",
         "precision": "bf16"}


def cli_words(values: dict) -> list[str]:
    return [arg for name, value in values.items() for arg in (f"--{name.replace('_', '-')}", str(value))]


def test_the_pipeline_table_holds_the_training_table_itself():
    assert set(WORDS) == set(NAMES)
    pipeline_params = {p.name: p for p in P.PARAMS}
    assert all(pipeline_params[p.name] is p for p in TRAINING_PARAMS)


def test_the_cli_and_the_pipeline_make_the_same_config_from_the_same_words():
    from_cli = parse_args(cli_words(WORDS))
    from_pipeline = P.validate(dict(WORDS))
    assert {name: getattr(from_cli, name) for name in NAMES} == {name: from_pipeline[name] for name in NAMES}
    config = train_config(vars(from_cli))
    assert config == train_config(from_pipeline)
    assert config != TrainConfig() and config.printed == 120 and config.lr == 0.01 and config.oe_loss == "uniform"


def test_auto_pool_sizes_are_none_in_the_config_and_a_size_below_auto_is_refused(capsys):
    config = train_config(vars(parse_args([])))
    assert config.negatives is None and config.printed is None and AUTO == -1
    assert config == TrainConfig()  # every other default is TrainConfig's own
    with pytest.raises(SystemExit):
        parse_args(["--negatives", "-2"])
    assert capsys.readouterr().err.strip() == \
        "python -m training: error: argument --negatives: '-2': must be -1 (auto), 0 (off) or a size"
    with pytest.raises(P.ParamError, match="negatives=-2: must be -1"):
        P.validate({"negatives": -2})


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict:
    """The compiled default package's task specs, as `python -m pipeline compile` writes them."""
    from pipeline.cli import _compile, _documents
    from pipeline.options import CompileOptions

    path, _, _ = _compile(tmp_path_factory.mktemp("package") / "pipeline.yaml", "registry.local/mnist:dev",
                          CompileOptions())
    pipeline_spec, _ = _documents(path)
    return pipeline_spec["root"]["dag"]["tasks"]


@pytest.mark.parametrize("task, names", [("train", (*CONFIG_FIELDS, "k")), ("evaluate", ("k", "open_set_score", "kth")),
                                         ("build-index", ("index_type", "seed")), ("load-data", ("preprocessing",))])
def test_each_task_takes_the_run_parameter_of_the_same_name(tasks, task, names):
    bound = tasks[task]["inputs"]["parameters"]
    for name in names:
        assert bound[name]["componentInputParameter"] == name, (task, name)
