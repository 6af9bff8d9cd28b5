"""`seq2onnx infer --ray`: the command around `serving.offline`. Everything that can be checked is checked before Ray
starts (options, output path, model, every input line); --output is then streamed through a temporary sibling and
renamed, so a failure or Ctrl-C leaves the old file (or none) in place."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import sys
import threading
import time
from contextlib import closing, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import click
import numpy as np
import ray

from runtime.errors import InputError, Seq2OnnxError, Terminated, one_line
from runtime.infer_tokens import (
    TOKEN_OUTPUT_SUFFIXES,
    Item,
    TokenRun,
    batches,
    read_items,
)
from runtime.model import Seq2Seq
from runtime.point_inputs import check_mask, check_source, check_target_len
from runtime.sessions import max_threads
from serving.offline import (
    MAX_POINT_BLOCK,
    MAX_TOKEN_BLOCK,
    OrderError,
    Plan,
    PointDecoder,
    TokenDecoder,
    cluster_actors,
    decode_rows,
    point_dataset,
    token_dataset,
    whole_calls,
)

from .cluster import check_reachable, join_failed, runtime_env
from .common import published, say, wrote
from .infer import check_outputs, write_atomically
from .infer_points import InputFileError, read_input
from .infer_tokens import (
    check_token_usage,
    decoding_options,
    model_kind,
    refuse_token_options,
)
from .ray_job import RayJob
from .ray_shutdown import leave_ray
from .ray_stop import Stop, drive, keep_group_signals_from_ray, local_ray_failed, wait_for_threads

# Actors' own output stays in the Ray session's logs: a failing actor's traceback would otherwise reach the terminal,
# where the driver already reports its error as one line.
QUIET = dict(logging_level=logging.WARNING, log_to_driver=False)
# On a signal: the step under way (ray.init, a block of lines) ends, then Ray stops; past this, what started is killed
RAY_STOP_DEADLINE_S = 30.0
# Before Ray stops, the threads that Ray Data started in this process may take this long to end (`wait_for_threads`)
THREADS_DEADLINE_S = 5.0
# Said as the first signal is taken: the step under way ends first (starting Ray; or a block, seconds where Ray Data
# has handed the actors more), then Ray's threads here, then Ray stops (`cli.ray_shutdown`)
STOPPING_LINE = ("infer --ray: stopping once the step under way ends (starting Ray, or the block being decoded); a "
                 "second signal kills Ray's processes now")


def infer_on_ray(ctx: click.Context, job: RayJob) -> None:
    """`infer --ray` (its usage already checked by cli.infer): check the model and every input, then
    decode on Ray and write --output whole. `ctx` tells which options were given; their values are `job`'s."""
    base = dict(model_dir=str(Path(job.model_dir).resolve()), provider=job.provider, threads=job.threads or 1,
                fused=job.fused, attention=job.attention)
    note, tokens = None, model_kind(job.model_dir) == "tokens"
    if tokens:
        plan, chunks, note = _token_work(ctx, job, base)
        n, unit, most, decoder = sum(map(len, chunks)), plan.batch_size, MAX_TOKEN_BLOCK, TokenDecoder
        make = partial(token_dataset, chunks)
    else:
        plan, source, mask, whole = _point_work(ctx, job, base)
        n, unit, most, decoder = len(source), 1, MAX_POINT_BLOCK, PointDecoder
        if whole and n:  # one block, one actor: the one call in-process infer makes
            unit = most = n
            note = (f"note: {job.model_dir} is an int8 export, whose activations are quantized per call, over the "
                    f"call's rows: its {n} inputs were decoded in one call on one actor, as infer without --ray "
                    "decodes them, so that the values are the same (a float32 export's rows are spread over the "
                    "actors)")
        make = partial(point_dataset, source, mask)
    if job.address is None and job.concurrency is not None:  # the local Ray's CPUs are known before it starts
        _check_fits(plan, job.concurrency, max_threads(), None, "this machine's")
    output, inputs = job.output_path, f"{n} input{'' if n == 1 else 's'}"
    assert output is not None  # cli.infer refuses --ray without --output
    if n == 0:
        write_atomically(output, lambda f: None, job.force)
    else:
        done: list[tuple[int, float]] = []

        def run(stop: Stop) -> None:  # on a thread of its own: signals raised inside Ray's calls left Ray running
            with ray_session(job.address, plan.model_dir, stop):
                if stop.requested.is_set():  # it came while Ray started
                    return
                start = time.perf_counter()
                actors, lines = decode_rows(n, make, decoder, shipped, _actors(plan, job.concurrency), unit, most)
                # closed before Ray stops: Ray Data's iterator, left open, reported to a Ray that was gone, which
                # started a new local Ray (its agents outlived the command)
                with closing(lines):
                    try:
                        write_lines(output, _until_stopped(lines, stop), job.force)
                    except _Stopped:  # the temporary sibling is gone: nothing was written
                        return
                    published(output)  # a kill from here on says so
                done.append((actors, time.perf_counter() - start))

        # shipped with a job on a cluster: each actor reads its node's copy
        shipped = plan if job.address is None else dataclasses.replace(plan, model_dir=None)
        # Ray prints the errors its cluster reports ('(raylet) Task ... failed') on stdout, which --ray leaves empty
        with contextlib.redirect_stdout(sys.stderr):
            signum = drive(run, RAY_STOP_DEADLINE_S, "infer --ray", on_stop=STOPPING_LINE, writes=True)
        if done:  # published on the Ray thread, maybe before a signal that came while Ray stopped (seconds)
            actors, seconds = done[0]
            say(f"infer: {inputs} decoded in {seconds:.1f} s ({n / seconds:.3g} seq/s) "
                f"on {actors} actor{'' if actors == 1 else 's'}")
        if signum is not None:
            if done:  # the stop's message says it was written
                wrote(output, f" ({inputs})")
            raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    wrote(output, f" ({inputs})", last=True)
    if note:
        say(note)
    if n == 0:
        say(f"note: {'stdin' if job.input_path == '-' else job.input_path} held no "
            f"{'text' if tokens else 'items'}, so nothing was decoded")


