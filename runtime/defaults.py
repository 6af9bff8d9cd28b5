"""Defaults and tolerances in one place, torch-free: what `--help` shows is what the library uses.

Training (`seq2onnx train`, the trainers), export parity and reduced-precision quality, precision names, and the
runtime's limits that commands check their options against (here rather than beside the code that uses them, so that
checking options imports neither numpy nor onnxruntime: `serve` may start itself again before it loads them).
Everything here is plain data (and `max_threads`, which reads the CPUs this process may use); the packages that
use these values import them from here.
"""
from __future__ import annotations

import os
from typing import Any

# -- runtime: limits and choices that options are checked against --
MAX_TARGET_LEN = 10_000  # the longest decode a call may ask for (runtime.point_inputs, runtime.tokens)
PROVIDERS = ("auto", "cpu", "cuda")  # runtime.sessions
JSONL_SUFFIX = ".jsonl"  # what infer --output writes for a token model; fed back as --input, each line is one text
TSV_SUFFIX = ".tsv"  # pairs (source, tab, target) for train and eval, in any case; infer reads each whole line
UTF8_BOM = b"\xef\xbb\xbf"  # accepted at the start of a text file, and dropped
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # a text file starting so is UTF-16: named as such, not read
LONE_CR = ("a carriage return (\\r) that ends no line: each line ends with \\n or \\r\\n; a file of \\r-only line "
           "ends (classic Mac OS) needs converting (tr '\\r' '\\n')")
NUL = "a NUL byte: UTF-16 text without its byte-order mark? save the file as UTF-8"


def max_threads() -> int:
    """CPUs this process may run on: the most intra-op threads that do not oversubscribe the machine."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1

# -- export: parity of onnxruntime against PyTorch (export.parity.Tolerance) --
DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-4
DEFAULT_DRIFT_ATOL = 1e-3

# -- export: a reduced-precision export against its float32 graphs (export.quality_rows.QualityTolerance) --
# Point models: the decoded outputs may differ from float32 by this fraction of the outputs' largest magnitude, and
# the attention weights (in [0, 1]) by this much. Measured on the trained squares model's test data: int8 2.6% and
# 2.5%, fp16 0.17% and 0.22%; on a seeded hidden-256 model's in-range random inputs both pass.
MAX_OUTPUT_DIFF = 0.05
MAX_ATTENTION_DIFF = 0.05
# Token models: at least this fraction of whole sequences identical to the float32 decode, and of tokens equal
# position by position. Measured on the trained dates model's test texts: int8 and fp16 both 1.0 (greedy, beam 5).
MIN_EXACT_MATCH = 0.99
MIN_TOKEN_AGREEMENT = 0.99

# -- export: precisions --
FP32, FP16, INT8 = "fp32", "fp16", "int8"
DTYPES = (FP32, FP16)  # --dtype
QUANTIZATIONS = (INT8,)  # --quantize
DEFAULT_OPSET = 17

# -- training --
MAX_LR = 1.0  # Adam steps are about lr in size; beyond 1 every weight is thrown around and the run diverges
SEED = 23
# The book's defaults for point models (unchanged), and token models' (TokenTrainConfig's fields and spec_for_text's
# sizes are these). A value None is resolved later (the tokenizer: by the data).
POINT_DEFAULTS: dict[str, Any] = {"hidden_dim": 2, "epochs": 100, "batch_size": 16, "lr": 0.01,
                                  "teacher_forcing": 0.5}
# A recurrent token model's sizes when none are given (the transformer takes its widths from d_model).
# `seq2onnx train`'s token-model options that are spec fields of the same name (--heads is n_heads).
SPEC_OPTIONS = ("arch", "attention", "hidden_dim", "embedding_dim", "cell", "layers", "bidirectional",
                "tie_embeddings", "reverse_source", "d_model", "d_ff", "norm", "positional", "dropout")
RECURRENT_SIZES: dict[str, Any] = {"hidden_dim": 128, "embedding_dim": 32, "bidirectional": True}
TOKEN_DEFAULTS: dict[str, Any] = {
    **RECURRENT_SIZES, "cell": "gru", "layers": 1, "bidirectional": True,
    "tie_embeddings": False, "reverse_source": False, "epochs": 12, "batch_size": 64, "lr": 3e-3, "lr_decay": 0.8,
    "clip": 1.0, "label_smoothing": 0.0, "teacher_forcing": 1.0, "bucket": True, "tokenizer": None, "min_freq": 1,
    "max_vocab": None, "eval_beam": 5, "warmup": 0,
    "d_model": 0, "d_ff": 0, "norm": "pre", "positional": "sinusoidal", "dropout": 0.0,  # (not a transformer)
}
# --arch transformer replaces these (None: a recurrent size the transformer takes from d_model). Measured with
# `seq2onnx train --arch transformer` on 2 threads of a nearly idle 2-core machine: reverse 0.997 held-out exact
# after epoch 6 and 1.0 from epoch 7, 79 s for the whole run (12 epochs and the beam check; seeds 0 and 1 on one
# thread: >= 0.99 after epoch 6 too); dates 0.993 after epoch 8, 0.999 after 12 (its sources are ~3x longer).
TRANSFORMER_DEFAULTS: dict[str, Any] = {
    "hidden_dim": None, "embedding_dim": None, "bidirectional": None, "d_model": 64, "d_ff": 256, "layers": 2,
    "heads": 4, "dropout": 0.0, "epochs": 12, "lr": 2e-3, "lr_decay": 0.8, "warmup": 200,
}
# Built-in text sets whose size calls for other settings than the arch's defaults (measured on 2 CPU threads).
# Recurrent: toy-translation is 9 pairs, one batch per epoch at the defaults, so it needs small models and many
# steps; lookup learns position from attention and needs more, smaller steps (0.995 held-out exact after 4 epochs).
# Transformer: toy-translation with one small layer reaches 9/9 after epoch 9..26 over five seeds (1 thread, 8 s).
DATASET_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "recurrent": {
        "toy-translation": {"hidden_dim": 32, "embedding_dim": 16, "epochs": 30, "batch_size": 9, "lr": 0.01,
                            "lr_decay": 1.0},
        "lookup": {"epochs": 8, "batch_size": 32, "lr_decay": 0.93},
    },
    "transformer": {
        "toy-translation": {"d_model": 32, "d_ff": 64, "layers": 1, "heads": 2, "epochs": 60, "batch_size": 9,
                            "lr": 3e-3, "lr_decay": 1.0, "warmup": 10},
    },
}

def arch_defaults(arch: str, data: str) -> dict[str, Any]:
    """A token model's defaults: TOKEN_DEFAULTS, the transformer's over them, then the built-in set's own."""
    over = TRANSFORMER_DEFAULTS if arch == "transformer" else {}
    return {**TOKEN_DEFAULTS, **over, **DATASET_DEFAULTS.get(arch, {}).get(data, {})}
