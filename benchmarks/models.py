"""Models and model repositories for the benchmarks.

* ``build_resnet18(path)`` -- the real ResNet-18 architecture (plain torch, no
  torchvision), random weights from a fixed seed, exported to ONNX:
  ``input`` FP32 [N,3,224,224] -> ``output`` FP32 [N,1000].
* ``write_resnet18_repository(repo, ...)`` -- ``<repo>/resnet18`` from the cached
  ``benchmarks/.cache/resnet18.onnx`` (built on first use).
* ``write_digits_repository(repo, ...)`` -- ``<repo>/digits`` reusing the bundled
  ``src/inferd/examples/repository/digits/1/model.onnx``.
* ``write_captioning_repository(repo)`` -- ``<repo>/captioning``: the BLIP-captioning seed's
  I/O signature and config (issue 3), built by ``inferd.examples.build_models.build_captioning``
  (onnx.helper, small random weights, about 4 MB, a fraction of a second).

Importing this module needs no torch; only ``build_resnet18`` (on a cache miss) does.

``python benchmarks/models.py`` builds ResNet-18 into the cache and prints its path
and size.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE_DIR = HERE / ".cache"
RESNET18_CACHE = CACHE_DIR / "resnet18.onnx"
CAPTIONING_CACHE = CACHE_DIR / "captioning-repo"  # a model repository holding only captioning
BUNDLED_REPOSITORY = HERE.parent / "src" / "inferd" / "examples" / "repository"
SEED = 0
ONNX_OPSET = 17


# --------------------------------------------------------------------------- ResNet-18


def _resnet18():
    """torchvision's ``resnet18()`` architecture (and initialisation), in plain torch."""
    from torch import nn

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self, layers=(2, 2, 2, 2), num_classes: int = 1000):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = self._make_layer(64, layers[0])
            self.layer2 = self._make_layer(128, layers[1], stride=2)
            self.layer3 = self._make_layer(256, layers[2], stride=2)
            self.layer4 = self._make_layer(512, layers[3], stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * BasicBlock.expansion, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

        def _make_layer(self, planes: int, blocks: int, stride: int = 1):
            downsample = None
            if stride != 1 or self.inplanes != planes * BasicBlock.expansion:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * BasicBlock.expansion, 1, stride=stride, bias=False),
                    nn.BatchNorm2d(planes * BasicBlock.expansion),
                )
            layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * BasicBlock.expansion
            layers += [BasicBlock(self.inplanes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            x = self.avgpool(x).flatten(1)
            return self.fc(x)

    return ResNet()


def build_resnet18(path: Path = RESNET18_CACHE) -> Path:
    """Export a random-weight (fixed seed) ResNet-18 to ONNX at ``path``; no-op if it exists.

    ``input`` FP32 [N,3,224,224] -> ``output`` FP32 [N,1000], dynamic batch axis,
    opset 17, TorchScript exporter (``dynamo=False``).
    """
    path = Path(path)
    if path.exists():
        return path
    import warnings

    import torch

    torch.manual_seed(SEED)
    model = _resnet18().eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with warnings.catch_warnings():
            # The TorchScript-based exporter (dynamo=False) is deprecated; it is what we want.
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                model,
                (torch.zeros(1, 3, 224, 224),),
                str(tmp),
                input_names=["input"],
                output_names=["output"],
                dynamic_axes={"input": {0: "N"}, "output": {0: "N"}},
                opset_version=ONNX_OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        os.replace(tmp, path)  # atomic: a half-written file is never taken as the cache
    finally:
        tmp.unlink(missing_ok=True)
    return path


# --------------------------------------------------------------------------- configs


def _dynamic_batching(max_queue_delay_us: int | None, preferred: list[int] | None) -> str:
    """A ``dynamic_batching`` block; empty when neither a delay nor preferred sizes are given."""
    if max_queue_delay_us is None and not preferred:
        return ""
    lines = ["dynamic_batching {"]
    if preferred:
        lines.append(f"  preferred_batch_size: [ {', '.join(str(int(p)) for p in preferred)} ]")
    if max_queue_delay_us is not None:
        lines.append(f"  max_queue_delay_microseconds: {int(max_queue_delay_us)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _config(
    name: str,
    inputs: list[tuple[str, str, list[int]]],
    outputs: list[tuple[str, str, list[int]]],
    instance_count: int,
    max_batch_size: int,
    max_queue_delay_us: int | None,
    preferred: list[int] | None,
) -> str:
    def tensors(specs: list[tuple[str, str, list[int]]]) -> str:
        return ",\n".join(
            f'  {{\n    name: "{n}"\n    data_type: {t}\n    dims: [ {", ".join(map(str, d))} ]\n  }}'
            for n, t, d in specs
        )

    text = (
        f'name: "{name}"\n'
        'platform: "onnxruntime_onnx"\n'
        f"max_batch_size: {int(max_batch_size)}\n"
        f"input [\n{tensors(inputs)}\n]\n"
        f"output [\n{tensors(outputs)}\n]\n"
        f"instance_group [\n  {{\n    count: {int(instance_count)}\n    kind: KIND_CPU\n  }}\n]\n"
    ) + _dynamic_batching(max_queue_delay_us, preferred)
    try:  # validate against Triton's schema when tritonclient is installed
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2

        text_format.Parse(text, model_config_pb2.ModelConfig())
    except ImportError:
        pass
    return text


def _install_model_file(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` (hard link when possible, else copy); replaces ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def write_resnet18_repository(
    repo: Path,
    instance_count: int = 1,
    max_batch_size: int = 8,
    max_queue_delay_us: int | None = None,
    preferred: list[int] | None = None,
) -> Path:
    """Write ``<repo>/resnet18`` (config.pbtxt + 1/model.onnx); returns the model directory.

    The model file comes from ``benchmarks/.cache/resnet18.onnx`` (built if missing).
    A ``dynamic_batching`` block is written when ``max_queue_delay_us`` or
    ``preferred`` is given.
    """
    model_dir = Path(repo) / "resnet18"
    _install_model_file(build_resnet18(RESNET18_CACHE), model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(
        _config(
            "resnet18",
            [("input", "TYPE_FP32", [3, 224, 224])],
            [("output", "TYPE_FP32", [1000])],
            instance_count,
            max_batch_size,
            max_queue_delay_us,
            preferred,
        )
    )
    return model_dir


def write_digits_repository(
    repo: Path,
    instance_count: int,
    max_batch_size: int = 64,
    max_queue_delay_us: int | None = 150,
    preferred: list[int] | None = None,
) -> Path:
    """Write ``<repo>/digits`` (config.pbtxt + 1/model.onnx copied from the bundled model).

    No ``dynamic_batching`` block when ``max_queue_delay_us`` is None (and no
    ``preferred`` sizes are given). Returns the model directory.
    """
    src = BUNDLED_REPOSITORY / "digits" / "1" / "model.onnx"
    if not src.exists():
        try:  # an installed inferd instead of this checkout
            from inferd.examples import REPOSITORY

            src = Path(REPOSITORY) / "digits" / "1" / "model.onnx"
        except ImportError:
            pass
    if not src.exists():
        raise FileNotFoundError(f"{src} is missing: run python -m inferd.examples.build_models")
    model_dir = Path(repo) / "digits"
    dst = model_dir / "1" / "model.onnx"
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    shutil.copyfile(src, dst)
    (model_dir / "config.pbtxt").write_text(
        _config(
            "digits",
            [("input.1", "TYPE_FP32", [1, 28, 28])],
            [("logits", "TYPE_FP32", [10])],
            instance_count,
            max_batch_size,
            max_queue_delay_us,
            preferred,
        )
    )
    return model_dir


def write_captioning_repository(repo: Path) -> Path:
    """Write ``<repo>/captioning`` (the seed's config.pbtxt verbatim + 1/model.onnx); returns the
    model directory. ``pixel_values`` FP32 [N,3,384,384], ``input_ids`` / ``attention_mask`` INT64
    [N,T] -> ``logits`` FP32 [N,T,30524]; max_batch_size 8, one CPU instance, dynamic batching
    (preferred 1, 2, 4, 8; 1000 us)."""
    try:
        from inferd.examples.build_models import build_captioning
    except ImportError:  # this checkout's inferd, not installed
        sys.path.insert(0, str(HERE.parent / "src"))
        from inferd.examples.build_models import build_captioning

    return build_captioning(Path(repo), verbose=False).parent.parent


if __name__ == "__main__":
    built = build_resnet18(RESNET18_CACHE)
    print(f"{built} {built.stat().st_size} bytes ({built.stat().st_size / 2**20:.1f} MiB)")
    sys.exit(0)
