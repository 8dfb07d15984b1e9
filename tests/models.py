"""Test models built with ``onnx.helper``, and the Triton-layout repositories the tests serve.

Everything here is deterministic and small; the repositories are written into pytest tmp dirs.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8

#: V2 datatype -> (ONNX element type, numpy dtype, Triton config enum)
DATATYPES: dict[str, tuple[int, object, str]] = {
    "BOOL": (TensorProto.BOOL, np.bool_, "TYPE_BOOL"),
    "INT8": (TensorProto.INT8, np.int8, "TYPE_INT8"),
    "INT16": (TensorProto.INT16, np.int16, "TYPE_INT16"),
    "INT32": (TensorProto.INT32, np.int32, "TYPE_INT32"),
    "INT64": (TensorProto.INT64, np.int64, "TYPE_INT64"),
    "UINT8": (TensorProto.UINT8, np.uint8, "TYPE_UINT8"),
    "UINT16": (TensorProto.UINT16, np.uint16, "TYPE_UINT16"),
    "UINT32": (TensorProto.UINT32, np.uint32, "TYPE_UINT32"),
    "UINT64": (TensorProto.UINT64, np.uint64, "TYPE_UINT64"),
    "FP16": (TensorProto.FLOAT16, np.float16, "TYPE_FP16"),
    "FP32": (TensorProto.FLOAT, np.float32, "TYPE_FP32"),
    "FP64": (TensorProto.DOUBLE, np.float64, "TYPE_FP64"),
    "BYTES": (TensorProto.STRING, np.object_, "TYPE_STRING"),
}


def identity_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def _model_bytes(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(
        graph,
        producer_name="inferd-tests",
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
    )
    onnx.checker.check_model(model)
    return model.SerializeToString()


def identity_model(elem_type: int, shape: list) -> bytes:
    """INPUT0 -> OUTPUT0, unchanged."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", elem_type, shape)],
        [helper.make_tensor_value_info("OUTPUT0", elem_type, shape)],
    )
    return _model_bytes(graph)


def add_const_model(value: float, shape: list | None = None) -> bytes:
    """FP32 INPUT0 -> OUTPUT0 = INPUT0 + value (tells versions apart)."""
    shape = shape or ["N", 4]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "c"], ["OUTPUT0"])],
        "add_const",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
        initializer=[helper.make_tensor("c", TensorProto.FLOAT, [], [value])],
    )
    return _model_bytes(graph)


#: Size of the square matrices the slow model multiplies on each loop iteration.
SLOW_MATRIX = 128


