"""Serving past one process on Ray: `seq2onnx serve` (Ray Serve + FastAPI) and `infer --ray` (Ray Data).

Needs the `serve` extra. Imports the runtime; the runtime never imports this package (nor Ray)."""
