"""Build the bundled example model repository.

Writes a Triton-layout model repository::

    <repo>/digits/config.pbtxt      <repo>/digits/1/model.onnx
    <repo>/simple/config.pbtxt      <repo>/simple/1/model.onnx
    <repo>/mixed/config.pbtxt       <repo>/mixed/1/model.onnx

Models:

* ``digits`` -- a small MNIST-style CNN (torch), trained on scikit-learn's bundled
  ``load_digits()`` 8x8 images upscaled (bilinear) to 28x28 in [0, 1].
  ``input.1`` FP32 [N,1,28,28] -> ``logits`` FP32 [N,10].
* ``simple`` -- the classic Triton "simple" model (``onnx.helper``):
  ``INPUT0``/``INPUT1`` INT32 [N,16] -> ``OUTPUT0`` = sum, ``OUTPUT1`` = difference.
* ``mixed`` -- several inputs/outputs of different datatypes (``onnx.helper``):
  ``x`` FP32 [N,4], ``scale`` FP64 [N,1], ``k`` INT64 [N,1], ``text`` BYTES [N,1] ->
  ``y`` FP64 [N,4] = x * scale, ``positive`` BOOL [N,4] = x > 0,
  ``count`` INT64 [N,1] = sum(positive, axis=1) + k, ``text_out`` BYTES [N,1] = text.

Not in the bundled repository (about 4 MB), built on demand by ``build_captioning(repo)``:

* ``captioning`` -- the I/O signature and config of a Triton user's BLIP image captioning
  model (issue 3), small random weights (``onnx.helper``): ``pixel_values`` FP32
  [N,3,384,384], ``input_ids`` / ``attention_mask`` INT64 [N,T] -> ``logits`` FP32 [N,T,30524].

Usage::

    python -m inferd.examples.build_models [--out DIR] [--only digits simple mixed]

Importing this module needs only numpy: torch, onnx, onnxruntime and scikit-learn
are imported inside the functions that use them. ``digits_test_set()`` (numpy +
scikit-learn) gives tests the held-out test split that the bundled ``digits`` model
was evaluated on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

DEFAULT_REPOSITORY = Path(__file__).resolve().parent / "repository"

SEED = 0
DIGITS_IMAGE_SIZE = 28
DIGITS_TEST_FRACTION = 0.2
DIGITS_EPOCHS = 8
DIGITS_BATCH_SIZE = 32
DIGITS_LR = 2e-3
ONNX_OPSET = 17
# IR version 8 is what opset 17 shipped with (onnx 1.13); keeps the hand-built models
# loadable by older onnxruntime releases too.
ONNX_IR_VERSION = 8


# --------------------------------------------------------------------------- digits data


def upscale_bilinear(images: np.ndarray, size: int = DIGITS_IMAGE_SIZE) -> np.ndarray:
    """Bilinear resize of ``images`` [..., H, W] to [..., size, size].

    Same semantics as ``torch.nn.functional.interpolate(mode="bilinear",
    align_corners=False)`` (half-pixel centres, source coordinates clamped at 0),
    implemented in numpy so that no torch is needed.
    """
    images = np.asarray(images, dtype=np.float32)

    def weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scale = in_size / out_size
        src = (np.arange(out_size, dtype=np.float64) + 0.5) * scale - 0.5
        src = np.clip(src, 0.0, None)
        i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
        i1 = np.minimum(i0 + 1, in_size - 1)
        frac = (src - i0).astype(np.float32)
        return i0, i1, frac

    h, w = images.shape[-2:]
    r0, r1, rf = weights(h, size)
    c0, c1, cf = weights(w, size)
    rows = images[..., r0, :] * (1.0 - rf)[:, None] + images[..., r1, :] * rf[:, None]
    out = rows[..., c0] * (1.0 - cf) + rows[..., c1] * cf
    return out.astype(np.float32)


def _digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_images, train_labels, test_images, test_labels); images [N,1,28,28] in [0,1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # 0..16 -> [0, 1]
    labels = digits.target.astype(np.int64)
    images = upscale_bilinear(images)[:, None, :, :]  # [N,1,28,28]
    order = np.random.default_rng(SEED).permutation(len(labels))
    n_test = int(round(len(labels) * DIGITS_TEST_FRACTION))
    test, train = order[:n_test], order[n_test:]
    return (
        np.ascontiguousarray(images[train]),
        labels[train],
        np.ascontiguousarray(images[test]),
        labels[test],
    )


def digits_test_set() -> tuple[np.ndarray, np.ndarray]:
    """The held-out test split of the ``digits`` model.

    Returns ``(images, labels)``: images float32 [N,1,28,28] in [0, 1] (the model's
    ``input.1``), labels int64 [N]. Needs numpy and scikit-learn only.
    """
    _, _, images, labels = _digits_split()
    return images, labels


# --------------------------------------------------------------------------- configs

DIGITS_CONFIG = """\
name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {
    name: "input.1"
    data_type: TYPE_FP32
    dims: [ 1, 28, 28 ]
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }
]
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 150
}
"""

SIMPLE_CONFIG = """\
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"""

MIXED_CONFIG = """\
name: "mixed"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  {
    name: "x"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "scale"
    data_type: TYPE_FP64
    dims: [ 1 ]
  },
  {
    name: "k"
    data_type: TYPE_INT64
    dims: [ 1 ]
  },
  {
    name: "text"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }
]
output [
  {
    name: "y"
    data_type: TYPE_FP64
    dims: [ 4 ]
  },
  {
    name: "positive"
    data_type: TYPE_BOOL
    dims: [ 4 ]
  },
  {
    name: "count"
    data_type: TYPE_INT64
    dims: [ 1 ]
  },
  {
    name: "text_out"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }
]
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
dynamic_batching { }
"""


def _check_config(text: str, name: str) -> None:
    """Parse ``text`` as a Triton ModelConfig when tritonclient is installed."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:  # pragma: no cover - optional validation
        return
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.name == name, (config.name, name)


