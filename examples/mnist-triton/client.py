"""The user's client: send a handwritten 0 and an 8 to ``onnx-mnist-cpu`` and check the answers."""

import sys

import numpy as np
import tritonclient.http as httpclient

from inferd.examples.build_models import digits_test_set

url = sys.argv[1] if len(sys.argv) > 1 else "localhost:8000"
client = httpclient.InferenceServerClient(url)
images, labels = digits_test_set()
for wanted in (0, 8):
    image = images[labels == wanted][:1]  # shape [1, 1, 28, 28]: the model's fixed batch of 1
    tensor = httpclient.InferInput("input.1", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image, binary_data=True)
    logits = client.infer("onnx-mnist-cpu", [tensor]).as_numpy("logits")
    got = int(np.argmax(logits))
    assert got == wanted, f"expected {wanted}, the model said {got}"
    print(f"Test for image of {wanted} class is done.")
