"""`python -m cli ARGS` is `seq2onnx ARGS`."""
from cli.main import entry

entry()
