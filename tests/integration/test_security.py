"""Security: tokens, key file, loopback listeners, model API, size and pixel limits, token rotation, and static
checks that nothing unpickles and that the handler loads artifacts only after verifying their checksums.

The server tests use this module's own TorchServe (token rotation changes its keys).
"""

from __future__ import annotations

import ast
import io
import ipaddress
import json
import os
import stat
import textwrap
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest
import yaml
from support.torchserve import running_instance
from support.hostile import OCTET, png_claiming, post, post_oversized
from serving.samples import user_digit_png
from PIL import Image

from handler.preprocessing import InvalidImageError, decode_image
from settings import CONFIG_FILE, MODEL_CONFIG_FILE, REPO, read_properties

TOKEN_EXPIRATION_MIN = 7  # not the default 60: proves the setting is honoured


@pytest.fixture(scope="module")
def server(model_store, tmp_path_factory):
    with running_instance(tmp_path_factory.mktemp("security-ts"), model_store,
                          token_expiration_min=str(TOKEN_EXPIRATION_MIN)) as instance:
        yield instance


@pytest.fixture(scope="module")
def digit(prepared_sample) -> bytes:
    return user_digit_png(prepared_sample.test_images[0])


def call(url: str, token: str | None = None, method: str = "GET", data: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    hdrs = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def refused(status: int, body: bytes) -> bool:
    return status == 400 and json.loads(body)["type"] == "InvalidKeyException"


# --- tokens ------------------------------------------------------------------------------------------------------


@pytest.mark.serving
@pytest.mark.parametrize("key", [None, "wrong-token", "management", "API", "inference"])
def test_inference_accepts_only_the_inference_key(server, digit, key):
    keys = server.keys()
    token = keys.get(key, key)
    status, body = call(f"{server.endpoints.inference}/predictions/{server.model_name}", token, "POST", digit, OCTET)
    if key == "inference":
        assert status == 200 and json.loads(body)["pred"]
    else:
        assert refused(status, body), (status, body[:200])


@pytest.mark.serving
@pytest.mark.parametrize("key", [None, "wrong-token", "inference", "API", "management"])
def test_management_accepts_only_the_management_key(server, key):
    keys = server.keys()
    status, body = call(f"{server.endpoints.management}/models/{server.model_name}", keys.get(key, key))
    if key == "management":
        assert status == 200 and json.loads(body)[0]["modelName"] == server.model_name
    else:
        assert refused(status, body), (status, body[:200])


@pytest.mark.serving
def test_what_answers_without_a_token(server):
    """Recorded surface: /ping needs the token; the API descriptions and the metrics port do not."""
    assert refused(*call(f"{server.endpoints.inference}/ping"))
    assert call(f"{server.endpoints.inference}/ping", server.keys()["inference"])[0] == 200
    for base in (server.endpoints.inference, server.endpoints.management):
        status, body = call(f"{base}/", method="OPTIONS")
        assert status == 200 and json.loads(body)["openapi"]
    assert call(f"{server.endpoints.metrics}/metrics")[0] == 200


@pytest.mark.serving
def test_metrics_port_needs_no_token_and_exposes_no_secret(server, digit):
    keys = server.keys()
    post(f"{server.endpoints.inference}/predictions/{server.model_name}", digit, OCTET, keys["inference"])
    status, body = call(f"{server.endpoints.metrics}/metrics")
    text = body.decode()
    assert status == 200 and "ts_inference_requests_total" in text and "EmbeddingBatchSize" in text
    assert not [name for name, key in keys.items() if key in text]


@pytest.mark.serving
def test_key_file_is_private_and_keys_expire_as_configured(server):
    info = os.stat(server.key_file)
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
    entries = json.loads(server.key_file.read_text())
    assert set(entries) == {"inference", "management", "API"}
    assert len({entry["key"] for entry in entries.values()}) == 3
    now = datetime.now(UTC)
    for name in ("inference", "management"):
        expires = datetime.fromisoformat(entries[name]["expiration time"][:19]).replace(tzinfo=UTC)
        assert abs(expires - (now + timedelta(minutes=TOKEN_EXPIRATION_MIN))) < timedelta(minutes=2), expires
    assert "expiration time" not in entries["API"]


# --- listeners, model API, limits --------------------------------------------------------------------------------


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip == ipaddress.ip_address("127.0.0.1")


def test_loopback_check_refuses_wildcard_and_external_addresses():
    assert loopback("127.0.0.1") and loopback("::ffff:127.0.0.1")
    assert not any(loopback(a) for a in ("0.0.0.0", "::", "::1", "10.0.0.5", "::ffff:10.0.0.5"))


@pytest.mark.serving
def test_every_listener_is_on_ipv4_loopback(server):
    """TorchServe holds every port of the config but the inference one, which its front holds, and its inference
    API on one private port; all on loopback."""
    frontend, front = psutil.Process(server.pid()), psutil.Process(server.front_pid())
    listening = [c.laddr for c in frontend.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    fronting = [c.laddr for c in front.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    ports = server.endpoints.ports()
    assert [port for _, port in fronting] == [ports.pop("inference")]
    private = {port for _, port in listening} - set(ports.values())
    assert len(private) == 1 and len(listening) == len(ports) + 1
    assert all(loopback(ip) for ip, _ in listening + fronting), (listening, fronting)
    workers = frontend.children(recursive=True)
    assert workers
    for worker in workers:  # workers talk to the frontend over unix sockets only
        assert not [c for c in worker.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]


def test_project_config_binds_loopback_and_keeps_tokens_and_model_api_safe():
    props = read_properties(CONFIG_FILE)
    for key in ("inference_address", "management_address", "metrics_address"):
        assert props[key].startswith("http://127.0.0.1:"), key
    assert props["grpc_inference_address"] == props["grpc_management_address"] == "127.0.0.1"
    assert props["disable_token_authorization"] == "false"
    assert props["enable_model_api"] == "false"
    assert props["install_py_dep_per_model"] == "false"
    assert int(props["max_request_size"]) == 8 * 1024 * 1024


@pytest.mark.serving
def test_model_api_is_off(server):
    token = server.keys()["management"]
    management = server.endpoints.management
    assert call(f"{management}/models?url=embedding.mar", token, "POST", b"")[0] == 405
    assert call(f"{management}/models/{server.model_name}", token, "DELETE")[0] == 405
    assert call(f"{management}/models/{server.model_name}", token)[0] == 200  # still registered


@pytest.mark.serving
def test_request_size_limit_is_exact(server):
    """A body of exactly max_request_size reaches the handler; one byte more is refused by the frontend."""
    url = f"{server.endpoints.inference}/predictions/{server.model_name}"
    token = server.keys()["inference"]
    limit = int(read_properties(server.config)["max_request_size"])
    at_limit = post(url, b"\0" * limit, OCTET, token)
    assert at_limit.status == 400 and at_limit.from_handler and "not an image" in at_limit.message
    assert post_oversized(url, OCTET, token, limit + 1).status == 413


@pytest.mark.serving
def test_pixel_limit_is_the_one_in_model_config(server):
    limit = yaml.safe_load(MODEL_CONFIG_FILE.read_text())["handler"]["max_image_pixels"]
    url = f"{server.endpoints.inference}/predictions/{server.model_name}"
    token = server.keys()["inference"]
    over = post(url, png_claiming(1000, limit // 1000 + 1), OCTET, token)
    assert over.status == 413 and f"exceeds the limit of {limit}" in over.message
    at_limit = post(url, png_claiming(1000, limit // 1000), OCTET, token)  # header only: no pixel data follows
    assert at_limit.status == 400 and "truncated" in at_limit.message


@pytest.mark.serving
def test_worker_sockets_and_unpacked_models_stay_in_the_instance_directory(server):
    for worker in psutil.Process(server.pid()).children(recursive=True):
        cmdline = worker.cmdline()
        socket_path = Path(cmdline[cmdline.index("--sock-name") + 1])
        assert server.workdir in socket_path.parents, socket_path


@pytest.mark.serving
def test_token_rotation_replaces_one_key_and_invalidates_the_old_one(server, digit):
    """TorchServe 0.12: GET <management>/token?type=inference|management with the API key (runs last here)."""
    url = f"{server.endpoints.inference}/predictions/{server.model_name}"
    before = server.keys()
    assert refused(*call(f"{server.endpoints.management}/token?type=inference", before["management"]))
    assert call(f"{server.endpoints.management}/token?type=inference", before["API"])[0] == 200
    after = server.keys()
    assert after["inference"] != before["inference"]
    assert after["management"] == before["management"] and after["API"] == before["API"]
    assert refused(*call(url, before["inference"], "POST", digit, OCTET))
    assert call(url, after["inference"], "POST", digit, OCTET)[0] == 200
    assert call(f"{server.endpoints.management}/token?type=management", after["API"])[0] == 200
    rotated = server.keys()["management"]
    assert rotated != before["management"]
    assert refused(*call(f"{server.endpoints.management}/models", before["management"]))
    assert call(f"{server.endpoints.management}/models", rotated)[0] == 200


# --- decoders ----------------------------------------------------------------------------------------------------


def undocumented_formats() -> dict[str, bytes]:
    img = Image.new("L", (28, 28), 0)
    out = {}
    for fmt in ("PPM", "TGA", "PCX", "SGI", "ICO", "XBM"):
        buf = io.BytesIO()
        (img.convert("1") if fmt == "XBM" else img).save(buf, fmt)
        out[fmt] = buf.getvalue()
    return out


@pytest.mark.parametrize("fmt", sorted(undocumented_formats()))
def test_only_documented_image_formats_are_decoded(fmt):
    with pytest.raises(InvalidImageError):
        decode_image(undocumented_formats()[fmt])


# --- static checks -----------------------------------------------------------------------------------------------

PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def unsafe_calls(source: str) -> list[str]:
    """Deserialisation that can run code: pickle-family imports, torch.load, np.load(allow_pickle=True),
    yaml.load without a safe loader, yaml.unsafe_load, eval/exec."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in PICKLE_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PICKLE_MODULES:
            found.append(f"from {node.module} import")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch" and any(a.name == "load" for a in node.names):
            found.append("from torch import load")
        elif isinstance(node, ast.Call):
            name = dotted(node.func)
            keywords = {k.arg: k.value for k in node.keywords}
            if name == "torch.load":
                found.append(name)
            elif name.split(".")[-1] == "load" and name.split(".")[0] in ("np", "numpy"):
                flag = keywords.get("allow_pickle")
                if flag is not None and not (isinstance(flag, ast.Constant) and flag.value is False):
                    found.append(f"{name}(allow_pickle=...)")
            elif name in ("yaml.load", "yaml.load_all"):
                loader = dotted(keywords["Loader"]) if "Loader" in keywords else (
                    dotted(node.args[1]) if len(node.args) > 1 else "")
                if loader.split(".")[-1] not in ("SafeLoader", "CSafeLoader"):
                    found.append(f"{name} without SafeLoader")
            elif name in ("yaml.unsafe_load", "yaml.unsafe_load_all", "pandas.read_pickle", "pd.read_pickle"):
                found.append(name)
            elif name in ("eval", "exec"):
                found.append(f"{name}()")
    return found


def project_sources() -> list[Path]:
    skip = {".venv", "tests", ".git", "node_modules", "build", "local_outputs"}
    return sorted(p for p in REPO.rglob("*.py")
                  if not skip & set(p.relative_to(REPO).parts) and not any(part.startswith(".")
                                                                         for part in p.relative_to(REPO).parts))


@pytest.mark.parametrize("snippet,expected", [
    ("import pickle", ["import pickle"]),
    ("import joblib.numpy_pickle", ["import joblib.numpy_pickle"]),
    ("from pickle import loads", ["from pickle import"]),
    ("import torch\ntorch.load('m.pt')", ["torch.load"]),
    ("from torch import load", ["from torch import load"]),
    ("import numpy as np\nnp.load('a.npy', allow_pickle=True)", ["np.load(allow_pickle=...)"]),
    ("import numpy as np\nnp.load('a.npy', allow_pickle=flag)", ["np.load(allow_pickle=...)"]),
    ("import yaml\nyaml.load(text)", ["yaml.load without SafeLoader"]),
    ("import yaml\nyaml.load(text, Loader=yaml.FullLoader)", ["yaml.load without SafeLoader"]),
    ("import yaml\nyaml.unsafe_load(text)", ["yaml.unsafe_load"]),
    ("eval('1 + 1')", ["eval()"]),
    ("exec(code)", ["exec()"]),
    ("import torch\nimport numpy as np\nimport yaml\ntorch.jit.load('m.pt')\nnp.load('a.npz', allow_pickle=False)\n"
     "yaml.load(t, Loader=yaml.SafeLoader)\nyaml.safe_load(t)\nmodel.eval()\n# pickle, eval(\n", []),
])
def test_unsafe_deserialisation_scanner(snippet, expected):
    assert unsafe_calls(snippet) == expected


def test_no_project_source_deserialises_untrusted_code():
    sources = project_sources()
    assert REPO / "handler" / "service.py" in sources and REPO / "training" / "steps.py" in sources
    findings = {str(p.relative_to(REPO)): unsafe_calls(p.read_text()) for p in sources}
    assert {path: calls for path, calls in findings.items() if calls} == {}


LOADERS = ("torch.jit.load", "jit.load", "aoti_load_package", "faiss.read_index")


def unverified_load_paths(sources: dict[str, str]) -> list[str]:
    """Entry points of TorchServe handler classes that can reach a loader before verify_artifacts.

    A function is *exposed* when it calls a loader, or an exposed function (matched by name), at a line with no
    earlier verify_artifacts call in the same function; the handler's methods must not be exposed.
    """
    functions: dict[str, list[tuple[int, str]]] = {}
    entries: list[str] = []
    for source in sources.values():
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                is_handler = any(dotted(base).split(".")[-1] == "BaseHandler" for base in node.bases)
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        entries += [f"{node.name}.{item.name}"] if is_handler else []
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            for item in body if isinstance(body, list) else []:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    owner = f"{node.name}." if isinstance(node, ast.ClassDef) else ""
                    functions[f"{owner}{item.name}"] = sorted(
                        (call.lineno, dotted(call.func)) for call in ast.walk(item) if isinstance(call, ast.Call))
    exposed: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, calls in functions.items():
            if name in exposed:
                continue
            verified_at = min((line for line, callee in calls if callee.split(".")[-1] == "verify_artifacts"),
                              default=None)
            for line, callee in calls:
                short = callee.split(".")[-1]
                risky = callee.endswith(LOADERS) or any(e.split(".")[-1] == short for e in exposed)
                if risky and (verified_at is None or line < verified_at):
                    exposed.add(name)
                    changed = True
                    break
    return sorted(e for e in entries if e in exposed)


@pytest.mark.parametrize("source,expected", [
    ("""
     class H(BaseHandler):
         def initialize(self, ctx):
             model = torch.jit.load(path)
             verify_artifacts(directory)
     """, ["H.initialize"]),
    ("""
     def read(directory):
         return faiss.read_index(directory)
     class H(BaseHandler):
         def initialize(self, ctx):
             self.index = read(directory)
     """, ["H.initialize"]),
    ("""
     def read(directory):
         return faiss.read_index(directory)
     def load(directory):
         return read(directory)
     class H(BaseHandler):
         def initialize(self, ctx):
             verify_artifacts(directory)
             self.index = load(directory)
     """, []),
], ids=["load-before-verify", "helper-without-verify", "helper-after-verify"])
def test_unverified_load_checker(source, expected):
    assert unverified_load_paths({"m.py": textwrap.dedent(source)}) == expected


def test_handler_loads_model_and_index_only_after_verify_artifacts():
    sources = {p.name: p.read_text() for p in sorted((REPO / "handler").glob("*.py"))}
    joined = "\n".join(sources.values())
    for loader in ("torch.jit.load", "aoti_load_package(", "faiss.read_index"):  # the checker has something to check
        assert loader in joined, loader
    assert "torch.load(" not in joined
    assert unverified_load_paths(sources) == []