def _write_model_dir(repo: Path, name: str, config: str, model_bytes: bytes) -> Path:
    _check_config(config, name)
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)
    model_path = model_dir / "1" / "model.onnx"
    model_path.write_bytes(model_bytes)
    return model_path


def _ort_session(model_bytes: bytes):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def _check_onnx(model_bytes: bytes) -> None:
    import onnx

    model = onnx.load_from_string(model_bytes)
    onnx.checker.check_model(model, full_check=True)


# --------------------------------------------------------------------------- digits


def _digits_net():
    import torch
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 32, kernel_size=3),  # 28 -> 26
        nn.ReLU(),
        nn.MaxPool2d(2),  # -> 13
        nn.Conv2d(32, 64, kernel_size=3),  # -> 11
        nn.ReLU(),
        nn.MaxPool2d(2),  # -> 5
        nn.Flatten(),
        nn.Linear(64 * 5 * 5, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    ).to(torch.float32)


def build_digits(repo: Path, verbose: bool = True) -> Path:
    """Train the digits CNN, export it to ONNX and write ``<repo>/digits``."""
    import io
    import warnings

    import torch
    from torch import nn

    start = time.perf_counter()
    train_x, train_y, test_x, test_y = _digits_split()

    torch.manual_seed(SEED)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fixed reduction order: reproducible weights
    try:
        net = _digits_net()
        optimizer = torch.optim.Adam(net.parameters(), lr=DIGITS_LR)
        loss_fn = nn.CrossEntropyLoss()
        xs, ys = torch.from_numpy(train_x), torch.from_numpy(train_y)
        generator = torch.Generator().manual_seed(SEED)
        net.train()
        for _epoch in range(DIGITS_EPOCHS):
            perm = torch.randperm(len(ys), generator=generator)
            for i in range(0, len(ys), DIGITS_BATCH_SIZE):
                idx = perm[i : i + DIGITS_BATCH_SIZE]
                optimizer.zero_grad()
                loss = loss_fn(net(xs[idx]), ys[idx])
                loss.backward()
                optimizer.step()
        net.eval()
        with torch.no_grad():
            test_logits = net(torch.from_numpy(test_x)).numpy()
    finally:
        torch.set_num_threads(threads)
    accuracy = float((test_logits.argmax(1) == test_y).mean())
    n_params = sum(p.numel() for p in net.parameters())

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # The TorchScript-based exporter (dynamo=False) is deprecated; it is what we want.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            net,
            (torch.zeros(1, 1, DIGITS_IMAGE_SIZE, DIGITS_IMAGE_SIZE),),
            buffer,
            input_names=["input.1"],
            output_names=["logits"],
            dynamic_axes={"input.1": {0: "N"}, "logits": {0: "N"}},
            opset_version=ONNX_OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    model_bytes = buffer.getvalue()

    # Validate: checker, then onnxruntime against torch, then accuracy via onnxruntime.
    _check_onnx(model_bytes)
    session = _ort_session(model_bytes)
    assert [i.name for i in session.get_inputs()] == ["input.1"]
    assert [o.name for o in session.get_outputs()] == ["logits"]
    (batch3,) = session.run(["logits"], {"input.1": test_x[:3]})
    assert batch3.shape == (3, 10) and batch3.dtype == np.float32, (batch3.shape, batch3.dtype)
    np.testing.assert_allclose(batch3, test_logits[:3], rtol=1e-4, atol=1e-4)
    (ort_logits,) = session.run(["logits"], {"input.1": test_x})
    ort_accuracy = float((ort_logits.argmax(1) == test_y).mean())
    assert ort_accuracy > 0.95, f"digits test accuracy too low: {ort_accuracy:.4f}"

    path = _write_model_dir(repo, "digits", DIGITS_CONFIG, model_bytes)
    if verbose:
        print(
            f"digits: {n_params} params, {len(train_y)} train / {len(test_y)} test images, "
            f"test accuracy {accuracy:.4f} (torch) {ort_accuracy:.4f} (onnxruntime), "
            f"{len(model_bytes)} bytes, {time.perf_counter() - start:.1f}s -> {path}"
        )
    return path


