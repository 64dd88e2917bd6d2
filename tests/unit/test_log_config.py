"""The shipped log4j2 configuration, read as log4j reads it: appenders, loggers and rotation."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from settings import LOG_CONFIG_FILE

FILES = {"access_log": "access_log.log", "model_log": "model_log.log", "ts_log": "ts_log.log"}


@pytest.fixture(scope="module")
def config() -> ET.Element:
    return ET.parse(LOG_CONFIG_FILE).getroot()


def appenders(config: ET.Element) -> dict[str, ET.Element]:
    return {a.get("name"): a for a in config.find("Appenders")}


def loggers(config: ET.Element) -> dict[str, ET.Element]:
    """Logger elements by name; the root logger under ""."""
    return {("" if el.tag == "Root" else el.get("name")): el for el in config.find("Loggers")}


def reached(name: str, config: ET.Element) -> list[str]:
    """Appenders an event of logger `name` is written to, walking up the hierarchy while additivity holds."""
    by_name = loggers(config)
    out: list[str] = []
    while True:
        el = by_name.get(name)
        if el is not None:
            out += [ref.get("ref") for ref in el.findall("AppenderRef")]
            if el.get("additivity", "true") == "false":
                return out
        if name == "":
            return out
        name = name.rpartition(".")[0]


def test_each_file_has_its_own_appender(config):
    files = {name: el.get("fileName") for name, el in appenders(config).items() if el.tag == "RollingFile"}
    assert {name: path.rsplit("/", 1)[-1] for name, path in files.items()} == FILES
    assert all(path.startswith("${dir}/") for path in files.values())


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_file_rolls_at_10_mb_keeping_five(config, name):
    appender = appenders(config)[name]
    assert appender.find("SizeBasedTriggeringPolicy").get("size") == "10 MB"
    assert appender.find("DefaultRolloverStrategy").get("max") == "5"
    assert appender.get("filePattern") == f"${{dir}}/{FILES[name].removesuffix('.log')}.%i.log.gz"


@pytest.mark.parametrize("logger", ["ACCESS_LOG", "MODEL_LOG", "org.pytorch.serve", "org.pytorch.serve.wlm.WorkerThread",
                                    "org.pytorch.serve.http.HttpRequestHandler", "io.netty.channel", ""])
def test_no_event_reaches_an_appender_twice(config, logger):
    targets = reached(logger, config)
    assert len(targets) == len(set(targets)), targets


def test_each_kind_of_event_has_its_file(config):
    assert reached("ACCESS_LOG", config) == ["access_log"]
    assert reached("MODEL_LOG", config) == ["model_log", "console"]
    assert reached("org.pytorch.serve.wlm.WorkerLifeCycle", config) == ["ts_log", "console"]


def test_metric_logs_are_off_and_per_request_frontend_lines_filtered(config):
    by_name = loggers(config)
    assert by_name["TS_METRICS"].get("level") == by_name["MODEL_METRICS"].get("level") == "off"
    frontend = by_name["org.pytorch.serve"]
    assert frontend.get("level") == "info"
    regex = re.compile(frontend.find("RegexFilter").get("regex"))
    for chatter in ("result=[METRICS]EmbeddingBatchSize.Count:1|#ModelName:embedding", "Backend response time: 37",
                    "Registering auto detected backend metric: EmbeddingSearchMs.Milliseconds:4.9",
                    "Looping backend response at: 1795737071091", "Sending response for jobId b9285403"):
        assert regex.fullmatch(chatter), chatter
    for lifecycle in ("W-9000-embedding_1.0 Worker disconnected. WORKER_MODEL_LOADED", "Retry worker: 9000 in 1 seconds.",
                      "Load model failed: embedding, error: Worker died.", "Model embedding loaded."):
        assert not regex.fullmatch(lifecycle), lifecycle
    model = by_name["MODEL_LOG"].find("RegexFilter").get("regex")
    assert re.fullmatch(model, "Backend received inference at: 1795737071")
    assert not re.fullmatch(model, "batch=8 rejected=1 unknown=0 preprocess_ms=1.92")


def test_layouts_write_one_line_and_never_an_exception_message(config):
    properties = {p.get("name"): p.text for p in config.find("Properties")}
    for appender in appenders(config).values():
        layout = appender.find("PatternLayout")
        pattern = properties["event"] if layout.get("pattern") == "${event}" else layout.get("pattern")
        assert layout.get("alwaysWriteExceptions") == "false"
        assert "%enc{%m}{CRLF}" in pattern and "%m" not in pattern.replace("%enc{%m}", "")
        assert "%ex" not in pattern or "%replace{%notEmpty{ (%ex{short})}}" in pattern
