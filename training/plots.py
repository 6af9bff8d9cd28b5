"""loss.png of a checkpoint: MSE curves for point models, loss and accuracy curves for token models."""
from __future__ import annotations

from pathlib import Path

from runtime.plot import import_matplotlib

History = dict[str, list[float]]
PLOT_SIZE = (6, 4)  # inches
PLOT_DPI = 100


def plot_history(history: History, path: Path) -> None:
    """Draw a trainer's history into a PNG (Agg canvas, no pyplot state); token histories hold 'train_loss'."""
    import_matplotlib()  # quietly, before either imports from it
    (plot_token_history if "train_loss" in history else plot_point_history)(history, path)


def plot_point_history(history: History, path: Path) -> None:
    """Training and validation MSE per epoch, log scale."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=PLOT_SIZE)
    ax = fig.add_subplot()
    epochs = range(1, len(history["train"]) + 1)
    ax.plot(epochs, history["train"], label="training")
    ax.plot(epochs, history["val"], label="validation")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("MSE")
    ax.legend()
    fig.savefig(path, dpi=PLOT_DPI)


def plot_token_history(history: History, path: Path) -> None:
    """Training loss per token (left, log scale) and validation exact / token accuracy (right, 0..1) per epoch."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=PLOT_SIZE)
    loss_ax = fig.add_subplot()
    epochs = range(1, len(history["train_loss"]) + 1)
    lines = loss_ax.plot(epochs, history["train_loss"], color="tab:blue", label="training loss")
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("cross-entropy per token")
    acc_ax = loss_ax.twinx()  # accuracies share the epochs but not the loss's scale
    lines += acc_ax.plot(epochs, history["val_exact"], color="tab:orange", label="validation exact")
    lines += acc_ax.plot(epochs, history["val_token"], color="tab:green", linestyle="--", label="validation token")
    acc_ax.set_ylim(0.0, 1.02)
    acc_ax.set_ylabel("accuracy")
    loss_ax.legend(lines, [line.get_label() for line in lines], loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI)
