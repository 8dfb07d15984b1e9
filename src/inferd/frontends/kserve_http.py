"""KServe V2 (Open Inference Protocol) over REST, with Triton's extensions.

Routes: ``/v2``, ``/v2/health/{live,ready}``, ``/v2/models/{m}[/versions/{v}]`` with ``/ready``,
``/infer``, ``/config`` and ``/stats``, ``/v2/models/stats``, ``/v2/repository/index``,
``/v2/repository/models/{m}/load`` / ``/unload`` (model control), and
``/v2/systemsharedmemory[/region/{name}]/status|register|unregister`` (system shared memory;
``/v2/cudasharedmemory/...`` has no regions and refuses to register one).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import unquote

import orjson

from inferd.core.errors import InferdError, InvalidRequest, NotFound
from inferd.core.server import InferenceServer
from inferd.core.shared_memory import SharedMemoryRegistry
from inferd.core.types import InferRequest, Tensors
from inferd.frontends.http import HttpRequest
from inferd.frontends.kserve_codec import decode_inputs, encode_response, is_shm, shm_output, split_body

log = logging.getLogger("inferd.kserve")

_GET = b"GET"
_POST = b"POST"
_JSON = b"application/json"
_OCTET = b"application/octet-stream"
_HEADER_LENGTH = b"inference-header-content-length"


class _Context:
    """What the front end remembers about a request while the core runs it."""

    __slots__ = ("http", "model_name", "version", "binary_outputs", "binary_default", "shm_outputs")

    def __init__(
        self,
        http: HttpRequest,
        model_name: str,
        version: str,
        binary_outputs: dict[str, bool] | None,
        binary_default: bool,
        shm_outputs: dict[str, tuple[str, memoryview]] | None = None,
    ) -> None:
        self.http = http
        self.model_name = model_name
        self.version = version
        self.binary_outputs = binary_outputs
        self.binary_default = binary_default
        #: outputs to write into shared memory: name -> (region, writable view)
        self.shm_outputs = shm_outputs


class KServeHttp:
    """Translates V2 REST requests to core calls and core answers back to V2 REST."""

    def __init__(self, server: InferenceServer) -> None:
        self.server = server
        self._control_tasks: set[asyncio.Task] = set()

    def __call__(self, request: HttpRequest) -> None:
        path = request.path
        try:
            if path.endswith("/infer") and request.method == _POST:
                # The hot path, routed without the general parsing below.
                parts = path.split("/")
                if len(parts) == 5 and parts[1] == "v2" and parts[2] == "models" and "%" not in parts[3]:
                    self.infer(request, parts[3], None)
                    return
                if len(parts) == 7 and parts[1] == "v2" and parts[2] == "models" and parts[4] == "versions":
                    if "%" not in parts[3]:
                        self.infer(request, parts[3], parts[5])
                        return
            if path.startswith("/v2/models/"):
                self._model_route(request, path[11:])
            elif path == "/v2/health/live":
                self._expect(request, _GET)
                request.respond(200 if self.server.live else 503, b"")
            elif path == "/v2/health/ready":
                self._expect(request, _GET)
                request.respond(200 if self.server.ready else 503, b"")
            elif path == "/v2" or path == "/v2/":
                self._expect(request, _GET)
                request.respond_json(200, self.server.metadata())
            elif path == "/v2/models":
                request.respond_error(404, "use /v2/repository/index to list models")
            elif path == "/v2/repository/index":
                self._expect(request, _POST)
                body = _json_body(request)
                request.respond_json(200, self.server.index(ready_only=body.get("ready") is True))
            elif path.startswith("/v2/repository/models/"):
                self._control_route(request, path[22:])
            elif path.startswith("/v2/systemsharedmemory/"):
                self._shm_route(request, path[23:], cuda=False)
            elif path.startswith("/v2/cudasharedmemory/"):
                self._shm_route(request, path[21:], cuda=True)
            else:
                request.respond_error(404, f"no route for {request.method.decode()} {path}")
        except InferdError as exc:
            request.respond_error(exc.status, exc.message)

    @staticmethod
    def _expect(request: HttpRequest, method: bytes) -> None:
        if request.method != method:
            raise _MethodNotAllowed(
                f"{request.method.decode()} is not allowed on {request.path}; use {method.decode()}"
            )

    def _control_route(self, request: HttpRequest, rest: str) -> None:
        """POST /v2/repository/models/{m}/load and /unload: answered when the work is done."""
        name, _, action = rest.rpartition("/")
        name = unquote(name)
        if not name or "/" in name or action not in ("load", "unload"):
            request.respond_error(404, f"no route for {request.method.decode()} {request.path}")
            return
        self._expect(request, _POST)
        body = _json_body(request)
        parameters = body.get("parameters") or {}
        if type(parameters) is not dict:
            raise InvalidRequest("'parameters' must be an object")
        if action == "load":
            work = self.server.load_model(name, parameters)
        else:
            work = self.server.unload_model(name)
        task = asyncio.get_running_loop().create_task(_control(request, work))
        self._control_tasks.add(task)
        task.add_done_callback(self._control_tasks.discard)

    def _shm_route(self, request: HttpRequest, rest: str, cuda: bool) -> None:
        """``[region/{name}/]status|register|unregister`` of the shared memory extensions.

        CUDA shared memory is not supported (no GPU memory here): its status is an empty list
        and unregistering succeeds (there is nothing to unregister; clients such as perf_analyzer
        unregister both kinds when they clean up), registering is refused with a 400."""
        parts = rest.split("/")
        name: str | None = None
        if len(parts) == 3 and parts[0] == "region" and parts[1]:
            name = unquote(parts[1])
            action = parts[2]
        elif len(parts) == 1:
            action = parts[0]
        else:
            action = ""
        if action not in ("status", "register", "unregister"):
            request.respond_error(404, f"no route for {request.method.decode()} {request.path}")
            return
        self._expect(request, _GET if action == "status" else _POST)
        registry = self.server.shared_memory
        if action == "status":
            if cuda and name is not None:
                raise NotFound(f"Unable to find CUDA shared memory region: '{name}'")
            request.respond_json(200, [] if cuda else registry.status(name))
        elif action == "unregister":
            if not cuda:
                registry.unregister(name)
            request.respond(200, b"")
        elif cuda:
            raise InvalidRequest("CUDA shared memory is not supported by inferd (use system shared memory)")
        else:
            if name is None:
                raise InvalidRequest("register a shared memory region at /v2/systemsharedmemory/region/{name}/register")
            body = _json_body(request)
            registry.register(name, body.get("key"), body.get("offset", 0), body.get("byte_size"))
            request.respond(200, b"")

    def _model_route(self, request: HttpRequest, rest: str) -> None:
        parts = rest.split("/")
        name = unquote(parts[0]) if "%" in parts[0] else parts[0]
        version: str | None = None
        tail = parts[1:]
        if len(tail) >= 2 and tail[0] == "versions":
            version = tail[1]
            tail = tail[2:]
        action = tail[0] if tail else ""
        if len(tail) > 1 or not name:
            request.respond_error(404, f"no route for {request.method.decode()} {request.path}")
            return
        if action == "infer":
            self._expect(request, _POST)
            self.infer(request, name, version)
        elif name == "stats" and not tail and version is None:
            self._expect(request, _GET)
            request.respond_json(200, self.server.statistics(None, None))
        elif action == "":
            self._expect(request, _GET)
            request.respond_json(200, self.server.model_metadata(name, version))
        elif action == "ready":
            self._expect(request, _GET)
            request.respond(200 if self.server.model_ready(name, version) else 503, b"")
        elif action == "config":
            self._expect(request, _GET)
            request.respond_json(200, self.server.model(name, version).config_dict())
        elif action == "stats":
            self._expect(request, _GET)
            request.respond_json(200, self.server.statistics(name, version))
        else:
            request.respond_error(404, f"no route for {request.method.decode()} {request.path}")

    # -- inference: the hot path ---------------------------------------------------------------
    def infer(self, request: HttpRequest, name: str, version: str | None) -> None:
        model = self.server.model(name, version)
        header, binary = split_body(request.body, request.headers.get(_HEADER_LENGTH))
        shared_memory = self.server.shared_memory
        inputs = decode_inputs(header.get("inputs"), binary, shared_memory)
        parameters = header.get("parameters")
        binary_default = False
        if parameters is not None:
            if type(parameters) is not dict:
                raise InvalidRequest("'parameters' must be an object")
            binary_default = parameters.get("binary_data_output") is True
        requested, binary_outputs, shm_outputs = _requested_outputs(header.get("outputs"), shared_memory)
        request_id = header.get("id")
        if request_id is not None and type(request_id) is not str:
            request_id = str(request_id)
        context = _Context(request, model.name, model.version_str, binary_outputs, binary_default, shm_outputs)
        infer_request = InferRequest(
            inputs, _complete, context, requested, request_id, parameters, request.received_ns, _finish
        )
        try:
            model.submit(infer_request)
        except InferdError:
            model.fail_request(infer_request)
            raise


def _json_body(request: HttpRequest) -> dict[str, Any]:
    if not request.body or not request.body.strip():
        return {}
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"malformed JSON request body: {exc}") from None
    if type(body) is not dict:
        raise InvalidRequest("the request body must be a JSON object")
    return body


async def _control(request: HttpRequest, work: Any) -> None:
    try:
        await work
    except InferdError as exc:
        request.respond_error(exc.status, exc.message)
    except Exception as exc:
        log.exception("%s failed", request.path)
        request.respond_error(500, f"internal server error: {exc!r}")
    else:
        request.respond(200, b"")


def _requested_outputs(
    entries: Any, shared_memory: SharedMemoryRegistry
) -> tuple[list[str] | None, dict[str, bool] | None, dict[str, tuple[str, memoryview]] | None]:
    if entries is None:
        return None, None, None
    if type(entries) is not list:
        raise InvalidRequest("'outputs' must be a list")
    names: list[str] = []
    binary: dict[str, bool] = {}
    shm: dict[str, tuple[str, memoryview]] = {}
    for entry in entries:
        if type(entry) is not dict or type(entry.get("name")) is not str:
            raise InvalidRequest("each entry of 'outputs' needs a 'name' string")
        name = entry["name"]
        names.append(name)
        params = entry.get("parameters")
        if params:
            if type(params) is not dict:
                raise InvalidRequest(f"output '{name}': 'parameters' must be an object")
            if params.get("classification"):
                raise InvalidRequest(f"output '{name}': the classification extension is not supported")
            if "binary_data" in params:
                binary[name] = params["binary_data"] is True
            if is_shm(params):
                shm[name] = shm_output(shared_memory, name, params)
    return names or None, binary or None, shm or None


def _complete(request: InferRequest, outputs: Tensors | None, error: InferdError | None) -> None:
    """On the instance thread: encode the answer and send it."""
    context: _Context = request.context
    http = context.http
    if error is not None:
        http.respond_from_thread(error.status, orjson.dumps({"error": error.message}))
        return
    assert outputs is not None
    try:
        header, parts = encode_response(
            context.model_name,
            context.version,
            request.id,
            outputs,
            context.binary_outputs,
            context.binary_default,
            shm_outputs=context.shm_outputs,
        )
    except InferdError as exc:  # e.g. an output that does not fit its shared memory region
        http.respond_from_thread(exc.status, orjson.dumps({"error": exc.message}))
        return
    except Exception as exc:
        log.exception("failed to encode the response of model '%s'", context.model_name)
        http.respond_from_thread(500, orjson.dumps({"error": f"failed to encode the response: {exc}"}))
        return
    if parts:
        parts.insert(0, header)
        http.respond_from_thread(200, parts, _OCTET, [(b"inference-header-content-length", b"%d" % len(header))])
    else:
        http.respond_from_thread(200, header, _JSON)


def _finish(request: InferRequest) -> None:
    """On the event loop, after ``_complete``."""
    request.context.http.finish()


class _MethodNotAllowed(InferdError):
    status = 405
