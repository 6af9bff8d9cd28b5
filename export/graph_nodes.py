"""Walking an ONNX graph's nodes into the subgraphs they hold (a Loop's or Scan's body, an If's branches)."""
from __future__ import annotations

import onnx


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held by a node's attributes."""
    return [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]


def all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """graph's nodes and its subgraphs' (which may read graph's values from the outer scope)."""
    return [n for node in graph.node for n in [node, *(m for sub in subgraphs(node) for m in all_nodes(sub))]]