def slow_model() -> bytes:
    """A model whose run time the request picks: ``x`` FP32 [N,1], ``n`` INT64 [N,1] -> ``y`` = x.

    A Loop runs max(n) iterations of ``W = tanh(W @ C)`` on a SLOW_MATRIX square matrix, so one
    execution takes max(n) times the cost of one iteration (see ``calibrate_slow``). ``y`` depends
    on the loop result (times zero) so the loop cannot be pruned.
    """
    s = SLOW_MATRIX
    rng = np.random.default_rng(0)
    c = (rng.standard_normal((s, s)) / np.sqrt(s)).astype(np.float32)
    w0 = (rng.standard_normal((s, s)) / np.sqrt(s)).astype(np.float32)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["w_in", "C"], ["prod"]),
            helper.make_node("Tanh", ["prod"], ["w_out"]),
        ],
        "slow_body",
        [
            helper.make_tensor_value_info("iter", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("w_in", TensorProto.FLOAT, [s, s]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("w_out", TensorProto.FLOAT, [s, s]),
        ],
    )
    nodes = [
        helper.make_node("ReduceMax", ["n"], ["trips"], keepdims=0),
        helper.make_node("Loop", ["trips", "cond", "W0"], ["w_final"], body=body),
        helper.make_node("ReduceSum", ["w_final"], ["total"], keepdims=1),  # [1, 1]
        helper.make_node("Mul", ["total", "zero"], ["nothing"]),
        helper.make_node("Add", ["x", "nothing"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "slow",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1]),
            helper.make_tensor_value_info("n", TensorProto.INT64, ["N", 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        initializer=[
            helper.make_tensor("cond", TensorProto.BOOL, [], [True]),
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
            helper.make_tensor("C", TensorProto.FLOAT, [s, s], c.flatten().tolist()),
            helper.make_tensor("W0", TensorProto.FLOAT, [s, s], w0.flatten().tolist()),
        ],
    )
    return _model_bytes(graph)


def calibrate_slow(model_bytes: bytes, threads: int = 1) -> float:
    """Seconds per loop iteration of the slow model, measured here with onnxruntime."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model_bytes, sess_options=options, providers=["CPUExecutionProvider"])
    feeds = {"x": np.zeros((1, 1), np.float32), "n": np.array([[20]], np.int64)}
    session.run(None, feeds)  # warm-up
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        session.run(None, {"x": feeds["x"], "n": np.array([[200]], np.int64)})
        best = min(best, time.perf_counter() - start)
    return best / 200


def write_model(repo: Path, name: str, model_bytes: bytes | None, config: str | None, versions=(1,)) -> Path:
    """``<repo>/<name>/config.pbtxt`` (when given) and ``<repo>/<name>/<v>/model.onnx`` per version."""
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for version in versions:
        (model_dir / str(version)).mkdir(exist_ok=True)
        if model_bytes is not None:
            (model_dir / str(version) / "model.onnx").write_bytes(model_bytes)
    return model_dir


def identity_config(name: str, datatype: str, max_batch_size: int = 8, extra: str = "") -> str:
    enum = DATATYPES[datatype][2]
    return f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: {enum} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {enum} dims: [ -1 ] }} ]
{extra}
"""


def slow_config(name: str, max_batch_size: int, extra: str = "", instances: int = 1) -> str:
    return f"""
name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [
  {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "n" data_type: TYPE_INT64 dims: [ 1 ] }}
]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
{extra}
"""


#: Models in the session-wide test repository (all of them load).
TEST_MODELS = [identity_name(dt) for dt in DATATYPES] + [
    "versioned",
    "tuned",
    "kind_auto",
    "auto_dynamic",
    "auto_fixed",
    "partial_config",
    "batching",
    "slow_batching",
    "slow_preferred",
    "no_batching_dyn",
    "slow",
    "slow_queue",
    "slow_timeout",
    "slow_timeout_override",
]


def build_test_repository(repo: Path) -> Path:
    """Write every model of TEST_MODELS into ``repo``."""
    repo.mkdir(parents=True, exist_ok=True)
    for datatype, (elem_type, _, _) in DATATYPES.items():
        name = identity_name(datatype)
        write_model(repo, name, identity_model(elem_type, ["N", "D"]), identity_config(name, datatype))

    # Versions 1 and 3: only 3 is served. v1 adds 1, v3 adds 3.
    versioned = write_model(
        repo,
        "versioned",
        None,
        'name: "versioned"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n',
        versions=(),
    )
    for version in (1, 3):
        (versioned / str(version)).mkdir()
        (versioned / str(version) / "model.onnx").write_bytes(add_const_model(float(version)))
    # A non-numeric folder is not a version.
    (versioned / "notes").mkdir()

    # ONNX Runtime tuning parameters and the optimization level, as Triton's onnxruntime backend reads them.
    write_model(
        repo,
        "tuned",
        add_const_model(4.0),
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
        'parameters { key: "inter_op_thread_count" value: { string_value: "1" } }\n'
        "optimization { graph { level: 1 } }\n",
    )
    # KIND_AUTO on a machine without a GPU: CPU instances.
    write_model(
        repo,
        "kind_auto",
        add_const_model(6.0),
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\ninstance_group [ { count: 2 kind: KIND_AUTO } ]\n',
    )
    # No config.pbtxt at all: every tensor has a dynamic first dim -> max_batch_size 4 + dynamic batching.
    write_model(repo, "auto_dynamic", add_const_model(0.5), None)
    # No config.pbtxt and fixed shapes -> no batching, dims as in the model.
    write_model(repo, "auto_fixed", add_const_model(2.0, [2, 3]), None)
    # A config without inputs/outputs (and the colon form of a message field).
    write_model(
        repo,
        "partial_config",
        add_const_model(-1.0),
        "max_batch_size: 8\ninstance_group [ { count: 2 kind: KIND_CPU } ]\ndynamic_batching: { max_queue_delay_microseconds: 100 }\n",
    )

    fp32_identity = identity_model(TensorProto.FLOAT, ["N", "D"])
    # Dynamic batching on a model with a variable dimension (requests of different widths can't share).
    write_model(
        repo,
        "batching",
        fp32_identity,
        identity_config("batching", "FP32", 32, "dynamic_batching { max_queue_delay_microseconds: 200000 }"),
    )
    # Batching-capable but without dynamic_batching: every request executes alone.
    write_model(repo, "no_batching_dyn", fp32_identity, identity_config("no_batching_dyn", "FP32", 8))

    slow = slow_model()
    write_model(repo, "slow", slow, slow_config("slow", 4, "dynamic_batching { }"))
    # Requests queued behind a long run of the one instance leave together...
    write_model(
        repo,
        "slow_batching",
        slow,
        slow_config("slow_batching", 16, "dynamic_batching { max_queue_delay_microseconds: 20000 }"),
    )
    # ... or in preferred_batch_size pieces.
    write_model(
        repo,
        "slow_preferred",
        slow,
        slow_config(
            "slow_preferred",
            8,
            "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000 }",
        ),
    )
    write_model(
        repo,
        "slow_queue",
        slow,
        slow_config("slow_queue", 1, "dynamic_batching { default_queue_policy { max_queue_size: 2 } }"),
    )
    write_model(
        repo,
        "slow_timeout",
        slow,
        slow_config(
            "slow_timeout",
            1,
            "dynamic_batching { default_queue_policy { default_timeout_microseconds: 50000 timeout_action: REJECT } }",
        ),
    )
    write_model(
        repo,
        "slow_timeout_override",
        slow,
        slow_config(
            "slow_timeout_override",
            1,
            "dynamic_batching { default_queue_policy { allow_timeout_override: true } }",
        ),
    )
    return repo


#: Good and bad models for the load-failure tests.
LIFECYCLE_GOOD = ["good", "slow"]
LIFECYCLE_BAD = {
    "broken_file": "onnxruntime could not load",
    "gpu_only": "KIND_GPU",
    "bad_config": "failed to parse",
    "sequence": "sequence batching",
    "no_version": "no version folder",
    "wrong_dims": "dims",
    "dup": "two repositories",
    "bad_param": "intra_op_thread_count",
    "bad_platform": "tensorrt_plan",
}


def build_second_repository(repo: Path) -> Path:
    """Served next to the lifecycle repository: one model of its own, one name both have."""
    repo.mkdir(parents=True, exist_ok=True)
    write_model(repo, "other_good", add_const_model(5.0), None)
    write_model(repo, "dup", add_const_model(5.0), None)
    return repo


def build_lifecycle_repository(repo: Path) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    write_model(repo, "good", add_const_model(1.0), 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n')
    write_model(repo, "slow", slow_model(), slow_config("slow", 4, "dynamic_batching { }"))
    broken = write_model(repo, "broken_file", None, 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n')
    (broken / "1" / "model.onnx").write_bytes(b"this is not an onnx model\x00\x01\x02")
    write_model(
        repo,
        "gpu_only",
        add_const_model(1.0),
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\ninstance_group [ { count: 1 kind: KIND_GPU } ]\n',
    )
    write_model(repo, "bad_config", add_const_model(1.0), "max_batch_size: 4\nthis is { not protobuf text\n")
    write_model(
        repo,
        "sequence",
        add_const_model(1.0),
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\nsequence_batching { }\n',
    )
    write_model(repo, "no_version", None, 'platform: "onnxruntime_onnx"\n', versions=())
    write_model(repo, "dup", add_const_model(1.0), None)
    write_model(
        repo,
        "bad_param",
        add_const_model(1.0),
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'parameters { key: "intra_op_thread_count" value: { string_value: "many" } }\n',
    )
    write_model(repo, "bad_platform", add_const_model(1.0), 'platform: "tensorrt_plan"\nmax_batch_size: 4\n')
    write_model(
        repo,
        "wrong_dims",
        add_const_model(1.0),
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4, 4 ] } ]\n',
    )
    return repo
