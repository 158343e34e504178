"""The federation's model leaving the bundle: a MONAI Bundle with its class names, TorchScript and ONNX."""
