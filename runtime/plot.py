"""PNG of sources, predicted points and attention (matplotlib is optional for the runtime)."""
from __future__ import annotations

from typing import IO

import numpy as np

MAX_ITEMS = 4
MARGIN = 0.15  # fraction of the span added around the points


def require_matplotlib() -> None:
    """Fail early, naming the extra, when matplotlib is not installed."""
    import click

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("--plot needs matplotlib: install the 'plot' extra, pip install -e '.[plot]' "
                                   "in a seq2onnx checkout") from None


def shown_items(n: int) -> str:
    """Which items a plot of `n` shows, in words: '0-3' or '0'."""
    last = min(MAX_ITEMS, n) - 1
    return "none" if last < 0 else (f"0-{last}" if last else "0")


def _square_limits(ax: object, points: np.ndarray) -> None:
    """The same span on both axes, so a square looks square."""
    low, high = points[:, :2].min(axis=0), points[:, :2].max(axis=0)  # (2,)
    centre, half = (low + high) / 2, max(float((high - low).max()) / 2, 1e-6) * (1 + MARGIN)
    ax.set_xlim(centre[0] - half, centre[0] + half)
    ax.set_ylim(centre[1] - half, centre[1] + half)
    ax.set_aspect("equal", adjustable="box")


def _draw_item(ax: object, source: np.ndarray, outputs: np.ndarray, index: int) -> None:
    """Source then predicted points, joined in order and labelled s0.. and t0.. like the heatmap's axes."""
    path = np.concatenate([source, outputs], axis=0)  # (Ls + Lt, F)
    ax.plot(source[:, 0], source[:, 1], "o-", color="tab:blue", label="source")
    ax.plot(path[len(source) - 1:, 0], path[len(source) - 1:, 1], "s--", color="tab:red", label="predicted")
    labels = [f"s{i}" for i in range(len(source))] + [f"t{j}" for j in range(len(outputs))]
    for label, (x, y) in zip(labels, path[:, :2]):
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize="small")
    _square_limits(ax, path)
    ax.set_title(f"item {index}")


def _draw_attention(fig: object, ax: object, weights: np.ndarray, heads: bool) -> None:
    im = ax.imshow(weights, vmin=0, vmax=1, cmap="viridis", aspect="auto")  # (Lt, Ls)
    ax.set_xticks(range(weights.shape[1]))
    ax.set_yticks(range(weights.shape[0]))
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
    axes[0][0].legend(fontsize="small")
    fig.suptitle(f"items {shown_items(len(source))} of {len(source)}; s = source position, t = target step, "
                 "in order along the lines")
    fig.tight_layout()
    fig.savefig(f, format="png", dpi=100)
