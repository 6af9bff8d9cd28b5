"""Training throughput of a token model: one process (1 and 2 threads) against 2 DDP processes under torchrun.

    python benchmarks/ddp_bench.py [--steps 200] [--warmup 3] [--repeats 3] [--batch-size 64] [--no-half-batch]

The model is `seq2onnx train`'s recurrent default on the built-in `reverse` set (GRU, hidden 128, embedding 32,
bidirectional encoder, dot attention, Adam, clip 1.0, bucketed batches); --batch-size is per process, as in
`seq2onnx train --nproc-per-node`. Rows, each one configuration run in a fresh process (or torchrun job):
  1 proc x 1 thr     one plain process (no torch.distributed), torch.set_num_threads(1)
  1 proc x 2 thr     the same with 2 intra-op threads
  2 proc x 1 thr     `python -m torch.distributed.run --standalone --nproc-per-node 2` running this file with
                     --worker: DistributedDataParallel over gloo, 1 thread per rank, global batch 2 x --batch-size
  2 proc x 1 thr b/2 the same with half the per-process batch: the single process's global batch, to tell "a
                     bigger global batch" apart from "more processes" (--no-half-batch leaves it out)
Only the training loop is timed: after --warmup steps, --steps calls of TokenTrainer.train_step (forward, loss
all-reduce, backward with DDP's gradient all-reduce, clipping, Adam), between two barriers under torchrun; start-up,
data loading, vocabularies and validation are not. samples/s counts the pairs trained by all ranks (a DDP shard's
padding rows included). Each repeat runs every row once, in turn, so drift hits all alike; figures are medians;
`vs 1x1` / `vs 1x2` divide a row's samples/s by those rows'. The 2-process rows also time a bare all-reduce of
the gradients' size (gloo, both ranks otherwise idle): the communication each step pays on top of its compute.

What to expect on bigger machines. On this 2-core box, 2 processes x 1 thread compete with the single process's
2 threads for the same two cores, so the comparison is between two ways of using them: intra-op threads (which
parallelise each small GRU op poorly) against data parallelism (each rank runs its own half of the work on one
core, then waits at one gradient all-reduce per step over gloo; the run prints its bytes per step). With more
cores or machines each rank owns its cores, so throughput grows with the ranks until the all-reduce (gradient
bytes per step / network bandwidth, plus gloo's per-call latency) or a per-rank batch too small to keep a core
busy dominates; raising --batch-size with the ranks keeps each rank's step efficient, at the price of a bigger
global batch (which may need another learning rate).

Measured here (2 cores, torch 2.13 CPU, 200 steps, medians of 3, load average ~1 before the run): 1 x 1 thread
1205 samples/s (53 ms/step); 1 x 2 threads 1.10x; 2 x 1 at batch 64 each 1.40x of 1 x 1 (1.28x of 1 x 2); 2 x 1 at
batch 32 each 0.92x. The GRU step is latency-bound (one process, 1 thread, batch 32 / 64 / 128: 40 / 49 / 83 ms a
step), so a halved per-rank batch saves little time, while DDP adds ~3-4 ms of gloo all-reduce (258,574 parameters,
1.0 MiB a step), the wait for the slower rank and two busy cores shared with the launcher: most of the 2-process
gain on this box is the bigger global batch (one process at batch 128: ~1540 samples/s, so 2 x 64 is ~1.1x of it).
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[1]
DATA = "reverse"
ALL_REDUCE_REPEATS = 50


def build_trainer(batch_size: int, dist: Any) -> Any:
    """A TokenTrainer with `seq2onnx train`'s recurrent defaults on the reverse set (per-process `batch_size`)."""
    from runtime.defaults import SPEC_OPTIONS, arch_defaults
    from runtime.vocab import Vocabulary
    from training.tokens.builtin import TOKENIZER_OF
    from training.tokens.data import load_text_dataset
    from training.tokens.trainer import TokenTrainConfig, TokenTrainer, spec_for_text

    opts = {**arch_defaults("recurrent", DATA), "arch": "recurrent", "attention": "dot", "batch_size": batch_size}
    train, test = load_text_dataset(DATA)
    kind = TOKENIZER_OF[DATA]
    source_vocab, target_vocab = Vocabulary.build(train.sources, kind), Vocabulary.build(train.targets, kind)
    spec = spec_for_text(train, source_vocab, target_vocab, n_heads=1, **{k: opts[k] for k in SPEC_OPTIONS})
    config = TokenTrainConfig(**{f: opts[f] for f in TokenTrainConfig().to_dict() if f in opts})  # seed: default
    return TokenTrainer(spec, config, train, test, source_vocab, target_vocab, dist)


