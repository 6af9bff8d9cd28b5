#!/usr/bin/env bash
# Rebuild the shipped models; needs the train extra: pip install -e ".[cpu,train]"
#   squares: the book setup (hidden 2, dot attention, 100 epochs, seed 23), then export.
#   dates:   the token defaults on the built-in `dates` set (bidirectional GRU 128, dot attention, 12 epochs,
#            seed 23), then export with its vocabularies.
set -euo pipefail
cd "$(dirname "$0")"
seq2onnx train --out squares-checkpoint --force --quiet
seq2onnx export squares-checkpoint --out squares --force
seq2onnx train --data dates --out dates-checkpoint --force --quiet
seq2onnx export dates-checkpoint --out dates --force
