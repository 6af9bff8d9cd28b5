"""The `seq2onnx` command line: the group (`main`), one module per command, and what they share (`common`).

Each command parses and checks its options, then calls a typed function of the package that does the work.
Nothing outside this package imports it, and no module outside it imports click.
"""
