"""A declared model's graphs run at other sizes than they were traced at, right after export: a size the tracer
baked into a graph (a Python int, nn.MultiheadAttention's lengths) fails here, or gives other shapes than declared,
and is named with what to do about it. The parity run that follows tries more sizes: a graph that fails or differs
from PyTorch there is said to be what it most often is, a number the tracer baked in."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnxruntime as ort
import torch

from runtime.binding import RUN_FAILED_ADVICE
from runtime.contract import BATCH, DECODER_STEP_FILE, ENCODER_FILE, PRESENT_LEN, SOURCE_LEN, Dims
from runtime.errors import InputError, ResourceError, one_line

from .adapted import Adapted, example_sources
from .adapter import AdapterError, Seq2SeqAdapter

OTHER_BATCH, OTHER_WIDTH = 5, 9  # sizes a graph is run at after export, other than those it was traced at
BAKED = ("a declared model whose graphs fail or differ from PyTorch at some sizes mostly has a Python number baked "
         "into its trace: a size read with int(...) or .item(), a loop over range(x.shape[1]), or a branch on a "
         "tensor's values (if bool(...)); compute with tensor ops instead (x.shape, torch.where, masks). Or its rows "
         "read one another (a mean, sum or norm over the batch axis): the runtime decodes inputs in batches of any "
         "make-up and drops finished ones, so each row may depend on its own input only")


def declared_parity(model: Any, run: Callable[[], list]) -> list:
    """`run()` (a parity run's rows); for a declared model, a graph onnxruntime cannot run at one of its sizes is an
    AdapterError saying why that usually is (BAKED), not the runtime's advice to pass a smaller batch."""
    if not isinstance(model, Adapted):
        return run()
    try:
        return run()
    except (InputError, ResourceError) as exc:
        said = str(exc).removesuffix(RUN_FAILED_ADVICE)  # at export the batch is small: the advice is not it
        raise AdapterError(f"{said}: at export, this is a size the graph was not traced at; {BAKED}") from None


def check_other_sizes(adapted: Adapted, out_dir: Path) -> None:
    """Run the written encoder and step in onnxruntime at another batch size (and source width) than traced:
    a size the tracer baked in fails here, or gives other shapes than declared, and is named."""
    adapter, contract = adapted.adapter, adapted.contract
    width = adapter.fixed_source_len or OTHER_WIDTH
    ids, lengths = example_sources(adapter, OTHER_BATCH, width, seed=2)
    sizes = {BATCH: OTHER_BATCH, SOURCE_LEN: width}
    options = ort.SessionOptions()
    options.log_severity_level = 4  # its own red log line of the failure would come before ours, which says it
    sessions = {name: ort.InferenceSession(str(out_dir / name), options, providers=["CPUExecutionProvider"],
                                           enable_fallback=0)  # no "EP Error" banner among the parity table
                for name in (ENCODER_FILE, DECODER_STEP_FILE)}
    what = f"batch {OTHER_BATCH} and {width}-token sources"
    state = _run(adapter, sessions[ENCODER_FILE], {"source_ids": ids, "source_lengths": lengths}, ENCODER_FILE, what)
    _check_shapes(state, contract.encoder["outputs"], sizes, ENCODER_FILE, what)
    tokens = np.full(OTHER_BATCH, contract.specials.bos, np.int64)
    produced = _run(adapter, sessions[DECODER_STEP_FILE], {"previous_tokens": tokens, **state}, DECODER_STEP_FILE,
                    what)
    grown = {PRESENT_LEN: None}  # a growing axis: one more than its input's, checked by the contract's feedback
    _check_shapes(produced, contract.step["outputs"], {**sizes, **grown}, DECODER_STEP_FILE, what)


MHA_HINT = ("; this model uses nn.MultiheadAttention, which (as nn.Transformer, which uses it) bakes its sequence "
            "lengths into a traced graph: give it fixed lengths (fixed_source_len=..., and a fixed-size output buffer "
            "with output_limit=...; see the README's Bring your own model)")


def _run(adapter: Seq2SeqAdapter, session: Any, feed: dict[str, np.ndarray], name: str,
         what: str) -> dict[str, np.ndarray]:
    try:
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    except Exception as exc:  # onnxruntime's own errors
        text = one_line(exc)
        node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
        shapes = re.search(r"Input shape:\{[^}]*\}, requested shape:\{[^}]*\}", text)
        part = re.match(r"/parts\.(\d+)/", node.group(2)) if node else None
        where = f" in modules[{part.group(1)}]" if part else ""
        said = (f"its {node.group(1)} node {node.group(2)!r}{where} fails{': ' + shapes.group(0) if shapes else ''}"
                if node else text[:300])
        mha = any(isinstance(m, torch.nn.MultiheadAttention) for root in adapter.modules for m in root.modules())
        raise AdapterError(f"{name} fails at {what}, other sizes than it was traced at ({said}): a size was baked "
                           "into the graph; compute shapes from tensors (x.shape[0]), not Python ints"
                           f"{MHA_HINT if mha else ''}") from None


def _check_shapes(values: dict[str, np.ndarray], declared: dict[str, Dims], sizes: dict[str, int | None],
                  name: str, what: str) -> None:
    for out, dims in declared.items():
        want = [sizes.get(d, d) if isinstance(d, str) else d for d in dims]
        got = list(values[out].shape)
        if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got)):
            raise AdapterError(f"{name} output {out!r} is {tuple(got)} at {what}, declared {dims}: a size was "
                               "baked into the graph; compute shapes from tensors (x.shape[0]), not Python ints")
