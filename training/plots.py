"""loss.png of a checkpoint: MSE curves for point models, loss and accuracy curves for token models."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from runtime.plot import import_matplotlib

History = dict[str, list[float]]
PLOT_SIZE = (6, 4)  # inches
PLOT_DPI = 100
MARKED_EPOCHS = 40  # up to this many epochs each one is a dot on its curve: one epoch is a dot, not nothing


def plot_history(history: History, path: Path) -> None:
    """Draw a trainer's history into a PNG (Agg canvas, no pyplot state); token histories hold 'train_loss'."""
    import_matplotlib()  # quietly, before either imports from it
    figure = token_history_figure(history) if "train_loss" in history else point_history_figure(history)
    figure.savefig(path, dpi=PLOT_DPI)


def point_history_figure(history: History) -> Any:
    """Training and validation MSE per epoch, log scale."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=PLOT_SIZE)
    ax = fig.add_subplot()
    epochs = range(1, len(history["train"]) + 1)
    ax.plot(epochs, history["train"], label="training", **_marks(epochs))
    ax.plot(epochs, history["val"], label="validation", **_marks(epochs))
    ax.set_yscale("log")
    _plain_axes(ax, epochs)
    ax.set_xlabel("epoch")
    ax.set_ylabel("MSE")
    ax.legend()
    fig.tight_layout()  # the y label and ticks inside the picture
    return fig


def token_history_figure(history: History) -> Any:
    """Training loss per token (left, log scale) and validation exact / token accuracy (right, 0..1) per epoch."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=PLOT_SIZE)
    loss_ax = fig.add_subplot()
    epochs = range(1, len(history["train_loss"]) + 1)
    lines = loss_ax.plot(epochs, history["train_loss"], color="tab:blue", label="training loss", **_marks(epochs))
    loss_ax.set_yscale("log")
    _plain_axes(loss_ax, epochs)
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("cross-entropy per token")
    acc_ax = loss_ax.twinx()  # accuracies share the epochs but not the loss's scale
    lines += acc_ax.plot(epochs, history["val_exact"], color="tab:orange", label="validation exact",
                         **_marks(epochs))
    lines += acc_ax.plot(epochs, history["val_token"], color="tab:green", linestyle="--", label="validation token",
                         **_marks(epochs))
    acc_ax.set_ylim(-0.02, 1.02)  # a dot at 0 or 1 whole
    acc_ax.set_ylabel("accuracy")
    loss_ax.legend(lines, [line.get_label() for line in lines], loc="center right")
    fig.tight_layout()
    return fig


def _marks(epochs: range) -> dict[str, Any]:
    return {"marker": "o", "markersize": 3} if len(epochs) <= MARKED_EPOCHS else {}


def _plain_axes(ax: Any, epochs: range) -> None:
    """Whole epochs on x (a short run had 1.25, 2.5, ...); plain numbers on the log y axis (a narrow range printed
    its minor ticks as 2.07x10^0): every tick labelled within a decade, the decades alone past one."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

    ticks = [tick for tick in MaxNLocator(integer=True).tick_values(1, len(epochs)) if 1 <= tick <= len(epochs)]
    ax.xaxis.set_major_locator(FixedLocator(ticks or [1]))  # epochs that were run: no 0, no 51 of 50
    plain = FuncFormatter(lambda value, _: f"{value:.4g}")
    low, high = ax.get_ylim()
    ax.yaxis.set_major_formatter(plain)
    if high < 10 * low:
        ax.yaxis.set_minor_formatter(plain)
    elif high < 100 * low:  # 2 and 5 of each decade
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:.4g}" if _mantissa(value) in (2, 5)
                                                   else ""))
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())


def _mantissa(value: float) -> int:
    return round(value / 10 ** math.floor(math.log10(value) + 1e-9)) if value > 0 else 0