# --------------------------------------------------------------------------- simple


def _serialize(graph) -> bytes:
    """An ONNX model of ``graph`` at the opset and IR version every example uses."""
    from onnx import helper

    model = helper.make_model(
        graph,
        producer_name="inferd.examples.build_models",
        opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
        ir_version=ONNX_IR_VERSION,
    )
    return model.SerializeToString()


def simple_model_bytes() -> bytes:
    import onnx
    from onnx import TensorProto, helper

    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["N", 16])

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        "simple",
        [info("INPUT0"), info("INPUT1")],
        [info("OUTPUT0"), info("OUTPUT1")],
    )
    return _serialize(graph)


def build_simple(repo: Path, verbose: bool = True) -> Path:
    model_bytes = simple_model_bytes()
    _check_onnx(model_bytes)
    session = _ort_session(model_bytes)
    rng = np.random.default_rng(SEED)
    a = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(3, 16), dtype=np.int32)
    out0, out1 = session.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    for out, expected in ((out0, a + b), (out1, a - b)):
        assert out.shape == (3, 16) and out.dtype == np.int32, (out.shape, out.dtype)
        np.testing.assert_array_equal(out, expected)
    path = _write_model_dir(repo, "simple", SIMPLE_CONFIG, model_bytes)
    if verbose:
        print(f"simple: {len(model_bytes)} bytes -> {path}")
    return path


# --------------------------------------------------------------------------- mixed


def mixed_model_bytes() -> bytes:
    import onnx
    from onnx import TensorProto, helper

    def info(name: str, dtype: int, width: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, dtype, ["N", width])

    nodes = [
        helper.make_node("Cast", ["x"], ["x_f64"], to=TensorProto.DOUBLE, name="cast_x"),
        helper.make_node("Mul", ["x_f64", "scale"], ["y"], name="mul_scale"),
        helper.make_node("Greater", ["x", "zero"], ["positive"], name="greater_zero"),
        helper.make_node("Cast", ["positive"], ["positive_i64"], to=TensorProto.INT64, name="cast_positive"),
        # opset >= 13: ReduceSum takes its axes as an input.
        helper.make_node("ReduceSum", ["positive_i64", "axes"], ["n_positive"], keepdims=1, name="reduce_sum"),
        helper.make_node("Add", ["n_positive", "k"], ["count"], name="add_k"),
        helper.make_node("Identity", ["text"], ["text_out"], name="identity_text"),
    ]
    initializers = [
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
    ]
    graph = helper.make_graph(
        nodes,
        "mixed",
        [
            info("x", TensorProto.FLOAT, 4),
            info("scale", TensorProto.DOUBLE, 1),
            info("k", TensorProto.INT64, 1),
            info("text", TensorProto.STRING, 1),
        ],
        [
            info("y", TensorProto.DOUBLE, 4),
            info("positive", TensorProto.BOOL, 4),
            info("count", TensorProto.INT64, 1),
            info("text_out", TensorProto.STRING, 1),
        ],
        initializer=initializers,
    )
    return _serialize(graph)


