"""Option types and checks that several commands share: finite (and normal) floats, --threads, --workers."""
from __future__ import annotations

import math
import sys
from typing import Any

import click


class IntRange(click.IntRange):
    """click's IntRange, but a value that is not an integer at all is said to be that ('abc' is not a valid
    integer), not 'not a valid integer range'; out of range, click's own message names the range."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(click.INT.convert(value, param, ctx), param, ctx)


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan and +-inf, which pass every range comparison."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):  # said first: 'inf is not in the range' would hide what is wrong
            bounds = "" if self.min is None and self.max is None else f" in {self._describe_range()}"
            self.fail(f"expected a finite number{bounds}, got {value!r}", param, ctx)
        return super().convert(number, param, ctx)

    def _describe_range(self) -> str:
        # click renders an unbounded range as 'x<=None'; say what is accepted instead
        if self.min is None and self.max is None:
            return "finite"
        return super()._describe_range()


class NormalFloatRange(FiniteFloatRange):
    """A FiniteFloatRange that also refuses a subnormal number (0 < |x| < 2.2e-308), which a decode that flushes
    denormals (runtime.denormals) reads as 0."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if 0 < abs(number) < sys.float_info.min:
            self.fail(f"{value!r} is below {sys.float_info.min:.4g}, the smallest normal float (decoding reads a "
                      "smaller one as 0)", param, ctx)
        return number


def within_cpus(value: int | None, why: str) -> int | None:
    """A count of 1 up to this machine's usable CPUs (None passes); `why` says why that is the bound."""
    if value is None:
        return None
    from runtime.sessions import max_threads

    if not 1 <= value <= max_threads():
        raise click.BadParameter(f"expected 1..{max_threads()} ({why}), got {value}")
    return value


def check_threads_option(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """--threads: 1 up to this machine's usable CPUs (more only oversubscribes the cores)."""
    return within_cpus(value, "the CPUs this process may use; more threads only contend for them")


def check_workers_option(workers: int, threads: int | None, on_ray: bool) -> None:
    """--workers: not with --ray (its actors are the copies: --concurrency), and workers x threads within the CPUs."""
    from runtime.sessions import max_threads

    if workers > 1 and on_ray:
        raise click.UsageError(f"--workers {workers} decodes on copies of the model in this process; with --ray every "
                               "actor holds a copy: set how many with --concurrency and drop --workers")
    if workers * (threads or 1) > max_threads():
        each = f" of --threads {threads}" if threads else " of one thread"
        raise click.UsageError(f"--workers {workers}{each} need {workers * (threads or 1)} CPUs, more than the "
                               f"{max_threads()} this process may use; pass --workers x --threads (1 unless given) "
                               f"of at most {max_threads()}")


def check_device_option(ctx: click.Context, provider: str) -> None:
    """--device-id picks a GPU: given with --provider cpu it would change nothing, so it is refused."""
    if provider == "cpu" and ctx.get_parameter_source("device_id") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--device-id picks a GPU; with --provider cpu it would change nothing: drop it, or "
                               "pass --provider cuda or auto")


def refuse_repeated_paths(command: click.Command) -> click.Command:
    """`command`, refusing an option that names a file (a click.Path, or --data) given twice: click keeps the last,
    so `infer --input a.txt --input b.txt` decoded b.txt alone and `--out a --out b` wrote only b, without a word.
    Other options keep click's rule (the last one counts), which scripts use to override their defaults."""
    parse = command.parse_args

    def parse_args(ctx: click.Context, args: list[str]) -> list[str]:
        seen: dict[str, str] = {}
        options = {name: p for p in command.params if isinstance(p, click.Option)
                   for name in (*p.opts, *p.secondary_opts)}
        tokens = iter(args)
        for token in tokens:
            if token == "--":
                break
            name, has_value, value = token.partition("=")
            param = options.get(name) if name.startswith("--") else None
            if param is None:
                continue
            if not param.is_flag and not has_value:
                value = next(tokens, "")  # the option's value, never read as an option itself
            if param.multiple or param.is_flag or not (isinstance(param.type, click.Path) or param.name == "data"):
                continue
            if param.name in seen:
                raise click.UsageError(f"{name} given twice ({seen[param.name]!r}, then {value!r}); it names one "
                                       "path: give it once", ctx)
            seen[param.name] = value
        return parse(ctx, args)

    command.parse_args = parse_args  # type: ignore[method-assign]
    return command


def address_option(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--address: HOST:PORT of a Ray cluster's head (port 1-65535; an IPv6 host in brackets), ray://HOST:PORT (Ray
    Client) or auto (the cluster this machine belongs to); refused as usage before Ray is imported."""
    if value is None or value == "auto":
        return value
    host, colon, port = value.removeprefix("ray://").rpartition(":")
    if not (colon and host.strip("[]") and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
            and "/" not in host and host == host.strip()):
        raise click.BadParameter(f"expected HOST:PORT of a Ray cluster's head (port 1-65535), ray://HOST:PORT or "
                                 f"auto; got {value!r}", param=param)
    return value
