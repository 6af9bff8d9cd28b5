"""The one table where a model's kind picks how it is exported: `KINDS[spec.kind]`. Everything else on the export
side (graphs, the greedy loop's machinery, the manifest, reduced precision, `verify`) is shared."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.model import Seq2Seq
from runtime.spec import ModelSpec

from .examples import Traced
from .fused import LoopKind
from .parity import Row, Say, Tolerance
from .points import graphs as point_graphs
from .points import loop as point_loop
from .points import parity as point_parity
from .tokens import graphs as token_graphs
from .tokens import loop as token_loop
from .tokens import parity as token_parity


@dataclass(frozen=True)
class ExportKind:
    """What exporting one kind of model takes."""

    traced: Callable[[Any, ModelSpec], Traced]  # export modules and example inputs
    graph_docs: Callable[[ModelSpec], dict[str, str]]  # each graph's doc string
    loop: LoopKind  # what the greedy loop graph carries, computes and scans
    parity: Callable[[Any, Seq2Seq, Tolerance, bool], list[Row]]  # what every export checks before it is written
    verify_rows: Callable[[Path, str | None, Any, Seq2Seq, Tolerance, Say], list[Row]]  # what `verify` checks
    test_inputs: Callable[[Any, ModelSpec, str | None], Any]  # a data set's test inputs (reduced precision)


KINDS: dict[str, ExportKind] = {
    "points": ExportKind(traced=point_graphs.traced, graph_docs=point_graphs.graph_docs, loop=point_loop.LOOP_KIND,
                         parity=point_parity.parity, verify_rows=point_parity.verify_rows,
                         test_inputs=point_parity.test_inputs),
    "tokens": ExportKind(traced=token_graphs.traced, graph_docs=token_graphs.graph_docs, loop=token_loop.LOOP_KIND,
                         parity=token_parity.parity, verify_rows=token_parity.verify_rows,
                         test_inputs=token_parity.test_inputs),
}
