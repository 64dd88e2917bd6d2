"""serving.kserve_runtime.nginx_front without a server: the rendered configuration is one nginx accepts, the control
socket's answer is read back into the histogram the alerts use, and a missing nginx is a one-line error."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.kserve_runtime import nginx_front
from serving.gateway_metrics import BUCKETS
from serving.kserve_runtime.nginx_front import (FrontError, FrontSettings, front_histogram, nginx_binary, parse_state,
                                                render)


def settings(tmp_path, **changes) -> FrontSettings:
    base = dict(host="0.0.0.0", port=8080, torchserve="http://127.0.0.1:8085", gateway_port=40123,
                model="embedding", versions=("1.0", "2.0"), default_version="1.0", max_request_size=8388608,
                response_timeout_s=30.0, require_key=True, buckets=BUCKETS, shutdown_timeout_s=18.0,
                runtime_dir=tmp_path)
    return FrontSettings(**{**base, **changes})


@pytest.mark.parametrize("changes", [{}, {"require_key": False, "host": "::", "versions": ("a]]b", "v[2]")}])
def test_rendered_config_passes_nginx_t(tmp_path, changes):
    """`nginx -t` parses it and runs init_by_lua (the lua module loads and the model's versions are a table)."""
    try:
        binary = nginx_binary()
    except FrontError as exc:
        pytest.skip(str(exc))
    conf = tmp_path / "nginx.conf"
    conf.write_text(render(settings(tmp_path, **changes)))
    done = subprocess.run([binary, "-t", "-p", str(tmp_path), "-e", "stderr", "-c", str(conf)],
                          capture_output=True, text=True, env={"INFERENCE_API_KEY": "k"}, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "test is successful" in done.stderr


def test_rendered_config_routes_inference_to_torchserve_and_the_rest_to_the_gateway(tmp_path):
    text = render(settings(tmp_path))
    assert "server 127.0.0.1:8085;" in text and "server 127.0.0.1:40123;" in text
    assert "listen 0.0.0.0:8080;" in text and f"listen unix:{tmp_path / 'control.sock'};" in text
    assert "client_max_body_size 8388608;" in text
    assert text.count("keepalive_timeout 0;") == 3  # one closing twin per route
    for route in ("location /predictions/ {", "location ~ ^/v1/models/[^/]+:predict$ {", "location / {"):
        assert route in text
    assert 'access_by_lua_block { front.access("@predictions_closing") }' in text


def test_control_answer_becomes_the_request_histogram():
    buckets = (0.01, 0.1)
    state = parse_state("drain serving\nin_flight 2\nsince_last_arrival 0.25\n"
                        "h|1.0|200|1 3\nh|1.0|200|2 1\nh|1.0|200|3 1\nh|1.0|200|sum 2.51\nh|1.0|503|3 2\n"
                        "h|1.0|503|sum 61\n", len(buckets))
    assert (state.drain, state.in_flight, state.since_last_arrival) == ("serving", 2, 0.25)
    assert state.histogram[("1.0", "200")] == ([3, 1, 1], 2.51)
    text = front_histogram(state, "embedding", buckets).decode()
    samples = {(s.name, s.labels.get("code"), s.labels.get("le")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("embedding_request_duration_seconds_bucket", "200", "0.01")] == 3
    assert samples[("embedding_request_duration_seconds_bucket", "200", "0.1")] == 4
    assert samples[("embedding_request_duration_seconds_bucket", "200", "+Inf")] == 5
    assert samples[("embedding_request_duration_seconds_count", "200", None)] == 5
    assert samples[("embedding_request_duration_seconds_sum", "503", None)] == 61
    assert samples[("embedding_request_duration_seconds_bucket", "503", "0.1")] == 0


def test_missing_nginx_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(nginx_front.os, "access", lambda path, mode: False)
    with pytest.raises(FrontError, match="^nginx not found: install the Debian packages nginx "
                                         "libnginx-mod-http-lua, or pass --front aiohttp$"):
        nginx_binary()
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/sbin/nginx")
    monkeypatch.setattr(nginx_front, "MODULES_DIR", tmp_path)
    with pytest.raises(FrontError, match="ndk_http_module.so, .*ngx_http_lua_module.so not found"):
        nginx_binary()
