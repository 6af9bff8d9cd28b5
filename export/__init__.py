"""torch -> ONNX: export wrappers, graph I/O checks, parity validation and the manifest writer.

Import `export.api` for `export_model`; this package's import pulls in nothing heavy, so the
CLI can list commands on an install without torch."""
