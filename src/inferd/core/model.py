"""A loaded model version: its configuration, instances, scheduler, statistics and validation."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as pb

from inferd.backends import backend_class
from inferd.backends.base import Backend, Device
from inferd.config.model_config import (
    ModelConfig,
    complete_config,
    config_to_dict,
    resolve_platform,
    validate_config,
)
from inferd.core.datatypes import CONFIG_TO_V2, V2_TO_NUMPY, v2_name
from inferd.core.errors import InferdError, InvalidRequest, ModelLoadError, Unavailable
from inferd.core.scheduler import BatchPolicy, Instance, Scheduler
from inferd.core.stats import DURATION_BOUNDS_NS, ModelStats
from inferd.core.types import InferRequest, Tensors

log = logging.getLogger("inferd.model")


def _gpu_count() -> int:
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return 0
    except ImportError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        import ctypes

        cuda = ctypes.CDLL("libcudart.so")
        count = ctypes.c_int()
        return count.value if cuda.cudaGetDeviceCount(ctypes.byref(count)) == 0 else 0
    except OSError:
        return 0


def plan_devices(config: ModelConfig) -> list[Device]:
    """One Device per instance, following ``instance_group`` (Triton's defaults where it's empty)."""
    gpus = _gpu_count()
    plan: list[tuple[str, int]] = []
    groups = list(config.instance_group) or [pb.ModelInstanceGroup(kind=pb.ModelInstanceGroup.KIND_AUTO)]
    for group in groups:
        count = group.count or 1
        kind = group.kind
        if kind == pb.ModelInstanceGroup.KIND_AUTO:
            kind = pb.ModelInstanceGroup.KIND_GPU if gpus else pb.ModelInstanceGroup.KIND_CPU
        if kind == pb.ModelInstanceGroup.KIND_GPU:
            if not gpus:
                raise ModelLoadError(
                    f"model '{config.name}': instance_group asks for KIND_GPU but no GPU is available "
                    "(use KIND_CPU, or KIND_AUTO to fall back to the CPU)"
                )
            ids = list(group.gpus) or list(range(gpus))
            for gpu in ids:
                if gpu >= gpus:
                    raise ModelLoadError(f"model '{config.name}': instance_group names GPU {gpu} but only {gpus} exist")
                plan.extend(("gpu", gpu) for _ in range(count))
        else:
            plan.extend(("cpu", 0) for _ in range(count))
    cpu_instances = sum(1 for kind, _ in plan if kind == "cpu") or 1
    threads = max(1, (os.cpu_count() or 1) // cpu_instances)
    return [Device(kind, index, threads if kind == "cpu" else 1) for kind, index in plan]


def batch_policy(config: ModelConfig) -> BatchPolicy:
    if not config.HasField("dynamic_batching"):
        return BatchPolicy(max_batch_size=config.max_batch_size)
    batching = config.dynamic_batching
    queue = batching.default_queue_policy
    return BatchPolicy(
        max_batch_size=config.max_batch_size,
        dynamic=True,
        preferred=tuple(batching.preferred_batch_size),
        max_queue_delay_ns=batching.max_queue_delay_microseconds * 1000,
        max_queue_size=queue.max_queue_size,
        timeout_ns=queue.default_timeout_microseconds * 1000,
        timeout_delays=queue.timeout_action == pb.ModelQueuePolicy.DELAY,
        allow_timeout_override=queue.allow_timeout_override,
    )


class _InputSpec:
    __slots__ = ("name", "dtype", "datatype", "dims", "wildcard", "optional", "text")

    def __init__(self, name: str, datatype: str, dims: tuple[int, ...], optional: bool, text: bool) -> None:
        self.name = name
        self.text = text
        self.datatype = datatype
        self.dtype = V2_TO_NUMPY.get(datatype)
        self.dims = dims
        self.wildcard = -1 in dims
        self.optional = optional


class Model:
    """One version of one model, from load to unload."""

    def __init__(self, config: ModelConfig, version: int, path: Path) -> None:
        self.name = config.name
        self.version = version
        self.version_str = str(version)
        self.config = config
        self.path = path
        self.state = "LOADING"
        self.reason = ""
        self.stats = ModelStats()
        self.scheduler: Scheduler | None = None
        self.instances: list[Instance] = []
        self.max_batch_size = 0
        self.inflight = 0
        self._inputs: dict[str, _InputSpec] = {}
        self._required: frozenset[str] = frozenset()
        self._outputs: frozenset[str] = frozenset()
        self._needs_signature = False
        self.bytes_as_text = False
        self._post: Callable[..., Any] = _unstarted
        self.loop_thread_id = 0

    # -- loading ---------------------------------------------------------------------------
    def load(self, config_found: bool) -> None:
        """Create the backends (blocking: call it off the event loop) and complete the config."""
        config = self.config
        resolve_platform(config, self.path)
        validate_config(config)
        model_file = self.path / config.default_model_filename
        if not model_file.exists():
            raise ModelLoadError(f"model '{self.name}' version {self.version}: {model_file} does not exist")
        devices = plan_devices(config)
        cls = backend_class(config.backend)
        backends: list[Backend] = []
        try:
            first = cls(model_file, config, devices[0])
            backends.append(first)
            inputs, outputs = first.signature()
            complete_config(config, inputs, outputs, config_found)
            validate_config(config)
            _complete_instance_groups(config, devices)
            devices = plan_devices(config)
            backends.extend(cls(model_file, config, device) for device in devices[1:])
        except BaseException:
            for backend in backends:
                backend.close()
            raise
        self.bytes_as_text = bool(getattr(cls, "bytes_as_text", False))
        self.instances = [
            Instance(f"{self.name}-{self.version}-{i}", backend, device)
            for i, (backend, device) in enumerate(zip(backends, devices))
        ]
        self._prepare_specs()

    def _prepare_specs(self) -> None:
        config = self.config
        self.max_batch_size = config.max_batch_size
        self._inputs = {}
        for entry in config.input:
            datatype = CONFIG_TO_V2.get(pb.DataType.Name(entry.data_type), "INVALID")
            dims = tuple(entry.dims)
            text = datatype == "BYTES" and self.bytes_as_text
            self._inputs[entry.name] = _InputSpec(entry.name, datatype, dims, entry.optional, text)
        self._required = frozenset(n for n, s in self._inputs.items() if not s.optional)
        self._outputs = frozenset(entry.name for entry in config.output)
        self._needs_signature = any(s.wildcard or s.optional for s in self._inputs.values())

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._post = loop.call_soon_threadsafe
        self.loop_thread_id = threading.get_ident()
        self.scheduler = Scheduler(self.name, batch_policy(self.config), self.instances, loop, self._deliver)
        self.scheduler.start()
        self.state = "READY"

    def stop(self) -> None:
        """Stop the instances; anything still queued is failed with a clear error."""
        self.state = "UNAVAILABLE"
        self.reason = "unloaded"
        if self.scheduler is not None:
            left = self.scheduler.stop()
            if left:
                self._deliver(left, None, Unavailable(f"model '{self.name}' was unloaded"), 0, 0, 0, 0)
        for instance in self.instances:
            instance.backend.close()
        self.instances = []

    # -- requests --------------------------------------------------------------------------
    def submit(self, request: InferRequest) -> None:
        """Validate and queue a request (on the event loop). Raises InferdError when refused."""
        if self.state != "READY":
            raise Unavailable(f"model '{self.name}' version {self.version} is not ready")
        self._validate(request)
        assert self.scheduler is not None
        self.scheduler.enqueue(request)
        self.inflight += 1

    def _validate(self, request: InferRequest) -> None:
        inputs = request.inputs
        specs = self._inputs
        batching = self.max_batch_size > 0
        rows = -1
        for name, array in inputs.items():
            spec = specs.get(name)
            if spec is None:
                raise InvalidRequest(f"unexpected inference input '{name}' for model '{self.name}'")
            if array.dtype != spec.dtype:
                raise InvalidRequest(
                    f"inference input '{name}' has datatype {_datatype(array)} but model '{self.name}' "
                    f"expects {spec.datatype}"
                )
            shape = array.shape
            if batching:
                if not shape:
                    raise self._shape_error(spec, shape)
                if rows == -1:
                    rows = shape[0]
                elif shape[0] != rows:
                    raise InvalidRequest(
                        f"inputs of model '{self.name}' must share one batch size: '{name}' has {shape[0]}, "
                        f"others have {rows}"
                    )
                shape = shape[1:]
            if shape != spec.dims:
                dims = spec.dims
                if not spec.wildcard or len(shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, shape)):
                    raise self._shape_error(spec, array.shape)
            if spec.text:
                inputs[name] = _as_text(name, array)
        if len(inputs) < len(self._required) or not self._required.issubset(inputs):
            missing = sorted(self._required.difference(inputs))
            raise InvalidRequest(
                f"model '{self.name}' expects {len(self._required)} inputs but got {len(inputs)}: "
                f"missing required input(s) {missing}"
            )
        if batching:
            if rows < 1 or rows > self.max_batch_size:
                raise InvalidRequest(
                    f"inference request batch size {rows} for model '{self.name}' must be between 1 and "
                    f"max_batch_size {self.max_batch_size}"
                )
            request.rows = rows
        if self._needs_signature:
            request.signature = tuple((n, a.shape[1:] if batching else a.shape) for n, a in sorted(inputs.items()))
        if request.requested_outputs:
            for name in request.requested_outputs:
                if name not in self._outputs:
                    raise InvalidRequest(f"unexpected inference output '{name}' for model '{self.name}'")

    def _shape_error(self, spec: _InputSpec, shape: tuple[int, ...]) -> InvalidRequest:
        expected = ([-1] if self.max_batch_size > 0 else []) + list(spec.dims)
        return InvalidRequest(
            f"unexpected shape for input '{spec.name}' for model '{self.name}': expected "
            f"{_dims(expected)}, got {_dims(shape)}"
        )

    def _deliver(
        self,
        batch: list[InferRequest],
        results: list[Tensors] | None,
        error: InferdError | None,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        """On the instance thread: answer each request of the batch, then hand the bookkeeping
        to the event loop in one call."""
        if results is not None:
            for request, outputs in zip(batch, results):
                wanted = request.requested_outputs
                if wanted:
                    outputs = {name: outputs[name] for name in wanted}
                self._answer(request, outputs, None)
        else:
            for request in batch:
                self._answer(request, None, error)
        timings = (queue_ns, input_ns, infer_ns, output_ns, perf_counter_ns())
        if self.loop_thread_id == threading.get_ident():
            self._account(batch, results is not None, timings)
        else:
            self._post(self._account, batch, results is not None, timings)

    def _answer(self, request: InferRequest, outputs: Tensors | None, error: InferdError | None) -> None:
        try:
            request.done(request, outputs, error)
        except Exception:  # a front end's failure to answer one request must not stop the others
            log.exception("failed to answer a request of model '%s'", self.name)

    def _account(self, batch: list[InferRequest], ok: bool, timings: tuple[int, int, int, int, int]) -> None:
        """On the event loop: statistics, then each request's ``finish`` hook."""
        stats = self.stats
        queue_ns, input_ns, infer_ns, output_ns, end = timings
        self.inflight -= len(batch)
        elapsed = 0
        rows = 0
        if ok:
            buckets = stats.duration_buckets
            for request in batch:
                duration = end - request.received_ns
                elapsed += duration
                rows += request.rows
                buckets[bisect_left(DURATION_BOUNDS_NS, duration)] += 1
        else:
            for request in batch:
                elapsed += end - request.received_ns
        if ok:
            stats.record_batch(rows, len(batch), queue_ns, input_ns, infer_ns, output_ns)
            stats.success_count += len(batch)
            stats.success_ns += elapsed
        else:
            stats.fail_count += len(batch)
            stats.fail_ns += elapsed
        for request in batch:
            finish = request.finish
            if finish is not None:
                finish(request)

    def fail_request(self, request: InferRequest) -> None:
        """Count a request refused before it was queued (bad input, full queue)."""
        self.stats.fail_count += 1
        self.stats.fail_ns += perf_counter_ns() - request.received_ns

    # -- descriptions ----------------------------------------------------------------------
    def metadata(self, versions: list[str]) -> dict[str, Any]:
        prefix = [-1] if self.max_batch_size > 0 else []

        def tensors(entries: Any) -> list[dict[str, Any]]:
            return [
                {
                    "name": e.name,
                    "datatype": CONFIG_TO_V2.get(pb.DataType.Name(e.data_type), "INVALID"),
                    "shape": prefix + list(e.dims),
                }
                for e in entries
            ]

        return {
            "name": self.name,
            "versions": versions,
            "platform": self.config.platform,
            "inputs": tensors(self.config.input),
            "outputs": tensors(self.config.output),
        }

    def config_dict(self) -> dict[str, Any]:
        return config_to_dict(self.config)


