"""`infer --ray`'s command line as typed values (`RayJob`), and the checks made before Ray is imported: options that
mean nothing on Ray are refused, and a missing Ray names the extra that installs it (cli.infer_ray does the work)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

RAY_MODULES = ("ray", "pyarrow", "pandas")  # what `ray[data]` brings; missing, --ray names the extra to install


@dataclass(frozen=True)
class RayJob:
    """`infer --ray`'s command line, as typed values (what cli.infer_ray decodes)."""

    model_dir: Path
    input_path: str | None
    texts: tuple[str, ...]
    target_len: int | None
    provider: str
    attention: bool
    output_path: str | None
    plot_path: str | None
    threads: int | None
    fused: bool
    force: bool
    on_ray: bool
    address: str | None
    concurrency: int | None
    decoding: dict[str, Any]  # the token options, by parameter name (cli.infer_tokens.token_options)


def infer_on_ray_checked(ctx: click.Context, job: RayJob) -> None:
    """--ray: refuse options that mean nothing there, then hand the command to cli.infer_ray (the 'serve'
    extra); only this path imports Ray."""
    if not job.on_ray:
        given = [flag for flag, value in (("--address", job.address), ("--concurrency", job.concurrency))
                 if value is not None]
        raise click.UsageError(f"{' and '.join(given)} only appl{'y' if len(given) > 1 else 'ies'} to decoding on "
                               f"Ray; add --ray, or drop {'it' if len(given) == 1 else 'them'}")
    if job.plot_path:
        raise click.UsageError("--plot draws the first inputs of an in-process run; drop --plot with --ray, or run "
                               "without --ray to draw them")
    if not job.output_path:
        raise click.UsageError("--ray writes its results to --output FILE.jsonl (in input order, published whole); "
                               "add --output")
    if ctx.get_parameter_source("device_id") is not ParameterSource.DEFAULT:
        raise click.UsageError("--device-id: with --ray, Ray gives each actor its GPU (--provider cuda reserves one "
                               "per actor); drop --device-id")
    try:
        from .infer_ray import infer_on_ray
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in RAY_MODULES:
            raise
        raise click.ClickException("--ray needs Ray Data, which is not installed; install the 'serve' extra: "
                                   "pip install -e '.[cpu,serve]' in a seq2onnx checkout") from None
    infer_on_ray(ctx, job)
