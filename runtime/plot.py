"""PNG of sources, predicted points and attention, or of token attention maps (matplotlib is optional)."""
from __future__ import annotations

import logging
import math
import textwrap
from dataclasses import dataclass
from typing import IO

import numpy as np

from .errors import MissingExtraError

MAX_ITEMS = 4
MARGIN = 0.15  # fraction of the span added around the points
CELL_INCHES = 0.28  # one token's width or height on a heatmap
MAX_WIDTH_INCHES, MAX_MAP_HEIGHT_INCHES = 26.0, 12.0
TICK_FONT, MIN_TICK_FONT, FULL_SIZE_TICKS = 9.0, 5.0, 40  # past 40 labels on an axis the font shrinks
MAX_TICKS = 80  # past this many labels on an axis only every k-th is written
TITLE_CHARS_PER_INCH = 12  # a figure's title wraps to its width (one item's figure is 3.4 inches wide)


def import_matplotlib() -> None:
    """Import matplotlib without its two lines of advice where HOME cannot hold its config and cache (`mkdir -p
    failed ...`, `... set the MPLCONFIGDIR environment variable ...`): it then works from a temporary directory,
    and the advice is not this command's output. Its logger's level is restored afterwards."""
    logger = logging.getLogger("matplotlib")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import matplotlib  # noqa: F401
    finally:
        logger.setLevel(level)


def require_matplotlib() -> None:
    """Fail early, naming the extra, when matplotlib is not installed."""
    try:
        import_matplotlib()
    except ImportError:
        raise MissingExtraError("--plot needs matplotlib: install the 'plot' extra, pip install -e '.[plot]' "
                                "in a seq2onnx checkout") from None


def shown_items(n: int) -> str:
    """Which items a plot of `n` shows, in words: 'items 0-3', 'item 0' or 'no items'."""
    last = min(MAX_ITEMS, n) - 1
    return "no items" if last < 0 else (f"items 0-{last}" if last else "item 0")


def shown_inputs(shown: int, decoded: int) -> str:
    """The inputs a plot of the first `shown` of `decoded` shows, in words: 'the first 4 of 10 inputs', 'all 3
    inputs' or 'the input'."""
    if shown < decoded:
        return f"the first {shown} of {decoded} inputs"
    return "the input" if decoded == 1 else f"all {decoded} inputs"


def _square_limits(ax: object, points: np.ndarray) -> None:
    """The same span on both axes, so a square looks square."""
    low, high = points[:, :2].min(axis=0), points[:, :2].max(axis=0)  # (2,)
    centre, half = (low + high) / 2, max(float((high - low).max()) / 2, 1e-6) * (1 + MARGIN)
    ax.set_xlim(centre[0] - half, centre[0] + half)
    ax.set_ylim(centre[1] - half, centre[1] + half)
    ax.set_aspect("equal", adjustable="box")


MAX_POINT_LABELS = 24  # past this many points on a path only every k-th is labelled (each label costs ~1 ms)
MAX_POINT_TICKS = 12  # and past this many positions only every k-th is a tick of its 3.4-inch heatmap


def _planar(path: np.ndarray) -> tuple[np.ndarray, str]:
    """(Ls + Lt, 2) coordinates to draw a path of (Ls + Lt, F) points with, and what they are, if not the points."""
    if path.shape[1] == 1:  # one feature: its value along the path
        return np.stack([np.arange(len(path), dtype=np.float64), path[:, 0]], axis=1), "value by position"
    if path.shape[1] > 2:
        return path[:, :2], f"features 0-1 of {path.shape[1]}"
    return path, ""


def _draw_item(ax: object, source: np.ndarray, outputs: np.ndarray, index: int) -> None:
    """Source then predicted points, joined in order and labelled s0.. and t0.. like the heatmap's axes."""
    path, what = _planar(np.concatenate([source, outputs], axis=0))  # (Ls + Lt, 2)
    ax.plot(path[:len(source), 0], path[:len(source), 1], "o-", color="tab:blue", label="source")
    ax.plot(path[len(source) - 1:, 0], path[len(source) - 1:, 1], "s--", color="tab:red", label="predicted")
    labels = [f"s{i}" for i in range(len(source))] + [f"t{j}" for j in range(len(outputs))]
    step = math.ceil(len(labels) / MAX_POINT_LABELS)
    for k in range(0, len(labels), step):
        ax.annotate(labels[k], tuple(path[k]), textcoords="offset points", xytext=(5, 5), fontsize="small")
    if what == "value by position":
        ax.margins(MARGIN)
    else:
        _square_limits(ax, path)
    ax.set_title(f"item {index}" + (f" ({what})" if what else ""), fontsize="medium")