def build_mixed(repo: Path, verbose: bool = True) -> Path:
    model_bytes = mixed_model_bytes()
    _check_onnx(model_bytes)
    session = _ort_session(model_bytes)
    x = np.array([[1.5, -2.0, 0.0, 3.25], [-1.0, -0.5, -7.0, -3.0], [2.0, 4.0, 8.0, 0.125]], np.float32)
    scale = np.array([[2.0], [-0.5], [0.1]], np.float64)
    k = np.array([[10], [-3], [0]], np.int64)
    text = np.array([["hello"], [""], ["wörld ✓"]], dtype=object)
    names = ["y", "positive", "count", "text_out"]
    y, positive, count, text_out = session.run(names, {"x": x, "scale": scale, "k": k, "text": text})
    assert y.shape == (3, 4) and y.dtype == np.float64, (y.shape, y.dtype)
    np.testing.assert_array_equal(y, x.astype(np.float64) * scale)
    assert positive.shape == (3, 4) and positive.dtype == np.bool_, (positive.shape, positive.dtype)
    np.testing.assert_array_equal(positive, x > 0)
    assert count.shape == (3, 1) and count.dtype == np.int64, (count.shape, count.dtype)
    np.testing.assert_array_equal(count, np.array([[12], [-3], [4]], np.int64))
    assert text_out.shape == (3, 1) and text_out.dtype == object, (text_out.shape, text_out.dtype)
    assert text_out.tolist() == text.tolist(), text_out.tolist()
    path = _write_model_dir(repo, "mixed", MIXED_CONFIG, model_bytes)
    if verbose:
        print(f"mixed: {len(model_bytes)} bytes -> {path}")
    return path


# --------------------------------------------------------------------------- captioning

#: The BLIP-captioning seed's config (issue 3), verbatim apart from line breaks.
CAPTIONING_CONFIG = """\
name: "captioning"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "pixel_values" data_type: TYPE_FP32 dims: [ 3, 384, 384 ] },
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ -1, 30524 ] } ]
instance_group [ { kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 1, 2, 4, 8 ] max_queue_delay_microseconds: 1000 }
"""
CAPTIONING_VOCAB = 30524
CAPTIONING_IMAGE = 384
CAPTIONING_DIM = 16  # embedding width: two 30524x16 FP32 matrices, about 3.9 MB in all
CAPTIONING_PATCH = 32  # the image encoder's strided conv: 12x12 patches of 32x32 pixels
CAPTIONING_CHANNELS = 8


