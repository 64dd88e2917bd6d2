"""Call the served model over Open Inference gRPC through Kubeflow's ingress (support.istio_ingress) with KServe's
own InferenceGRPCClient, as docs/kserve.md tells a gRPC caller to: the Kubeflow token as `authorization: Bearer`,
the service's key in `x-api-key`. Prints JSON.

Runs inside a KServe client virtual environment (scripts/client-venvs.sh). Usage:

    python -I grpc_ingress_probe.py HOST:PORT MODEL KEY JWT INPUT.json

INPUT.json: {"pngs": [base64 PNG, ...]}. Prints {"version", "ready": bool, "labels": [...], "refusals": {case:
[status code name, details]}}.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from importlib.metadata import version

import grpc
import numpy as np


def main() -> None:
    from kserve import InferenceGRPCClient, InferInput, InferRequest
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    address, model, key, token, inputs = sys.argv[1:6]
    pngs = [base64.b64decode(p) for p in json.loads(open(inputs).read())["pngs"]]
    both = (("authorization", f"Bearer {token}"), ("x-api-key", key))

    def infer_request() -> InferRequest:
        tensor = InferInput("image", [len(pngs)], "BYTES")
        tensor.set_data_from_numpy(np.array(pngs, dtype=np.object_), binary_data=True)
        return InferRequest(model, [tensor])

    async def refused(call) -> list:
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            return [exc.code().name, exc.details()]
        return ["OK", ""]

    async def run() -> dict:
        client = InferenceGRPCClient(address, timeout=60, channel_args=[("grpc.enable_retries", 0)])
        stub = client._client_stub
        try:
            ready = await stub.ModelReady(pb.ModelReadyRequest(name=model), metadata=both)
            response = await client.infer(infer_request(), headers=both)
            labels = [v.decode() if isinstance(v, bytes) else str(v)
                      for v in response.get_output_by_name("label").as_numpy()]
            cases = {"key as the bearer": (("authorization", f"Bearer {key}"),),
                     "token without the key": (("authorization", f"Bearer {token}"),),
                     "token with a wrong key": (("authorization", f"Bearer {token}"), ("x-api-key", "wrong")),
                     "nothing": ()}
            refusals = {case: await refused(client.infer(infer_request(), headers=headers))
                        for case, headers in cases.items()}
            refusals["server ready, nothing"] = await refused(stub.ServerReady(pb.ServerReadyRequest()))
        finally:
            await client.close()
        return {"ready": ready.ready, "labels": labels, "refusals": refusals}

    result = asyncio.run(run())
    result["version"] = version("kserve")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