def _draw_attention(fig: object, ax: object, weights: np.ndarray, heads: bool) -> None:
    im = ax.imshow(weights, vmin=0, vmax=1, cmap="viridis", aspect="auto")  # (Lt, Ls)
    ax.set_xticks(range(0, weights.shape[1], math.ceil(weights.shape[1] / MAX_POINT_TICKS)))
    ax.set_yticks(range(0, weights.shape[0], math.ceil(weights.shape[0] / MAX_POINT_TICKS)))
    ax.set_xlabel("source position")
    ax.set_ylabel("target step")
    ax.set_title("attention" + (" (mean of heads)" if heads else ""))
    fig.colorbar(im, ax=ax)


def plot_predictions(source: np.ndarray, outputs: np.ndarray, alphas: np.ndarray | None, f: IO[bytes]) -> None:
    """Draw the first MAX_ITEMS items (points in order, and attention heatmaps if any) as PNG into `f`."""
    require_matplotlib()
    from matplotlib.figure import Figure

    items = min(MAX_ITEMS, len(source))
    rows = 2 if alphas is not None else 1
    fig = Figure(figsize=(3.4 * max(items, 1), 3.4 * rows + 0.4))
    axes = fig.subplots(rows, max(items, 1), squeeze=False)
    for i in range(items):
        _draw_item(axes[0][i], source[i], outputs[i], i)
        if alphas is not None:
            weights = alphas[i] if alphas.ndim == 3 else alphas[i].mean(axis=0)  # (Lt, Ls)
            _draw_attention(fig, axes[1][i], weights, heads=alphas.ndim == 4)
    axes[0][0].legend(fontsize="small", loc="upper left")  # "best" searches every point: slow on long paths
    title = f"{shown_items(len(source))} of {len(source)}; s = source position, t = target step, in order along the lines"
    fig.suptitle(textwrap.fill(title, width=int(TITLE_CHARS_PER_INCH * 3.4 * max(items, 1))), fontsize="small")
    fig.tight_layout()
    fig.savefig(f, format="png", dpi=100)


@dataclass(frozen=True)
class Heatmap:
    """One attention map: weights (rows, columns), a label per row and per column, axis names and a title."""

    weights: np.ndarray
    row_labels: list[str]
    column_labels: list[str]
    row_name: str
    column_name: str
    title: str


def _label_axis(ax: object, axis: str, labels: list[str]) -> None:
    """Token labels that stay legible: the font shrinks past FULL_SIZE_TICKS, every k-th past MAX_TICKS."""
    step = math.ceil(len(labels) / MAX_TICKS)
    size = max(MIN_TICK_FONT, TICK_FONT * min(1.0, FULL_SIZE_TICKS / max(len(labels), 1)))
    ticks = list(range(0, len(labels), step))
    words = axis == "x" and max((len(label) for label in labels), default=0) > 2  # upright words would overlap
    getattr(ax, f"set_{axis}ticks")(ticks)
    getattr(ax, f"set_{axis}ticklabels")([labels[i] for i in ticks], fontsize=size, rotation=90 if words else 0)


def _draw_map(fig: object, ax: object, item: Heatmap) -> None:
    if item.weights.shape[0] == 0:  # an output that is empty has no rows to draw
        ax.text(0.5, 0.5, "no output tokens: the model emitted </s> first", ha="center", va="center")
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        top = max(float(item.weights.max()), 1e-6)  # long sources spread attention thin: scale to what is there
        im = ax.imshow(item.weights, vmin=0, vmax=top, cmap="viridis", aspect="auto", interpolation="nearest")
        _label_axis(ax, "x", item.column_labels)
        _label_axis(ax, "y", item.row_labels)
        fig.colorbar(im, ax=ax, label="attention weight", fraction=0.04, pad=0.02)
    ax.set_xlabel(item.column_name, fontsize="small")
    ax.set_ylabel(item.row_name, fontsize="small")
    ax.set_title(item.title, fontsize="medium", loc="left")


def plot_heatmaps(maps: list[Heatmap], title: str, f: IO[bytes]) -> None:
    """Draw attention maps one above the other, each sized to its token counts, as PNG into `f`."""
    require_matplotlib()
    from matplotlib.figure import Figure

    widest = max(len(m.column_labels) for m in maps)
    width = min(MAX_WIDTH_INCHES, max(6.0, CELL_INCHES * widest + 3.0))
    heights = [min(MAX_MAP_HEIGHT_INCHES, max(2.6, CELL_INCHES * len(m.row_labels) + 2.4)) for m in maps]
    fig = Figure(figsize=(width, sum(heights) + 0.4), layout="constrained")
    axes = fig.subplots(len(maps), 1, squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, item in zip(axes[:, 0], maps):
        _draw_map(fig, ax, item)
    fig.suptitle(title)
    fig.savefig(f, format="png", dpi=100, bbox_inches="tight")  # a narrow map's axis label is wider than the figure
