"""The benchmarks' --json and --plot files follow the CLI's rule (benchmarks/bench_outputs.py over
runtime.destination.check_output_file and runtime.atomic_file.write_file): refused before any work, in one line, exit 1
for a file already there without --force and 2 for a path that cannot be used, the user's file left as it was; with
--force the file is replaced whole; a file that appears during a run is kept unless --force."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
DATES = str(ROOT / "artifacts" / "dates")
SCRIPTS = {  # each with what it needs to start; the refusal comes before any of it runs
    "soak_bench": [DATES, "--decodes", "40", "--warmup", "5", "--sample-every", "10"],
    "transformer_step_bench": [],
    "ct2_bench": ["--checkpoint", str(ROOT / "artifacts" / "dates-checkpoint")],
    "serve_bench": [DATES, "--no-ray"],
    "device_bench": [DATES, "--device", "cpu"],
}
PLOTS = ["soak_bench", "transformer_step_bench", "ct2_bench", "serve_bench"]
JSONS = ["ct2_bench", "serve_bench", "device_bench"]


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / f"{script}.py"), *SCRIPTS[script], *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


CASES = [  # (option, file name under tmp_path, exit code, what the message says)
    ("--plot", "taken.png", 1, "a file already exists there; pass --force"),
    ("--plot", "link.png", 1, "a link already exists there; pass --force"),
    ("--plot", "missing/x.png", 2, "does not exist; create it first"),
    ("--plot", "chart.jpg", 2, "expected a file name ending in .png"),
    ("--plot", "folder", 2, "is a directory"),
    ("--json", "taken.json", 1, "a file already exists there; pass --force"),
    ("--json", "x.txt", 2, "expected a file name ending in .json"),
    ("--json", "newdir/", 2, "expected a file name ending in .json"),  # Path() drops the '/'; refused all the same
    ("--json", "missing/x.json", 2, "does not exist; create it first"),
]


# Every case on one click script and one argparse script; the others (two of them load torch first) show they are
# wired to the same rule with one case of each exit code.
FULL = {"--plot": ["soak_bench", "serve_bench"], "--json": ["serve_bench"]}
WIRED = {"transformer_step_bench": ("taken.png", "chart.jpg"), "ct2_bench": ("taken.json", "chart.jpg"),
         "device_bench": ("taken.json", "x.txt")}
SCRIPT_CASES = [(script, *case) for case in CASES for script in FULL[case[0]]]
SCRIPT_CASES += [(script, *case) for script, names in WIRED.items() for case in CASES if case[1] in names
                 and script in (PLOTS if case[0] == "--plot" else JSONS)]


@pytest.mark.parametrize(("script", "option", "name", "code", "says"), SCRIPT_CASES,
                         ids=[f"{s}{o}-{n}" for s, o, n, _, _ in SCRIPT_CASES])
def test_a_bad_output_path_is_refused_before_any_work(tmp_path, script, option, name, code, says):
    (tmp_path / "taken.png").write_text("mine")
    (tmp_path / "taken.json").write_text("mine")
    (tmp_path / "link.png").symlink_to(tmp_path / "gone.png")  # dangling: still not replaced without --force
    (tmp_path / "folder").mkdir()
    path = str(tmp_path / name) + ("/" if name.endswith("/") else "")
    done = run(script, option, path)
    assert done.returncode == code and says in done.stderr and option in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not done.stdout  # nothing was measured
    assert (tmp_path / "taken.png").read_text() == "mine" and (tmp_path / "taken.json").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "link.png", "taken.json", "taken.png"]


def test_force_replaces_the_plot_whole(tmp_path):
    plot = tmp_path / "rss.png"
    plot.write_text("mine")
    done = run("soak_bench", "--plot", str(plot), "--force")
    assert done.returncode == 0, done.stderr
    assert plot.read_bytes()[:4] == b"\x89PNG" and sorted(p.name for p in tmp_path.iterdir()) == ["rss.png"]


def test_a_file_that_appears_during_the_run_is_kept_unless_forced(tmp_path, capsys):
    sys.path.insert(0, str(BENCH))
    try:
        from bench_outputs import publish
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "figures.json"

    def write(f):  # the run's last step; the user's file lands meanwhile
        out.write_text("mine")
        f.write(b"{}")

    with pytest.raises(SystemExit) as stopped:
        publish(out, False, write)
    assert stopped.value.code == 1 and "appeared there while this ran; it was kept" in capsys.readouterr().err
    assert out.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["figures.json"]
    publish(out, True, write)
    assert out.read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == ["figures.json"]
