"""Run KServe's or Triton's own Python client against a served model and print what it read, as JSON.

Runs inside a client virtual environment (scripts/client-venvs.sh), never the project's: it imports only
the client under test and numpy, not the project. Usage:

    python -I client_probe.py kserve|triton URL MODEL KEY INPUT.json [GATEWAY_TOKEN]

With GATEWAY_TOKEN (a Kubeflow JWT, for a URL behind Kubeflow's ingress) the token goes in Authorization and the
key in X-API-Key, as docs/kserve.md tells callers there; without it the key is the bearer value.

(-I: the script's own directory must not shadow the standard library; tests/support/http.py would.)

INPUT.json: {"pngs": [base64 PNG, ...], "pixels": [[28 x 28 uint8], ...]} (the same digits). Prints
{"version": ..., "checks": {...}, "cases": {case: {"label", "distance", "confidence", "unknown",
"neighbour_labels", "neighbour_distances"} or v1 predictions}} where each case is one way the client can
send the digits (bytes, FP32 JSON, FP32 binary, ...).
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from importlib.metadata import version

import numpy as np

TYPED = ("label", "distance", "confidence", "unknown", "neighbour_labels", "neighbour_distances")


def _plain(array: np.ndarray) -> list:
    if array.dtype == np.object_:
        return [_plain(a) if isinstance(a, np.ndarray) else
                (a.decode() if isinstance(a, bytes) else str(a)) for a in array]
    return np.where(np.isnan(array), None, array).tolist() if array.dtype.kind == "f" else array.tolist()


def auth_headers(key: str, gateway_token: str | None) -> dict[str, str]:
    if gateway_token:
        return {"Authorization": f"Bearer {gateway_token}", "X-API-Key": key}
    return {"Authorization": f"Bearer {key}"}


def kserve(url: str, model: str, headers: dict[str, str], pngs: list[bytes], pixels: np.ndarray) -> dict:
    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
    from kserve.protocol.infer_type import RequestedOutput

    n = len(pngs)

    def typed(response) -> dict:
        return {name: _plain(response.get_output_by_name(name).as_numpy()) for name in TYPED}

    async def run() -> dict:
        cases, checks = {}, {}
        v1 = InferenceRESTClient(RESTConfig(protocol="v1", timeout=60))
        v2 = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
        try:
            checks["v1 server live"] = await v1.is_server_live(url, headers=dict(headers))
            checks["v1 model ready"] = await v1.is_model_ready(url, model, headers=dict(headers))
            checks["v2 server live"] = await v2.is_server_live(url, headers=dict(headers))
            checks["v2 model ready"] = await v2.is_model_ready(url, model, headers=dict(headers))
            body = {"instances": [{"data": base64.b64encode(p).decode()} for p in pngs]}
            cases["v1 base64"] = await v1.infer(url, body, model, headers=dict(headers))

            def request(name: str, shape: list[int], datatype: str, data: np.ndarray, binary: bool, **kw):
                tensor = InferInput(name, shape, datatype)
                tensor.set_data_from_numpy(data, binary_data=binary)
                return InferRequest(model, [tensor], **kw)

            raw = np.array(pngs, dtype=np.object_)
            text = np.array([base64.b64encode(p) for p in pngs], dtype=np.object_)
            fp32 = (pixels.astype(np.float32) / 255.0).reshape(n, 1, 28, 28)
            sent = {
                "v2 BYTES binary": request("image", [n], "BYTES", raw, True),
                "v2 BYTES base64 JSON": request("image", [n], "BYTES", text, False),
                "v2 FP32 JSON": request("pixels", [n, 1, 28, 28], "FP32", fp32, False),
                "v2 FP32 binary": request("pixels", [n, 1, 28, 28], "FP32", fp32, True),
                "v2 UINT8 binary": request("pixels", [n, 28, 28], "UINT8", pixels.reshape(n, 28, 28), True),
                "v2 FP32 binary, binary outputs": request("pixels", [n, 784], "FP32", fp32.reshape(n, 784), True,
                                                          parameters={"binary_data_output": True}),
                "v2 BYTES binary, some outputs binary": request(
                    "image", [n], "BYTES", raw, True,
                    request_outputs=[RequestedOutput(name, {"binary_data": name.startswith("neighbour")})
                                     for name in TYPED]),
            }
            for case, infer_request in sent.items():
                cases[case] = typed(await v2.infer(url, infer_request, model, headers=dict(headers)))
        finally:
            await v1.close()
            await v2.close()
        return {"checks": checks, "cases": cases}

    return asyncio.run(run())


def triton(url: str, model: str, headers: dict[str, str], pngs: list[bytes], pixels: np.ndarray) -> dict:
    import tritonclient.http as http

    n = len(pngs)
    client = http.InferenceServerClient(url.split("://", 1)[1], connection_timeout=60, network_timeout=60)
    checks = {
        "server live": client.is_server_live(headers=headers),
        "model ready": client.is_model_ready(model, headers=headers),
        "metadata outputs": [o["name"] for o in client.get_model_metadata(model, headers=headers)["outputs"]],
    }

    def infer(name: str, shape: list[int], datatype: str, data: np.ndarray, binary: bool,
              outputs: dict[str, bool] | None = None) -> dict:
        tensor = http.InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(data, binary_data=binary)
        requested = None if outputs is None else [http.InferRequestedOutput(o, binary_data=b)
                                                  for o, b in outputs.items()]
        # A copy each time: tritonclient adds Inference-Header-Content-Length to the caller's dict and leaves it.
        result = client.infer(model, [tensor], outputs=requested, headers=dict(headers))
        return {o: _plain(result.as_numpy(o)) for o in TYPED}

    raw = np.array(pngs, dtype=np.object_)
    fp32 = (pixels.astype(np.float32) / 255.0).reshape(n, 1, 28, 28)
    cases = {
        # No outputs named: tritonclient asks for every output in binary (binary_data_output).
        "BYTES binary": infer("image", [n], "BYTES", raw, True),
        "FP32 JSON, JSON outputs": infer("pixels", [n, 1, 28, 28], "FP32", fp32, False,
                                         {o: False for o in TYPED}),
        "FP32 binary": infer("pixels", [n, 784], "FP32", fp32.reshape(n, 784), True),
        "UINT8 binary, mixed outputs": infer("pixels", [n, 28, 28], "UINT8", pixels.reshape(n, 28, 28), True,
                                             {o: i % 2 == 0 for i, o in enumerate(TYPED)}),
    }
    client.close()
    return {"checks": checks, "cases": cases}


def main() -> None:
    which, url, model, key, inputs = sys.argv[1:6]
    headers = auth_headers(key, sys.argv[6] if len(sys.argv) > 6 else None)
    given = json.loads(open(inputs).read())
    pngs = [base64.b64decode(p) for p in given["pngs"]]
    pixels = np.array(given["pixels"], dtype=np.uint8)
    run = kserve if which == "kserve" else triton
    out = run(url, model, headers, pngs, pixels)
    out["version"] = version("kserve" if which == "kserve" else "tritonclient")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