def _load(base: dict[str, Any]) -> Seq2Seq:
    """The model, loaded once in the driver to check it (hashes, graphs, spec) before any actor is started."""
    try:
        return Seq2Seq.load(base["model_dir"], provider="cpu", threads=1, fused=base["fused"])
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None


def _token_work(ctx: click.Context, job: RayJob,
                base: dict[str, Any]) -> tuple[Plan, list[list[Item]], str | None]:
    """A token model's plan, its inputs in in-process chunks (every line checked), and the notes on blank lines
    and unknown tokens."""
    check_token_usage(ctx, job.model_dir, job.input_path, job.texts)
    options = decoding_options(ctx, job.decoding)
    check_outputs(job.input_path or "-", job.output_path, None, job.attention, job.force, TOKEN_OUTPUT_SUFFIXES)
    model = _load(base)
    batch_size = job.decoding["batch_size"]
    run = TokenRun(model, options, batch_size, job.attention, False)
    run.check(job.model_dir)
    items = read_items(job.input_path, job.texts)
    chunks = list(batches(items, batch_size, run.vocab, run.skipped, model.spec, model.contract, run.unknown))
    note = "\n".join([run.skipped_note()] * bool(run.skipped) + [run.unknown.note()] * bool(run.unknown.count)) or None
    return Plan(**base, batch_size=batch_size, options=options), chunks, note


def _point_work(ctx: click.Context, job: RayJob,
                base: dict[str, Any]) -> tuple[Plan, np.ndarray, np.ndarray, bool]:
    """A point model's plan, its (N, L, F) sources and (N, 1, L) mask, checked as predict checks them, and
    whether they must be decoded in one call (`serving.offline.whole_calls`)."""
    refuse_token_options(ctx, job.model_dir, job.input_path)
    check_outputs(job.input_path, job.output_path, None, job.attention, job.force, TOKEN_OUTPUT_SUFFIXES)
    source, mask = read_input(job.input_path)
    model = _load(base)
    try:
        target_len = check_target_len(job.target_len, model.spec)
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        points = check_source(source, model.spec)
        return Plan(**base, target_len=target_len), points, check_mask(mask, points), whole_calls(model)
    except InputError as exc:  # named with the file, as without --ray
        raise InputFileError.of(job.input_path, exc) from None


