"""PNG of sources, predicted points and attention (matplotlib is optional for the runtime)."""
from __future__ import annotations

import numpy as np

MAX_ITEMS = 4


def require_matplotlib() -> None:
    """Fail early, naming the extra, when matplotlib is not installed."""
    import click

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("--plot needs matplotlib: pip install 'seq2onnx[plot]'") from None


def plot_predictions(source: np.ndarray, outputs: np.ndarray, alphas: np.ndarray | None, path: str) -> None:
    """Draw up to MAX_ITEMS items: source and predicted points, and attention heatmaps if any."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = min(MAX_ITEMS, len(source))
    rows = 2 if alphas is not None else 1
    fig, axes = plt.subplots(rows, max(items, 1), figsize=(3.2 * max(items, 1), 3.2 * rows), squeeze=False)
    for i in range(items):
        ax = axes[0][i]
        ax.plot(source[i, :, 0], source[i, :, 1], "o-", color="tab:blue", label="source")
        path_pts = np.concatenate([source[i, -1:], outputs[i]], axis=0)  # (1 + Lt, F)
        ax.plot(path_pts[:, 0], path_pts[:, 1], "s--", color="tab:red", label="predicted")
        ax.set_title(f"item {i}")
        ax.set_aspect("equal", adjustable="datalim")
        if i == 0:
            ax.legend(fontsize="small")
        if alphas is not None:
            weights = alphas[i] if alphas.ndim == 3 else alphas[i].mean(axis=0)  # (Lt, Ls)
            im = axes[1][i].imshow(weights, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            axes[1][i].set_xticks(range(weights.shape[1]))
            axes[1][i].set_yticks(range(weights.shape[0]))
            axes[1][i].set_xlabel("source position")
            axes[1][i].set_ylabel("target step")
            axes[1][i].set_title("attention" + (" (mean of heads)" if alphas.ndim == 4 else ""))
            fig.colorbar(im, ax=axes[1][i])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