def _complete_instance_groups(config: ModelConfig, devices: list[Device]) -> None:
    """Show what was actually placed, as Triton's config does: a default group when the config
    had none, resolved KIND_AUTO, and a name for every group."""
    if not config.instance_group:
        group = config.instance_group.add()
        group.count = 1
        group.kind = pb.ModelInstanceGroup.KIND_GPU if devices[0].kind == "gpu" else pb.ModelInstanceGroup.KIND_CPU
        if devices[0].kind == "gpu":
            group.gpus.extend(sorted({d.index for d in devices}))
    for index, group in enumerate(config.instance_group):
        if group.count == 0:
            group.count = 1
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO:
            group.kind = (
                pb.ModelInstanceGroup.KIND_GPU
                if any(d.kind == "gpu" for d in devices)
                else pb.ModelInstanceGroup.KIND_CPU
            )
        if not group.name:
            group.name = f"{config.name}_{index}"


def _unstarted(*args: Any) -> None:
    raise RuntimeError("model not started")


def _as_text(name: str, array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=np.object_)
    flat = out.reshape(-1)
    try:
        for i, item in enumerate(array.reshape(-1)):
            flat[i] = item.decode() if isinstance(item, bytes) else item
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"input '{name}' element {i} is not UTF-8 text, which this model's string tensors require: {exc}"
        ) from None
    return out


def _datatype(array: np.ndarray) -> str:
    return v2_name(array.dtype)


def _dims(shape: Any) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
