#!/usr/bin/env bash
# Rebuild the shipped squares model: the book setup (hidden 2, dot attention, 100 epochs, seed 23), then export.
# Needs the train extra: pip install -e ".[cpu,train]"
set -euo pipefail
cd "$(dirname "$0")"
seq2onnx train --out squares-checkpoint --force --quiet
seq2onnx export squares-checkpoint --out squares --force
