"""KServe V2 (Open Inference Protocol) over gRPC: Triton's ``inference.GRPCInferenceService``.

Wire-compatible with Triton, so ``tritonclient.grpc`` and ``perf_analyzer -i grpc`` work
unchanged. It runs on ``grpc.aio`` on the server's own event loop (uvloop), next to the REST front
end, and talks to the same core: ``InferenceServer`` for the queries, ``Model.submit`` for
inference (so validation, scheduling, statistics and error messages are the REST ones).

Inference: inputs come from ``raw_input_contents`` (wrapped by ``numpy.frombuffer``; BYTES are
4-byte-length-prefixed, as in the REST binary extension), from the typed ``contents`` fields, or
from a registered system shared memory region (``shared_memory_region`` / ``_byte_size`` /
``_offset`` parameters; such inputs have no ``raw_input_contents`` entry, as tritonclient sends
them); outputs go back in ``raw_output_contents`` (what Triton does and ``InferResult.as_numpy``
reads), except those asked for in shared memory: they are written into their region and
answered with the region and the bytes written as parameters and an empty raw contents entry (as
Triton: every output has one, so ``raw_output_contents[i]`` is always ``outputs[i]``'s; Triton's
C++ client, perf_analyzer's, indexes it without checking). The response protobuf is built on the instance thread (``done``); the RPC's future is
resolved on the event loop (``finish``). Streams answer each request with a
``ModelStreamInferResponse`` in completion order, carrying the request ``id``; a bad message gets
its ``error_message`` and the stream stays open.

Message size: a request may be up to the server's ``--max-request-size`` (the same limit as a REST
body; a larger one is refused with RESOURCE_EXHAUSTED by gRPC itself). Responses are not limited
(up to gRPC's 2 GiB), as Triton does, so a model may answer with more than it was sent.

Repository load/unload follow --model-control-mode (refused unless explicit, as Triton).
System shared memory status/register/unregister share the REST front end's registry. CUDA
shared memory: status lists no regions, unregister succeeds (nothing to do), register answers
INVALID_ARGUMENT. Not implemented (UNIMPLEMENTED with a message saying so): trace and log settings.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from math import prod
from time import perf_counter_ns
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from inferd.core.datatypes import (
    NUMPY_TO_V2,
    V2_TO_NUMPY,
    serialize_bytes_tensor,
)
from inferd.core.errors import (
    InferdError,
    InternalError,
    InvalidRequest,
    NotFound,
    Unavailable,
)
from inferd.core.server import InferenceServer
from inferd.core.shared_memory import SharedMemoryRegistry
from inferd.core.types import InferRequest, Tensors
from inferd.frontends.kserve_codec import is_shm, raw_to_array, shm_input, shm_output, write_shm_output

log = logging.getLogger("inferd.grpc")

#: gRPC's own ceiling for one message (a signed 32-bit length).
GRPC_MAX_MESSAGE = 2**31 - 1

_STATUS: dict[type, grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    InternalError: grpc.StatusCode.INTERNAL,
}

#: V2 datatype -> the InferTensorContents field that carries it (FP16 has none: raw only).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
#: The 32-bit contents fields also carry the 8- and 16-bit datatypes (range-checked).
_FIELD_DTYPE: dict[str, np.dtype] = {
    "int_contents": np.dtype(np.int32),
    "uint_contents": np.dtype(np.uint32),
}

_FINAL_RESPONSE_REQUEST = "triton_enable_empty_final_response"
_FINAL_RESPONSE = "triton_final_response"


def status_code(error: InferdError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        code = _STATUS.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


# --------------------------------------------------------------------------- request decoding


def parameter_value(param: pb.InferParameter) -> Any:
    """An InferParameter as a plain Python value (bool, int, float or str; None when unset)."""
    kind = param.WhichOneof("parameter_choice")
    return getattr(param, kind) if kind is not None else None


def parameters_dict(params: Any) -> dict[str, Any] | None:
    if not params:
        return None
    return {key: parameter_value(value) for key, value in params.items()}


def decode_inputs(request: pb.ModelInferRequest, shared_memory: SharedMemoryRegistry | None = None) -> Tensors:
    """The inputs of a ModelInferRequest as numpy arrays (raw contents and shared memory wrapped,
    not copied). Inputs in shared memory have no raw_input_contents entry."""
    entries = request.inputs
    if not entries:
        raise InvalidRequest("the request must have at least one entry in 'inputs'")
    raw = request.raw_input_contents
    use_raw = len(raw) > 0
    in_shm = [bool(entry.parameters) and "shared_memory_region" in entry.parameters for entry in entries]
    with_data = len(entries) - sum(in_shm)
    if use_raw and len(raw) != with_data:
        raise InvalidRequest(
            f"the request has {with_data} inputs but {len(raw)} raw_input_contents: with raw_input_contents, "
            "every input not in shared memory needs exactly one, in the order of 'inputs'"
        )
    inputs: Tensors = {}
    raw_index = 0
    for index, entry in enumerate(entries):
        name = entry.name
        datatype = entry.datatype
        dtype = V2_TO_NUMPY.get(datatype)
        if dtype is None:
            raise InvalidRequest(
                f"input '{name}' has unsupported datatype {datatype!r} (one of {', '.join(V2_TO_NUMPY)})"
            )
        if name in inputs:
            raise InvalidRequest(f"input '{name}' is given twice")
        shape = tuple(entry.shape)
        if any(d < 0 for d in shape):
            raise InvalidRequest(f"input '{name}' needs a shape of non-negative integers, not {list(shape)}")
        count = prod(shape)
        if in_shm[index]:
            if entry.HasField("contents"):
                raise InvalidRequest(
                    f"input '{name}' names a shared memory region and also has data in 'contents'; "
                    "send one or the other"
                )
            params = parameters_dict(entry.parameters) or {}
            array = shm_input(shared_memory, name, params, datatype, dtype, shape, count)
        elif use_raw:
            if entry.HasField("contents"):
                raise InvalidRequest(
                    f"input '{name}' has data in 'contents' although the request uses raw_input_contents; "
                    "use one or the other for all inputs"
                )
            array = raw_to_array(name, raw[raw_index], datatype, dtype, shape, count, "raw_input_contents")
            raw_index += 1
        else:
            array = contents_to_array(name, entry.contents, datatype, dtype, shape, count)
        inputs[name] = array
    return inputs


def contents_to_array(
    name: str, contents: pb.InferTensorContents, datatype: str, dtype: np.dtype, shape: tuple[int, ...], count: int
) -> np.ndarray:
    """An input given in the typed ``contents`` fields, checked: the field must match the
    datatype, the element count the shape, and every value must fit the datatype."""
    field = CONTENTS_FIELD.get(datatype)
    present = [fd.name for fd, _ in contents.ListFields()]
    if field is None:
        raise InvalidRequest(
            f"input '{name}': {datatype} data can only be sent in raw_input_contents (InferTensorContents has no "
            f"field for it)"
        )
    wrong = [f for f in present if f != field]
    if wrong:
        raise InvalidRequest(
            f"input '{name}' is {datatype} but has data in contents.{wrong[0]}; {datatype} data goes in "
            f"contents.{field}"
        )
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidRequest(
            f"input '{name}' has {len(values)} elements in contents.{field} but shape {list(shape)} needs {count}"
        )
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        for i, item in enumerate(values):
            array[i] = item
        return array.reshape(shape)
    wide = _FIELD_DTYPE.get(field)
    if wide is None or wide == dtype:
        return np.array(values, dtype=dtype).reshape(shape)
    gathered = np.array(values, dtype=wide)
    info = np.iinfo(dtype)
    if gathered.size and (gathered.min() < info.min or gathered.max() > info.max):
        bad = gathered[(gathered < info.min) | (gathered > info.max)][0]
        raise InvalidRequest(f"input '{name}': value {bad} in contents.{field} is out of range for {datatype}")
    return gathered.astype(dtype).reshape(shape)


def requested_outputs(
    request: pb.ModelInferRequest, shared_memory: SharedMemoryRegistry | None = None
) -> tuple[list[str] | None, dict[str, tuple[str, memoryview]] | None]:
    """The outputs asked for, and where those asked for in shared memory go."""
    names: list[str] = []
    shm: dict[str, tuple[str, memoryview]] = {}
    for entry in request.outputs:
        name = entry.name
        params = entry.parameters
        if params:
            if "classification" in params and parameter_value(params["classification"]):
                raise InvalidRequest(f"output '{name}': the classification extension is not supported")
            if is_shm(params):
                shm[name] = shm_output(shared_memory, name, parameters_dict(params) or {})
        names.append(name)
    return names or None, shm or None


# --------------------------------------------------------------------------- response encoding


def fill_response(
    response: pb.ModelInferResponse,
    model_name: str,
    version: str,
    request_id: str | None,
    outputs: Tensors,
    shm_outputs: dict[str, tuple[str, memoryview]] | None = None,
) -> None:
    """Every output in ``raw_output_contents`` with its datatype and shape (Triton's layout);
    outputs in ``shm_outputs`` are written into their region instead, with an empty raw entry."""
    response.model_name = model_name
    response.model_version = version
    if request_id:
        response.id = request_id
    tensors = response.outputs
    raw = response.raw_output_contents
    for name, array in outputs.items():
        datatype = NUMPY_TO_V2.get(array.dtype, "BYTES")
        tensor = tensors.add()
        tensor.name = name
        tensor.datatype = datatype
        tensor.shape.extend(array.shape)
        if shm_outputs and name in shm_outputs:
            region, target = shm_outputs[name]
            written = write_shm_output(name, array, target)
            tensor.parameters["shared_memory_region"].string_param = region
            tensor.parameters["shared_memory_byte_size"].int64_param = written
            raw.append(b"")
            continue
        raw.append(serialize_bytes_tensor(array) if datatype == "BYTES" else array.tobytes())


class _Context:
    """What the front end remembers about a request while the core runs it."""

    __slots__ = (
        "frontend",
        "model_name",
        "version",
        "future",
        "stream",
        "response",
        "error",
        "final_flag",
        "shm_outputs",
    )

    def __init__(self, frontend: KServeGrpc, model_name: str, version: str) -> None:
        self.frontend = frontend
        self.model_name = model_name
        self.version = version
        self.future: asyncio.Future[None] | None = None
        self.stream: _Stream | None = None
        self.response: Any = None
        self.error: InferdError | None = None
        self.final_flag = False
        #: outputs to write into shared memory: name -> (region, writable view)
        self.shm_outputs: dict[str, tuple[str, memoryview]] | None = None


def _complete_unary(request: InferRequest, outputs: Tensors | None, error: InferdError | None) -> None:
    """On the instance thread: build the response protobuf (off the event loop)."""
    context: _Context = request.context
    if error is not None:
        context.error = error
        return
    assert outputs is not None
    try:
        response = pb.ModelInferResponse()
        fill_response(response, context.model_name, context.version, request.id, outputs, context.shm_outputs)
        context.response = response
    except InferdError as exc:  # e.g. an output that does not fit its shared memory region
        context.error = exc
    except Exception as exc:
        log.exception("failed to encode the response of model '%s'", context.model_name)
        context.error = InternalError(f"failed to encode the response: {exc}")


def _finish_unary(request: InferRequest) -> None:
    """On the event loop: wake the RPC (unless the client went away meanwhile)."""
    context: _Context = request.context
    context.frontend.inflight -= 1
    future = context.future
    if future is not None and not future.done():
        future.set_result(None)


def _complete_stream(request: InferRequest, outputs: Tensors | None, error: InferdError | None) -> None:
    """On the instance thread: build the stream message, success or error."""
    context: _Context = request.context
    message = pb.ModelStreamInferResponse()
    if error is None:
        assert outputs is not None
        try:
            fill_response(
                message.infer_response, context.model_name, context.version, request.id, outputs, context.shm_outputs
            )
            if context.final_flag:
                message.infer_response.parameters[_FINAL_RESPONSE].bool_param = True
        except InferdError as exc:
            error = exc
            message = pb.ModelStreamInferResponse()
        except Exception as exc:
            log.exception("failed to encode the response of model '%s'", context.model_name)
            error = InternalError(f"failed to encode the response: {exc}")
            message = pb.ModelStreamInferResponse()
    if error is not None:
        _stream_error(message, error.message, context.model_name, context.version, request.id)
    context.response = message


def _finish_stream(request: InferRequest) -> None:
    context: _Context = request.context
    context.frontend.inflight -= 1
    assert context.stream is not None
    context.stream.answered(context.response)


def _stream_error(
    message: pb.ModelStreamInferResponse, text: str, model_name: str, version: str, request_id: str | None
) -> pb.ModelStreamInferResponse:
    """An error answer on a stream: the message, and the request's id so it can be matched."""
    message.error_message = text
    response = message.infer_response
    response.model_name = model_name
    response.model_version = version
    if request_id:
        response.id = request_id
    return message


class _Stream:
    """One ModelStreamInfer call: answers leave in the order they complete."""

    __slots__ = ("queue", "pending", "reading", "ended")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        self.pending = 0  # requests in the core, not answered yet
        self.reading = True  # the client may still send
        self.ended = False

    def answered(self, message: pb.ModelStreamInferResponse) -> None:
        self.pending -= 1
        self.queue.put_nowait(message)
        self.end_if_done()

    def end_if_done(self) -> None:
        if not self.reading and self.pending <= 0:
            self.end()

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.queue.put_nowait(None)


# --------------------------------------------------------------------------- the service


class KServeGrpcServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Translates GRPCInferenceService calls to core calls and core answers back."""

    def __init__(self, frontend: KServeGrpc) -> None:
        self.frontend = frontend
        self.server = frontend.server

    # -- health and metadata ---------------------------------------------------------------
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=bool(self.server.live))

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=bool(self.server.ready))

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        # As Triton's gRPC endpoint: an unknown model or version is simply not ready.
        try:
            ready = self.server.model_ready(request.name, request.version or None)
        except NotFound:
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        metadata = self.server.metadata()
        return pb.ServerMetadataResponse(
            name=metadata["name"], version=metadata["version"], extensions=metadata["extensions"]
        )

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        return await self._answer(context, self._model_metadata, request)

    def _model_metadata(self, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        metadata = self.server.model_metadata(request.name, request.version or None)
        response = pb.ModelMetadataResponse(
            name=metadata["name"], versions=metadata["versions"], platform=metadata["platform"]
        )
        for target, tensors in ((response.inputs, metadata["inputs"]), (response.outputs, metadata["outputs"])):
            for tensor in tensors:
                target.add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        return response

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        return await self._answer(context, self._model_config, request)

    def _model_config(self, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        model = self.server.model(request.name, request.version or None)
        return pb.ModelConfigResponse(config=model.config)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        return await self._answer(context, self._model_statistics, request)

    def _model_statistics(self, request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        stats = self.server.statistics(request.name or None, request.version or None)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        return await self._answer(context, self._repository_index, request)

    def _repository_index(self, request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        response = pb.RepositoryIndexResponse()
        for row in self.server.index(ready_only=request.ready):
            response.models.add(
                name=row["name"], version=row.get("version", ""), state=row["state"], reason=row.get("reason", "")
            )
        return response

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        parameters: dict[str, Any] = {}
        for key, param in request.parameters.items():
            which = param.WhichOneof("parameter_choice")
            parameters[key] = getattr(param, which) if which else None
        return await self._control(
            context, self.server.load_model(request.model_name, parameters), pb.RepositoryModelLoadResponse()
        )

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        return await self._control(
            context, self.server.unload_model(request.model_name), pb.RepositoryModelUnloadResponse()
        )

    async def _control(self, context: Any, work: Any, response: Any) -> Any:
        try:
            await work
            return response
        except InferdError as exc:
            code, message = status_code(exc), exc.message
        except Exception as exc:
            log.exception("gRPC repository control failed")
            code, message = grpc.StatusCode.INTERNAL, f"internal error: {exc!r}"
        await context.abort(code, message)

    async def _answer(self, context: Any, method: Any, request: Any) -> Any:
        try:
            return method(request)
        except InferdError as exc:
            code, message = status_code(exc), exc.message
        except Exception as exc:
            log.exception("gRPC %s failed", type(request).__name__)
            code, message = grpc.StatusCode.INTERNAL, f"internal error: {exc!r}"
        await context.abort(code, message)

    # -- inference -------------------------------------------------------------------------
    def _submit(self, request: pb.ModelInferRequest, stream: _Stream | None) -> _Context:
        """Decode and queue one request (on the event loop); raises InferdError when refused."""
        received = perf_counter_ns()
        model = self.server.model(request.model_name, request.model_version or None)
        shared_memory = self.server.shared_memory
        inputs = decode_inputs(request, shared_memory)
        requested, shm_outputs = requested_outputs(request, shared_memory)
        parameters = parameters_dict(request.parameters)
        context = _Context(self.frontend, model.name, model.version_str)
        context.shm_outputs = shm_outputs
        if stream is None:
            done, finish = _complete_unary, _finish_unary
            context.future = asyncio.get_running_loop().create_future()
        else:
            done, finish = _complete_stream, _finish_stream
            context.stream = stream
            if parameters and parameters.get(_FINAL_RESPONSE_REQUEST) is True:
                context.final_flag = True
        infer_request = InferRequest(inputs, done, context, requested, request.id or None, parameters, received, finish)
        # Counted before submit: a request may be answered as soon as it is queued.
        self.frontend.inflight += 1
        if stream is not None:
            stream.pending += 1
        try:
            model.submit(infer_request)
        except InferdError:
            self.frontend.inflight -= 1
            if stream is not None:
                stream.pending -= 1
            model.fail_request(infer_request)
            raise
        return context

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        try:
            if self.frontend.closing:
                raise Unavailable("the server is shutting down")
            ctx = self._submit(request, None)
            future = ctx.future
            assert future is not None
        except InferdError as exc:
            code, message = status_code(exc), exc.message
        except Exception as exc:
            log.exception("gRPC ModelInfer failed")
            code, message = grpc.StatusCode.INTERNAL, f"internal error: {exc!r}"
        else:
            await future
            if ctx.error is None:
                return ctx.response
            code, message = status_code(ctx.error), ctx.error.message
        await context.abort(code, message)

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> Any:
        stream = _Stream()
        frontend = self.frontend
        frontend.streams.add(stream)
        reader = asyncio.ensure_future(self._read_stream(request_iterator, stream))
        try:
            while True:
                message = await stream.queue.get()
                if message is None:
                    break
                yield message
        finally:
            frontend.streams.discard(stream)
            if not reader.done():
                reader.cancel()

    async def _read_stream(self, request_iterator: Any, stream: _Stream) -> None:
        try:
            async for request in request_iterator:
                try:
                    if self.frontend.closing:
                        raise Unavailable("the server is shutting down")
                    self._submit(request, stream)
                    continue
                except InferdError as exc:
                    text = exc.message
                except Exception as exc:
                    log.exception("gRPC ModelStreamInfer failed on a message")
                    text = f"internal error: {exc!r}"
                message = _stream_error(
                    pb.ModelStreamInferResponse(), text, request.model_name, request.model_version, request.id
                )
                stream.queue.put_nowait(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the client went away mid-stream, or sent something unreadable
            log.debug("gRPC stream ended while reading: %r", exc)
        finally:
            stream.reading = False
            stream.end_if_done()

    # -- not implemented -------------------------------------------------------------------
    async def _unimplemented(self, context: Any, what: str) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not supported by inferd")

    # -- shared memory ---------------------------------------------------------------------
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return await self._answer(context, self._system_shm_status, request)

    def _system_shm_status(self, request: pb.SystemSharedMemoryStatusRequest) -> Any:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.server.shared_memory.status(request.name or None):
            entry = response.regions[region["name"]]
            entry.name = region["name"]
            entry.key = region["key"]
            entry.offset = region["offset"]
            entry.byte_size = region["byte_size"]
        return response

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        return await self._answer(context, self._system_shm_register, request)

    def _system_shm_register(self, request: pb.SystemSharedMemoryRegisterRequest) -> Any:
        self.server.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self.server.shared_memory.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    # CUDA shared memory: no GPU memory here, so there are never any regions. Status and
    # unregister answer that truthfully (clients such as perf_analyzer unregister both kinds when
    # they clean up); registering is refused.
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        if request.name:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"Unable to find CUDA shared memory region: '{request.name}'"
            )
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, "CUDA shared memory is not supported by inferd (use system shared memory)"
        )

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return pb.CudaSharedMemoryUnregisterResponse()

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "the trace extension (TraceSetting)")

    async def LogSettings(self, request: Any, context: Any) -> Any:
        await self._unimplemented(context, "the logging extension (LogSettings)")


class KServeGrpc:
    """The gRPC server: start, and drain on shutdown."""

    def __init__(self, server: InferenceServer, host: str, port: int, max_request_size: int = 64 * 1024 * 1024) -> None:
        self.server = server
        self.host = host
        self.port = port
        self.max_request_size = max_request_size
        #: requests in the core (unary and stream messages), counted on the event loop
        self.inflight = 0
        self.streams: set[_Stream] = set()
        self.closing = False
        self._grpc: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        host = self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Listen; raises OSError (with the reason) when the address can't be bound."""
        options = [
            ("grpc.max_receive_message_length", self.max_request_size),
            ("grpc.max_send_message_length", GRPC_MAX_MESSAGE),
            # Without this, a second server on the same port would silently share it.
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(options=options)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(KServeGrpcServicer(self), server)
        try:
            port = server.add_insecure_port(self.address)
        except RuntimeError as exc:
            reason = _bind_reason(self.host, self.port)
            raise OSError(errno.EADDRINUSE, f"cannot listen for gRPC on {self.address}: {reason} ({exc})") from None
        if self.port == 0:
            self.port = port
        await server.start()
        self._grpc = server

    async def drain(self, timeout: float) -> bool:
        """Stop accepting calls, let in-flight requests finish (up to ``timeout``), then end the
        open streams and close. Returns True when everything in flight was answered."""
        self.closing = True
        server = self._grpc
        if server is None:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # New calls are refused from here on; the ones running may take until the deadline.
        stopping = asyncio.ensure_future(server.stop(timeout))
        while self.inflight > 0 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        drained = self.inflight <= 0
        for stream in list(self.streams):
            stream.reading = False
            if drained:
                stream.end_if_done()
            else:
                stream.end()
        try:
            # A moment to send the last answers; then whatever is left is cancelled.
            await asyncio.wait_for(asyncio.shield(stopping), max(0.0, deadline - loop.time()) + 1.0)
        except TimeoutError:
            await server.stop(None)
            await stopping
        return drained


def _bind_reason(host: str, port: int) -> str:
    """Why binding failed, in the operating system's words (gRPC's own message doesn't say)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return str(exc)
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return "the address is not available"
