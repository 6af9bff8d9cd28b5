"""The program's standard streams (cli.streams): a stderr that cannot be written costs a command nothing; a stdout
that cannot take the output is the command's error in one line; streams closed at start are held, so a server
runs and stops cleanly without them. And a working directory removed before the program started."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import httpx
import pytest

from support.serve import DATES, ROOT, SQUARES, free_port, wait_healthy

CLI = [sys.executable, "-m", "cli"]
CHECKPOINT = ROOT / "artifacts" / "squares-checkpoint"
CLOSE = {"stdin": 0, "stdout": 1, "stderr": 2}


def _closing(fd: int) -> Callable[[], None]:
    return lambda: os.close(fd)


# each a command and what it leaves in its working directory (besides what was there)
WORK = {"train": (["train", "--out", "ck", "--epochs", "1"], "ck"),
        "export": (["export", str(CHECKPOINT), "--out", "ex"], "ex"),
        "verify": (["verify", str(CHECKPOINT), str(SQUARES)], None),
        "eval": (["eval", str(DATES), "--data", "dates", "--limit", "20"], None)}


@pytest.mark.parametrize("command", list(WORK))
def test_a_stderr_that_cannot_be_written_costs_the_command_nothing(tmp_path: Path, command: str) -> None:
    """stderr on a full disk: progress bars, tables' notes and 'wrote' lines are lost, the work is done, exit 0.
    tqdm's first write failed the run: exit 1, nothing written (`infer` alone had been mended)."""
    args, made = WORK[command]
    with open("/dev/full", "w") as full:
        done = subprocess.run([*CLI, *args], cwd=tmp_path, stderr=full, stdout=subprocess.PIPE, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ([made] if made else [])


@pytest.mark.parametrize("how", ["full", "full-c-locale", "closed", "pipe-closed-early", "export"])
def test_a_stdout_that_cannot_take_the_output_is_one_line(tmp_path: Path, how: str) -> None:
    """The output lost on the way to stdout is the command's error, exit 1: it was a traceback (full), exit 0 with
    the results gone (closed), exit 1 with no word (a reader that stopped early), or, for export's parity table,
    an error blaming --out."""
    texts = tmp_path / "texts.txt"
    texts.write_text("march 3 2015\n" * 20_000)
    args = ["export", str(CHECKPOINT), "--out", "ex"] if how == "export" else ["infer", str(DATES), "--input",
                                                                                str(texts)]
    if how == "pipe-closed-early":
        with subprocess.Popen([*CLI, *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as proc:
            proc.stdout.read(10)
            proc.stdout.close()
            said = proc.stderr.read()
        code, why = proc.returncode, "Broken pipe"
    else:
        with open("/dev/full", "w") as full:
            # (in a C locale with UTF-8 mode off click writes to stdout's binary buffer itself: a traceback there)
            locale = {"PYTHONUTF8": "0", "LC_ALL": "C"} if how == "full-c-locale" else {}
            done = subprocess.run([*CLI, *args], cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True,
                                  timeout=300, preexec_fn=_closing(1) if how == "closed" else None,
                                  env={**os.environ, **locale})
        code, said = done.returncode, done.stderr
        why = "Bad file descriptor" if how == "closed" else "No space left on device"
    assert code == 1 and "Traceback" not in said, said[-3000:]
    name = args[0]
    assert said.strip().splitlines()[-1] == (f"Error: {name}: could not write to stdout ({why}), so the output there "
                                             "is incomplete or missing (files are written whole or not at all)"), said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["texts.txt"]  # no export, no staging left


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_the_groups_own_output_lost_is_one_line(tmp_path: Path, option: str) -> None:
    """`seq2onnx --help >/dev/full`: printed before any command runs, outside a command's handling (a traceback)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([*CLI, option], cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=60)
    assert done.returncode == 1 and done.stderr == ("Error: seq2onnx: could not write to stdout (No space left on "
                                                    "device)\n"), done.stderr


@pytest.mark.parametrize("model", [DATES, SQUARES], ids=["tokens", "points"])
def test_a_closed_stdin_is_one_line(tmp_path: Path, model: Path) -> None:
    done = subprocess.run([*CLI, "infer", str(model), "--input", "-"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, preexec_fn=_closing(0))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].endswith("stdin could not be read (Bad file descriptor)"), done.stderr


@pytest.mark.parametrize("stream", list(CLOSE))
def test_a_server_started_without_a_stream_serves_and_stops(tmp_path: Path, stream: str) -> None:
    """`serve >&-` failed in uvicorn's logging set-up (a traceback, exit 1); with stdin or stderr closed it served,
    then aborted at SIGTERM (libuv refused to close its socket, which had taken fd 0 or 2: exit 134)."""
    port = free_port()
    keep = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    with subprocess.Popen([*CLI, "serve", str(DATES), "--port", str(port)], cwd=tmp_path, **keep,
                          preexec_fn=_closing(CLOSE[stream])) as proc:
        try:
            wait_healthy(f"http://127.0.0.1:{port}/readyz", 60, proc)
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/translate", json={"texts": ["3/3/15"]}, timeout=30)
            assert answer.status_code == 200 and answer.json()["translations"][0][0]["text"] == "2015-03-03"
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
    assert code == 0


def test_a_working_directory_that_was_removed_is_one_line(tmp_path: Path) -> None:
    """Started in a directory removed since: one line, exit 1 (infer's relative --output was a traceback, and
    torch's import in train, export and verify aborted with 'Intel oneMKL FATAL ERROR: Cannot load')."""
    gone = tmp_path / "gone"
    gone.mkdir()
    with subprocess.Popen([*CLI, "infer", str(DATES), "--text", "3/3/15", "--output", "o.jsonl"], cwd=gone,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: os.rmdir(os.getcwd())) as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert err.strip() == ("Error: the working directory no longer exists (it was removed after the shell entered "
                           "it); cd to a directory that exists"), err
    assert sorted(tmp_path.iterdir()) == []


def test_a_text_argument_in_a_c_locale_is_read_as_utf8(tmp_path: Path) -> None:
    """Python decodes argv by the locale: in a C locale with UTF-8 mode off, `--text 'März 3 2015'` came with two
    lone surrogates and was refused as not UTF-8, though its bytes were. Bytes that are not UTF-8 still are."""
    args = [*CLI, "infer", str(DATES), "--text"]
    c_locale = {**os.environ, "PYTHONUTF8": "0", "LC_ALL": "C"}
    utf8 = subprocess.run([*args, "März 3 2015"], capture_output=True, text=True, timeout=60)
    c = subprocess.run([*args, "März 3 2015"], capture_output=True, text=True, timeout=60, env=c_locale)
    assert utf8.returncode == 0 and c.returncode == 0, c.stderr
    assert c.stdout == utf8.stdout
    latin1 = subprocess.run([*args, os.fsdecode(b"M\xe4rz 3")], capture_output=True, text=True,
                            timeout=60, env=c_locale)
    assert latin1.returncode == 2 and "--text #1: not UTF-8 (byte 0xe4 at offset 1)" in latin1.stderr, latin1.stderr


def test_an_export_path_in_utf8_under_a_c_locale_names_the_locale(tmp_path: Path) -> None:
    """The path's bytes are UTF-8, but the locale cannot hand it to torch's exporter: the message said the path was
    not UTF-8."""
    done = subprocess.run([*CLI, "export", str(CHECKPOINT), "--out", "exü"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONUTF8": "0", "LC_ALL": "C"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        "the --out path is UTF-8, which this locale (ascii) cannot pass to torch's ONNX exporter; run in a UTF-8 "
        "locale (LC_ALL=C.UTF-8) or with PYTHONUTF8=1"), done.stderr
    assert sorted(tmp_path.iterdir()) == []
