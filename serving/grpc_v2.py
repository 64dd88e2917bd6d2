"""Open Inference gRPC (KServe's ``grpc-v2``) for the gateway, served by ``grpc.aio`` in the gateway's event loop.

KServe's model server answers ``inference.GRPCInferenceService`` on port 8081 beside REST on 8080; so does
the gateway (:mod:`serving.gateway.app`), with the same backend and the same rules as its REST v2 route:

- ServerLive / ServerReady are ``/v2/health/live`` / ``/v2/health/ready`` and, like those probes, need no key;
  every other RPC needs the REST gateway's key in the metadata ``x-api-key`` or ``authorization: Bearer <key>``
  (:mod:`serving.gateway.auth`), else UNAUTHENTICATED;
- ModelReady, ServerMetadata and ModelMetadata answer what the REST routes answer (the typed outputs of
  :mod:`handler.v2_schema`);
- ModelInfer becomes the v2 JSON body the handler reads (:func:`infer_body`: typed ``contents`` or
  ``raw_input_contents``, the latter decoded by :mod:`serving.open_inference` exactly like the REST binary
  extension) and is sent to TorchServe on the REST v2 route's path; the answer's outputs go back as
  ``raw_output_contents``, one entry per output, as KServe's own server answers (:func:`infer_response`).

Refusals are gRPC statuses with the handler's or gateway's message: a malformed request or tensor
INVALID_ARGUMENT, an unknown model or version NOT_FOUND, TorchServe's 4xx/5xx mapped by :data:`HTTP_TO_GRPC`.
The stubs come from serving/proto/grpc_predict_v2.proto (:mod:`serving.grpc_stubs`).
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any, Awaitable, Callable, Mapping

import grpc

from serving.gateway.auth import GRPC_REFUSAL, key_matches, presented_key
from serving.grpc_stubs import load
from serving.open_inference import ProtocolError, tensor_bytes, tensor_data

logger = logging.getLogger("kserve_runtime.grpc")
pb, pb_grpc = load()

SERVICE = "inference.GRPCInferenceService"
#: RPCs answered without the key: the gRPC twins of the REST probe paths (serving.gateway.app.PROBE_PATHS).
OPEN_METHODS = frozenset(f"/{SERVICE}/{name}" for name in ("ServerLive", "ServerReady"))
#: Which InferTensorContents field carries each datatype's typed contents (FP16 and BF16: raw only).
CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
                  "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
                  "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
                  "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
#: Parameters that choose the REST binary extension's layout; gRPC answers are always raw, so they are dropped.
BINARY_PARAMETERS = ("binary_data_output", "binary_data", "binary_data_size")
HTTP_TO_GRPC = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
                413: grpc.StatusCode.RESOURCE_EXHAUSTED, 415: grpc.StatusCode.INVALID_ARGUMENT,
                422: grpc.StatusCode.INVALID_ARGUMENT, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
                503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


class RpcRefusal(Exception):
    """A request answered with a non-OK gRPC status and this message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def status_for(http_status: int) -> grpc.StatusCode:
    if http_status in HTTP_TO_GRPC:
        return HTTP_TO_GRPC[http_status]
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= http_status < 500 else grpc.StatusCode.INTERNAL


def parameter_value(parameter: Any) -> Any:
    """An InferParameter -> its Python value (None when no choice is set)."""
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def parameters_dict(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in parameters.items()
            if key not in BINARY_PARAMETERS and parameter_value(value) is not None}


def to_parameter(value: Any) -> Any:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return (pb.InferParameter(int64_param=value) if -2**63 <= value < 2**63
                else pb.InferParameter(string_param=str(value)))
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=value if isinstance(value, str) else json.dumps(value))


def _typed_contents(tensor: Any, where: str) -> list:
    datatype = tensor.datatype
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise RpcRefusal(grpc.StatusCode.INVALID_ARGUMENT,
                         f"input {where}: datatype {ascii(datatype)[:40]} has no typed contents: send it in "
                         "raw_input_contents" if datatype in ("FP16", "BF16") else
                         f"input {where}: unknown datatype {ascii(datatype)[:40]}")
    values = list(getattr(tensor.contents, field))
    others = [f.name for f, _ in tensor.contents.ListFields() if f.name != field]
    if others:
        raise RpcRefusal(grpc.StatusCode.INVALID_ARGUMENT,
                         f"input {where}: datatype {datatype} is carried in contents.{field}, not {', '.join(others)}")
    if datatype == "BYTES":  # the elements are the images' bytes; the handler reads BYTES data as base64 text
        return [base64.b64encode(v).decode("ascii") for v in values]
    return values