def _actors(plan: Plan, concurrency: int | None) -> int:
    """--concurrency, if the cluster has the CPUs (and GPUs) for it, else one actor per `plan.threads` CPUs."""
    resources = ray.cluster_resources()
    cpus, gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
    if plan.gpus and not gpus:
        raise click.ClickException("--provider cuda: the Ray cluster has no GPUs, and each actor needs one; join a "
                                   "cluster with GPUs (--address), or pass --provider cpu")
    if concurrency is None:
        return cluster_actors(plan)
    _check_fits(plan, concurrency, cpus, gpus)
    return concurrency


def _check_fits(plan: Plan, concurrency: int, cpus: int, gpus: int | None, whose: str = "the Ray cluster's") -> None:
    """--concurrency actors of plan.threads CPUs (and a GPU each with CUDA) within `cpus` (and `gpus`; None: not
    known yet), `whose` they are."""
    if concurrency * plan.threads > cpus or (gpus is not None and concurrency * plan.gpus > gpus):
        of_gpus = f" and {gpus} GPUs" if plan.gpus and gpus is not None else ""
        raise click.ClickException(f"--concurrency {concurrency}: {concurrency} actors of {plan.threads} CPU(s) "
                                   f"(--threads){' and a GPU' if plan.gpus else ''} each do not fit {whose} {cpus} "
                                   f"CPUs{of_gpus}; lower it")


def write_lines(output: str, lines: Iterator[str], force: bool) -> None:
    """Stream the lines into --output through a temporary sibling (over a file that appeared meanwhile only with
    `force`); a failure on the cluster is one line."""
    try:
        write_atomically(output, lambda f: f.writelines(line.encode("utf-8") for line in lines), force)
    except (ray.exceptions.RayError, OrderError) as exc:
        raise click.ClickException(f"--ray: decoding failed, so nothing was written to {output}: "
                                   f"{_innermost(exc)}") from None


def _innermost(exc: BaseException | None) -> str:
    """The deepest message in Ray's wrapping, as its last line reads ('...ManifestError: ...' for an actor's); Ray
    Data's own markers (SystemException) carry none."""
    found, seen = "", set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        lines = str(exc).strip().splitlines()
        found = lines[-1] if lines else found or type(exc).__name__
        exc = getattr(exc, "cause", None) or exc.__cause__
    return one_line(found)


class _Stopped(Exception):
    """A signal asked to stop while decoding (`cli.ray_stop`): raised between two lines, on the Ray thread."""


def _until_stopped(lines: Iterator[str], stop: Stop) -> Iterator[str]:
    for line in lines:
        if stop.requested.is_set():
            raise _Stopped
        yield line


@contextmanager
def ray_session(address: str | None, model_dir: str | None, stop: Stop) -> Iterator[None]:
    """Join --address, shipping model_dir as the job's working directory (Ray uploads it to every node that runs
    an actor), or start a local Ray on this machine's CPUs; leave it (a local one stops) at the end. On the Ray
    thread of `cli.ray_stop.drive`: Ray stops from the thread that started it (from another, it took 17 s and
    left its agents running)."""
    if address is not None:
        check_reachable(address)
    try:
        if address is None:
            keep_group_signals_from_ray()
            ray.init(address="local", num_cpus=max_threads(), include_dashboard=False, **QUIET)
        else:
            ray.init(address=address, runtime_env=runtime_env(model_dir), **QUIET)
    except (ConnectionError, ValueError, RuntimeError, OSError) as exc:
        if address is None:
            raise local_ray_failed("--ray", exc, one_line(exc)) from None
        raise join_failed(address, one_line(exc)) from None
    stop.connected.set()
    before = set(threading.enumerate())  # Ray's own threads are up: ray.shutdown stops them
    try:
        yield
    finally:
        stop.stopping.set()
        wait_for_threads(before, THREADS_DEADLINE_S)
        leave_ray()