def run_worker(threads: int, batch_size: int, steps: int, warmup: int, out: Path) -> None:
    """Time `steps` training steps after `warmup` ones; rank 0 (or the only process) writes the figures to `out`."""
    import torch

    from training.distributed import leave, start, stop
    from training.torchrun import launched

    torch.set_num_threads(threads)
    dist = start() if launched() else None
    try:
        trainer = build_trainer(batch_size, dist)
        trainer.model.train()
        batches: list[torch.Tensor] = []
        while len(batches) < warmup + steps:  # whole epochs (under torchrun: this rank's shards), as training does
            batches += trainer.epoch_batches()
            trainer.epoch += 1
        for index in batches[:warmup]:
            trainer.train_step(index)
        timed = batches[warmup:warmup + steps]
        if dist is not None:
            torch.distributed.barrier()
        start_time = time.perf_counter()
        for index in timed:
            trainer.train_step(index)
        if dist is not None:
            torch.distributed.barrier()
        seconds = time.perf_counter() - start_time
        rows = sum(len(index) for index in timed)
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        grad_bytes = sum(p.numel() * p.element_size() for p in params)
        figures = {"seconds": seconds, "steps": steps, "parameters": sum(p.numel() for p in params),
                   "grad_bytes": grad_bytes, "world_size": 1, "all_reduce_s": None}
        if dist is not None:
            figures["world_size"] = dist.world_size
            figures["samples"] = int(dist.all_sum(rows)[0])
            flat = torch.zeros(grad_bytes // 4)  # float32, the size of every gradient together
            torch.distributed.barrier()
            begin = time.perf_counter()
            for _ in range(ALL_REDUCE_REPEATS):
                torch.distributed.all_reduce(flat)
            figures["all_reduce_s"] = (time.perf_counter() - begin) / ALL_REDUCE_REPEATS
        else:
            figures["samples"] = rows
        if dist is None or dist.is_main:
            out.write_text(json.dumps(figures))
        if dist is not None:
            leave(dist)
    finally:
        if dist is not None:
            stop()  # on an error: at once (after `leave`, nothing is left to do)


def run_config(procs: int, threads: int, batch_size: int, steps: int, warmup: int, tmp: Path) -> dict[str, Any]:
    """One configuration in a fresh process (procs 1) or torchrun job; its figures, read back from rank 0's file."""
    out = tmp / "figures.json"
    out.unlink(missing_ok=True)
    worker = [str(Path(__file__).resolve()), "--worker", "--worker-out", str(out), "--threads", str(threads),
              "--batch-size", str(batch_size), "--steps", str(steps), "--warmup", str(warmup)]
    launcher = [sys.executable] if procs == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([*launcher, *worker], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate()
    except BaseException:  # interrupted: stop the whole job (torchrun and its ranks share the session's group)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    if proc.returncode != 0 or not out.is_file():
        raise click.ClickException(f"{procs} x {threads} thread(s) failed (exit {proc.returncode}):\n{output}")
    return json.loads(out.read_text())


def load_line(when: str) -> str:
    """The load averages (1, 5, 15 min) as one line."""
    one, five, fifteen = os.getloadavg()
    return f"load average {when}: {one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


@click.command()
@click.option("--steps", type=click.IntRange(1), default=200, show_default=True, help="Timed optimizer steps.")
@click.option("--warmup", type=click.IntRange(0), default=3, show_default=True, help="Untimed steps first.")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--batch-size", type=click.IntRange(2), default=64, show_default=True, help="Per process.")
@click.option("--half-batch/--no-half-batch", default=True, show_default=True,
              help="Also run 2 processes at half the per-process batch (the single process's global batch).")
@click.option("--worker", is_flag=True, hidden=True)
@click.option("--worker-out", type=click.Path(path_type=Path), default=None, hidden=True)
@click.option("--threads", type=click.IntRange(1), default=1, hidden=True)
def main(steps: int, warmup: int, repeats: int, batch_size: int, half_batch: bool, worker: bool,
         worker_out: Path | None, threads: int) -> None:
    """Print a table of medians: seconds, ms per step, samples per second, and ratios to the 1-process rows."""
    if worker:
        assert worker_out is not None, "--worker needs --worker-out"
        run_worker(threads, batch_size, steps, warmup, worker_out)
        return
    from runtime.sessions import max_threads

    configs = {"1 proc x 1 thr": (1, 1, batch_size), "1 proc x 2 thr": (1, 2, batch_size),
               "2 proc x 1 thr": (2, 1, batch_size)}
    if half_batch:
        configs["2 proc x 1 thr b/2"] = (2, 1, batch_size // 2)
    print(f"usable CPUs: {max_threads()} (os.cpu_count() {os.cpu_count()}); {DATA}, recurrent defaults, "
          f"{steps} timed steps after {warmup} warm-up, {repeats} repeat(s)")
    print(load_line("before"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="ddp_bench_") as tmp:
        for repeat in range(repeats):
            for name, (procs, thr, batch) in configs.items():
                figures = run_config(procs, thr, batch, steps, warmup, Path(tmp))
                runs[name].append(figures)
                print(f"  repeat {repeat + 1} {name:<19} {figures['seconds']:6.2f} s "
                      f"{figures['samples'] / figures['seconds']:8.0f} samples/s", flush=True)
    print(load_line("after"))
    first = next(iter(runs.values()))[0]
    print(f"model: {first['parameters']:,} parameters; gradient all-reduced per DDP step: {first['grad_bytes']:,} "
          f"bytes ({first['grad_bytes'] / 2**20:.2f} MiB float32), plus the step's loss and token count (16 bytes)")
    rate = {name: statistics.median(r["samples"] / r["seconds"] for r in rs) for name, rs in runs.items()}
    base1, base2 = rate["1 proc x 1 thr"], rate["1 proc x 2 thr"]
    print(f"\n{'config':<19} {'global batch':>12} {'seconds':>8} {'ms/step':>8} {'samples/s':>10} {'vs 1x1':>7} "
          f"{'vs 1x2':>7} {'all-reduce ms':>13}")
    for name, rs in runs.items():
        procs, _, batch = configs[name]
        seconds = statistics.median(r["seconds"] for r in rs)
        reduce = [r["all_reduce_s"] for r in rs if r["all_reduce_s"] is not None]
        reduce_text = f"{statistics.median(reduce) * 1e3:13.2f}" if reduce else f"{'-':>13}"
        print(f"{name:<19} {procs * batch:>12} {seconds:8.2f} {seconds / steps * 1e3:8.1f} {rate[name]:10.0f} "
              f"{rate[name] / base1:7.2f} {rate[name] / base2:7.2f} {reduce_text}")
    print("(medians; samples/s: pairs trained per second by all processes together; all-reduce ms: one bare "
          "all-reduce of the gradients' size)")


if __name__ == "__main__":
    main()
