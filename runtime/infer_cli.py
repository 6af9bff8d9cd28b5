"""`seq2onnx infer`: decode sources from a file or stdin with an exported model (no torch needed)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np

from .errors import Seq2OnnxError
from .sessions import PROVIDERS


class InputFileError(click.ClickException):
    """The --input file cannot be read as sources (one line, no usage text)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"--input: {message}")


class OutputFileError(click.ClickException):
    """The --output file name or content is not usable."""

    def __init__(self, message: str) -> None:
        super().__init__(f"--output: {message}")


def read_input(path: str) -> tuple[Any, Any]:
    """(source, source_mask or None) from .npy, .npz (key 'source'), JSON, or '-' (JSON on stdin)."""
    if path == "-":
        return parse_json(sys.stdin.read(), "stdin")
    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".npy":
            return np.load(path, allow_pickle=False), None
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                if "source" not in data:
                    raise InputFileError(f"{path} has keys {sorted(data)}; expected 'source'")
                return data["source"], data["source_mask"] if "source_mask" in data else None
        if suffix == ".json":
            return parse_json(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, ValueError) as exc:
        raise InputFileError(f"{path} could not be read ({exc})") from None
    raise InputFileError(f"{path}: expected a .npy, .npz or .json file, or '-' for JSON on stdin")


def parse_json(text: str, where: str) -> tuple[Any, Any]:
    """JSON: nested lists (N, L, F), or {"source": ..., "source_mask": ...}."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{where}: not valid JSON ({exc})") from None
    if isinstance(data, dict):
        if "source" not in data:
            raise InputFileError(f"{where}: JSON object needs a 'source' key, got {sorted(data)}")
        return data["source"], data.get("source_mask")
    return data, None


OUTPUT_SUFFIXES = (".json", ".npy", ".npz")


def check_output_name(path: str, attention: bool) -> None:
    """Refuse an unusable --output before any work is done."""
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise OutputFileError(f"{path}: expected a file name ending in {', '.join(OUTPUT_SUFFIXES)}")
    if suffix == ".npy" and attention:
        raise OutputFileError("a .npy file holds one array; use .json or .npz with --attention")


def write_output(path: str, outputs: np.ndarray, attention: np.ndarray | None, providers: list[str]) -> None:
    """Write results as .json, .npy (outputs only) or .npz."""
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        Path(path).write_text(json.dumps(as_json(outputs, attention, providers)) + "\n", encoding="utf-8")
    elif suffix == ".npy":
        np.save(path, outputs)
    else:
        np.savez(path, outputs=outputs, **({} if attention is None else {"attention": attention}))


def as_json(outputs: np.ndarray, attention: np.ndarray | None, providers: list[str]) -> dict[str, Any]:
    """The JSON document infer prints."""
    doc: dict[str, Any] = {"outputs": outputs.tolist(), "providers": providers}
    if attention is not None:
        doc["attention"] = attention.tolist()
    return doc


@click.command()
@click.argument("model_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--input", "input_path", required=True, type=click.Path(allow_dash=True, dir_okay=False),
              help="Sources: .npy (N, L, F), .npz with 'source' [and 'source_mask'], .json nested lists or "
                   "{'source': ..., 'source_mask': ...}; '-' reads JSON from stdin.")
@click.option("--target-len", type=int, default=None, help="Points to decode (default: the model's target_len).")
@click.option("--provider", type=click.Choice(PROVIDERS), default="auto", show_default=True,
              help="Execution provider; 'cuda' fails clearly where CUDA cannot run.")
@click.option("--attention", is_flag=True, help="Also return the attention weights.")
@click.option("--output", "output_path", type=click.Path(dir_okay=False), default=None,
              help="Write results to FILE.json, FILE.npy or FILE.npz instead of stdout.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Draw sources, predictions and attention to FILE.png (needs matplotlib).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="onnxruntime intra-op threads.")
def infer(model_dir: Path, input_path: str, target_len: int | None, provider: str, attention: bool,
          output_path: str | None, plot_path: str | None, threads: int | None) -> None:
    """Decode the sources in --input with the exported model in MODEL_DIR."""
    from .model import Seq2Seq

    if output_path:
        check_output_name(output_path, attention)
    if plot_path:
        from .plot import require_matplotlib

        require_matplotlib()
    source, mask = read_input(input_path)
    try:
        model = Seq2Seq.load(model_dir, provider=provider, threads=threads)
        outputs, alphas = model.predict(source, target_len=target_len, source_mask=mask, return_attention=True)
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    if plot_path:
        from .plot import plot_predictions

        plot_predictions(np.asarray(source, dtype=np.float32), outputs, alphas, plot_path)
    kept = alphas if attention else None
    if output_path:
        write_output(output_path, outputs, kept, model.providers)
        click.echo(f"wrote {output_path}", err=True)
    else:
        click.echo(json.dumps(as_json(outputs, kept, model.providers)))