def infer_body(request: Any) -> dict[str, Any]:
    """A ModelInferRequest -> the Open Inference v2 JSON body the handler reads (as the REST route sends it)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise RpcRefusal(grpc.StatusCode.INVALID_ARGUMENT,
                         f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: give one per "
                         "input, in input order, or use typed contents")
    inputs = []
    for position, tensor in enumerate(request.inputs):
        where = ascii(tensor.name or position)[:60]
        if raw:
            if tensor.contents.ListFields():
                raise RpcRefusal(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"input {where} has typed contents but the request uses raw_input_contents")
            try:
                data = tensor_data(raw[position], tensor.datatype, where)
            except ProtocolError as exc:
                raise RpcRefusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        else:
            data = _typed_contents(tensor, where)
        body = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape), "data": data}
        parameters = parameters_dict(tensor.parameters)
        if parameters:
            body["parameters"] = parameters
        inputs.append(body)
    out: dict[str, Any] = {"inputs": inputs}
    if request.id:
        out["id"] = request.id
    parameters = parameters_dict(request.parameters)
    if parameters:
        out["parameters"] = parameters
    if request.outputs:
        out["outputs"] = [{"name": o.name, **({"parameters": p} if (p := parameters_dict(o.parameters)) else {})}
                          for o in request.outputs]
    return out


def infer_response(answer: Mapping[str, Any], model: str, version: str, request_id: str) -> Any:
    """The handler's v2 JSON answer -> a ModelInferResponse with every output in raw_output_contents."""
    outputs = answer.get("outputs")
    if not isinstance(outputs, list):
        raise RpcRefusal(grpc.StatusCode.INTERNAL, "the model answered without outputs")
    response = pb.ModelInferResponse(model_name=str(answer.get("model_name") or model),
                                     model_version=str(answer.get("model_version") or version),
                                     id=str(answer.get("id") or request_id))
    for key, value in (answer.get("parameters") or {}).items():
        response.parameters[key].CopyFrom(to_parameter(value))
    for position, output in enumerate(outputs):
        name, datatype = output.get("name", ""), output.get("datatype")
        where = ascii(name or position)[:60]
        try:
            raw = tensor_bytes(output.get("data", []), datatype, where)
        except ProtocolError as exc:
            raise RpcRefusal(grpc.StatusCode.INTERNAL, str(exc)) from None
        tensor = response.outputs.add(name=name, datatype=datatype, shape=[int(d) for d in output.get("shape", [])])
        for key, value in (output.get("parameters") or {}).items():
            if key not in BINARY_PARAMETERS:
                tensor.parameters[key].CopyFrom(to_parameter(value))
        response.raw_output_contents.append(raw)
    return response


def _error_message(payload: bytes, status: int) -> str:
    try:
        body = json.loads(payload)
        message = body.get("error") or body.get("message") if isinstance(body, dict) else None
    except (ValueError, TypeError):
        message = None
    return str(message or f"the model server answered HTTP {status}")


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The RPCs, answered by the REST gateway's own checks and backend (a serving.gateway.app.Gateway)."""

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    async def _answer(self, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await work()
        except RpcRefusal as exc:
            await context.abort(exc.code, str(exc))
        except ProtocolError as exc:
            await context.abort(status_for(exc.status), str(exc))

    def _known(self, model: str, version: str) -> None:
        missing = self.gateway.unknown_model(model, version or None)
        if missing:
            raise RpcRefusal(grpc.StatusCode.NOT_FOUND, missing)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=await self.gateway.upstream_alive())

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=await self.gateway.model_is_ready())

    async def ModelReady(self, request, context):
        async def work():
            self._known(request.name, request.version)
            return pb.ModelReadyResponse(ready=await self.gateway.model_is_ready())
        return await self._answer(context, work)

    async def ServerMetadata(self, request, context):
        meta = self.gateway.server_metadata_dict()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    async def ModelMetadata(self, request, context):
        async def work():
            self._known(request.name, request.version)
            meta = self.gateway.model_metadata(request.name)
            tensor = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                inputs=[tensor(**t) for t in meta["inputs"]], outputs=[tensor(**t) for t in meta["outputs"]])
        return await self._answer(context, work)

    async def ModelInfer(self, request, context):
        async def work():
            if self.gateway.drain.refusing:  # as REST answers 503: a retryable refusal, never a cancelled call
                raise RpcRefusal(grpc.StatusCode.UNAVAILABLE, "this replica is shutting down; retry")
            self._known(request.model_name, request.model_version)
            size = request.ByteSize()
            body = await self.gateway.off_loop(size, lambda: json.dumps(infer_body(request)).encode())
            status, payload = await self.gateway.infer_upstream(request.model_name, request.model_version or None,
                                                                body)
            if status != 200:
                raise RpcRefusal(status_for(status), _error_message(payload, status))
            try:
                answer = await self.gateway.off_loop(len(payload), json.loads, payload)
            except ValueError:
                raise RpcRefusal(grpc.StatusCode.INTERNAL, "the model server's answer is not JSON") from None
            return await self.gateway.off_loop(len(payload), infer_response, answer, request.model_name,
                                               request.model_version, request.id)
        return await self._answer(context, work)


class BearerKeyInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED unless the metadata carries the key (``x-api-key``, else ``authorization: Bearer``:
    :func:`serving.gateway.auth.presented_key`); OPEN_METHODS pass without it."""

    def __init__(self, api_key: bytes) -> None:
        self.api_key = api_key

    def allowed(self, method: str, metadata: Any) -> bool:
        if method in OPEN_METHODS:
            return True
        pairs = [(k, v.decode("latin-1") if isinstance(v, bytes) else v) for k, v in (metadata or ())]
        return key_matches(presented_key(lambda name: [v for k, v in pairs if k == name]), self.api_key)

    async def intercept_service(self, continuation, handler_call_details):
        if self.allowed(handler_call_details.method, handler_call_details.invocation_metadata):
            return await continuation(handler_call_details)
        return _REFUSE


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, GRPC_REFUSAL)

_REFUSE = grpc.unary_unary_rpc_method_handler(_refuse)


def server(gateway: Any, address: str, max_message_bytes: int,
           reuse_port: bool = False) -> tuple[grpc.aio.Server, int]:
    """A started-to-be grpc.aio server bound to `address` ("host:port"); (server, bound port).

    Without `reuse_port` SO_REUSEPORT is off, so a taken port is an error here instead of two processes sharing
    the port; with it, several processes (the python runtime's workers) serve one port and the kernel spreads the
    connections over them.
    """
    interceptors = [BearerKeyInterceptor(gateway.api_key)] if gateway.api_key is not None else []
    aio_server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", -1),
    ])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(gateway), aio_server)
    port = aio_server.add_insecure_port(address)
    return aio_server, port
