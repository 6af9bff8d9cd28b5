"""`python -m training ARGS` is `seq2onnx train ARGS`: the entry point torchrun starts on every rank, e.g.
`torchrun --standalone --nproc-per-node 2 -m training --data reverse --out ckpt`."""
import sys

from runtime.cli import entry

if __name__ == "__main__":
    entry(["train", *sys.argv[1:]])
