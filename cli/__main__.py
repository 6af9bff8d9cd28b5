"""`python -m cli ARGS` is `seq2onnx ARGS`."""
from .main import entry

entry()
