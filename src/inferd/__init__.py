"""inferd: a model inference server for ONNX and PyTorch models, speaking KServe V2 and TorchServe."""

__version__ = "0.1.0"

__all__ = ["__version__"]