def captioning_model_bytes() -> bytes:
    """A captioning-shaped model with the BLIP seed's I/O signature, small random weights:

    ``pixel_values`` FP32 [N,3,384,384], ``input_ids`` INT64 [N,T], ``attention_mask`` INT64 [N,T]
    -> ``logits`` FP32 [N,T,30524], with

    * image = mean over patches of a strided (32x32, stride 32) conv, 3 -> 8 channels, then a
      projection to ``CAPTIONING_DIM``: [N,D];
    * tokens = embedding(input_ids mod 30524) * attention_mask: [N,T,D] (any INT64 is an id, so
      perf_analyzer's random input data works);
    * logits = tanh(tokens + image) @ W + b: [N,T,30524].

    Cheap on CPU: the largest cost is reading the image and writing the logits.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(SEED)
    d, c, k = CAPTIONING_DIM, CAPTIONING_CHANNELS, CAPTIONING_PATCH

    def weight(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    initializers = [
        weight("conv_w", (c, 3, k, k), 1.0 / (3 * k * k) ** 0.5),
        weight("conv_b", (c,), 0.1),
        weight("img_w", (c, d), 1.0 / c**0.5),
        weight("embedding", (CAPTIONING_VOCAB, d), 1.0),
        weight("out_w", (d, CAPTIONING_VOCAB), 1.0 / d**0.5),
        weight("out_b", (CAPTIONING_VOCAB,), 0.1),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
        helper.make_tensor("vocab", TensorProto.INT64, [], [CAPTIONING_VOCAB]),
    ]
    nodes = [
        helper.make_node(
            "Conv", ["pixel_values", "conv_w", "conv_b"], ["patches"], kernel_shape=[k, k], strides=[k, k]
        ),
        helper.make_node("Relu", ["patches"], ["patches_relu"]),
        helper.make_node("GlobalAveragePool", ["patches_relu"], ["pooled"]),  # [N,C,1,1]
        helper.make_node("Flatten", ["pooled"], ["pooled_flat"], axis=1),  # [N,C]
        helper.make_node("MatMul", ["pooled_flat", "img_w"], ["image"]),  # [N,D]
        helper.make_node("Unsqueeze", ["image", "axis1"], ["image_t"]),  # [N,1,D]
        # Any INT64 is a valid id (Mod into [0, vocab)): perf_analyzer's random data is not in range.
        helper.make_node("Mod", ["input_ids", "vocab"], ["ids"], fmod=0),
        helper.make_node("Gather", ["embedding", "ids"], ["tokens"], axis=0),  # [N,T,D]
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "axis2"], ["mask_t"]),  # [N,T,1]
        helper.make_node("Mul", ["tokens", "mask_t"], ["masked"]),
        helper.make_node("Add", ["masked", "image_t"], ["hidden_pre"]),
        helper.make_node("Tanh", ["hidden_pre"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "out_w"], ["projected"]),  # [N,T,V]
        helper.make_node("Add", ["projected", "out_b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "captioning",
        [
            helper.make_tensor_value_info(
                "pixel_values", TensorProto.FLOAT, ["N", 3, CAPTIONING_IMAGE, CAPTIONING_IMAGE]
            ),
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "T"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "T"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", "T", CAPTIONING_VOCAB])],
        initializer=initializers,
    )
    return _serialize(graph)


def captioning_inputs(batch: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for the captioning model (the mask zeroes the last quarter of each row)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq_len), np.int64)
    mask[:, seq_len - seq_len // 4 :] = 0
    return {
        "pixel_values": rng.random((batch, 3, CAPTIONING_IMAGE, CAPTIONING_IMAGE), dtype=np.float32),
        "input_ids": rng.integers(0, CAPTIONING_VOCAB, size=(batch, seq_len), dtype=np.int64),
        "attention_mask": mask,
    }


def build_captioning(repo: Path, verbose: bool = True) -> Path:
    """Write ``<repo>/captioning`` (the seed's config.pbtxt + 1/model.onnx, about 4 MB: not part
    of the bundled repository); checks in ONNX Runtime that batch 1 and 2 at sequence length 16
    give logits [N,16,30524]. Returns the model file."""
    model_bytes = captioning_model_bytes()
    _check_onnx(model_bytes)
    session = _ort_session(model_bytes)
    for batch in (1, 2):
        feeds = captioning_inputs(batch, 16, seed=batch)
        (logits,) = session.run(["logits"], feeds)
        assert logits.shape == (batch, 16, CAPTIONING_VOCAB) and logits.dtype == np.float32, logits.shape
        assert np.isfinite(logits).all()
    path = _write_model_dir(Path(repo), "captioning", CAPTIONING_CONFIG, model_bytes)
    if verbose:
        print(f"captioning: {len(model_bytes)} bytes -> {path}")
    return path


# --------------------------------------------------------------------------- main

BUILDERS = {"digits": build_digits, "simple": build_simple, "mixed": build_mixed}


# --------------------------------------------------------------------------- the seed's repository

#: The config of the Triton user's MNIST journey (seed 004), verbatim: no inputs or outputs (they
#: come from the model), five CPU instances, a 150 us queue delay.
SEED_CONFIG = """name: "onnx-mnist-cpu"
platform: "onnxruntime_onnx"
instance_group [ { count: 5 kind: KIND_CPU } ]
dynamic_batching: { max_queue_delay_microseconds: 150 }
"""


def write_seed_repository(repo: Path, source: Path | None = None) -> Path:
    """Write ``<repo>/onnx-mnist-cpu``: the digits model with its batch dimension fixed to 1
    (input ``input.1`` [1,1,28,28], as the seed's exported model has) and the seed's config."""
    import onnx

    model = onnx.load(str(source or DEFAULT_REPOSITORY / "digits" / "1" / "model.onnx"))
    for value in list(model.graph.input) + list(model.graph.output):
        dim = value.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_param")
        dim.dim_value = 1
    # Intermediate shapes recorded for the dynamic batch would contradict the fixed one.
    del model.graph.value_info[:]
    onnx.checker.check_model(model)
    model_dir = repo / "onnx-mnist-cpu"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (model_dir / "config.pbtxt").write_text(SEED_CONFIG)
    return model_dir


def build_all(repo: Path = DEFAULT_REPOSITORY, only: list[str] | None = None, verbose: bool = True) -> dict[str, Path]:
    repo = Path(repo)
    repo.mkdir(parents=True, exist_ok=True)
    return {name: BUILDERS[name](repo, verbose=verbose) for name in (only or list(BUILDERS))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_REPOSITORY,
        help=f"model repository to write (default: {DEFAULT_REPOSITORY})",
    )
    parser.add_argument("--only", nargs="+", choices=list(BUILDERS), help="build only these models")
    args = parser.parse_args(argv)
    build_all(args.out, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
