"""CLI: --help everywhere, and train -> export -> infer -> verify through real subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import LAZY_COMMANDS, main
from runtime import __version__

# Runs the CLI in a child interpreter where `import torch` fails, as on a runtime-only install.
SQUARES_MODEL = os.path.join(os.path.dirname(__file__), os.pardir, "artifacts", "squares")
SQUARES_CHECKPOINT = os.path.join(os.path.dirname(__file__), os.pardir, "artifacts", "squares-checkpoint")
NO_TORCH = "import sys; sys.modules['torch'] = None; from cli.main import main; sys.argv[0] = 'seq2onnx'; main()"


def cli(*args, stdin=None, no_torch=False, timeout=600):
    """Run `seq2onnx ARGS` in a subprocess of this interpreter."""
    prefix = [sys.executable, "-c", NO_TORCH] if no_torch else [sys.executable, "-m", "cli"]
    return subprocess.run([*prefix, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=timeout)


def assert_user_error(result, *fragments):
    """Non-zero exit, one short message naming the problem, no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize("command", sorted(LAZY_COMMANDS))
def test_every_command_has_help(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: " in result.output and command in result.output


def test_version_and_group_help():
    runner = CliRunner()
    assert __version__ in runner.invoke(main, ["--version"]).output
    listing = runner.invoke(main, ["--help"]).output
    assert all(name in listing for name in LAZY_COMMANDS)
    assert "...\n" not in listing.split("Commands:")[1], listing  # each summary whole (serve's was cut: "dynamic...")


def test_without_torch_train_names_the_extra_and_help_still_works():
    assert_user_error(cli("train", "--epochs", "1", no_torch=True), "needs PyTorch (torch is not installed); "
                      "install the 'train' extra", "'.[cpu,train]'")
    assert cli("--help", no_torch=True).returncode == 0
    assert cli("train", "--help", no_torch=True).returncode == 0


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """train (few epochs) -> export, through the real CLI."""
    root = tmp_path_factory.mktemp("cli")
    ckpt, model = root / "ckpt", root / "model"
    trained = cli("train", "--epochs", "3", "--hidden-dim", "4", "--out", ckpt, "--quiet", "--threads", "1")
    assert trained.returncode == 0, trained.stderr
    assert "test MSE" in trained.stdout
    exported = cli("export", ckpt, "--out", model)
    assert exported.returncode == 0, exported.stderr
    assert "max_abs" in exported.stdout and "wrote" in exported.stdout
    return root, ckpt, model


def test_export_and_verify_of_a_directory_that_is_not_a_checkpoint(pipeline, tmp_path):
    _, _, model = pipeline
    (tmp_path / "empty").mkdir()
    assert_user_error(cli("export", tmp_path / "empty", "--out", tmp_path / "m"), "spec.json", "is missing")
    assert_user_error(cli("verify", tmp_path / "empty", model), "spec.json", "is missing")
    assert not (tmp_path / "m").exists()


def test_export_refuses_to_overwrite_without_force(pipeline):
    root, ckpt, model = pipeline
    before = (model / "manifest.json").read_text()
    assert_user_error(cli("export", ckpt, "--out", model), "already exists", "--force")
    assert (model / "manifest.json").read_text() == before


def test_infer_from_files_and_stdin_without_torch(pipeline):
    root, _, model = pipeline
    source = np.random.default_rng(0).normal(size=(3, 2, 2)).astype(np.float32)
    np.save(root / "src.npy", source)
    np.savez(root / "src.npz", source=source)
    from_npy = cli("infer", model, "--input", root / "src.npy", "--attention", no_torch=True)
    assert from_npy.returncode == 0, from_npy.stderr
    doc = json.loads(from_npy.stdout)
    assert np.asarray(doc["outputs"]).shape == (3, 2, 2) and np.asarray(doc["attention"]).shape == (3, 2, 2)
    from_npz = json.loads(cli("infer", model, "--input", root / "src.npz", no_torch=True).stdout)
    from_stdin = json.loads(cli("infer", model, "--input", "-", stdin=json.dumps(source.tolist()), no_torch=True).stdout)
    np.testing.assert_array_equal(from_npz["outputs"], doc["outputs"])
    np.testing.assert_array_equal(from_stdin["outputs"], doc["outputs"])
    assert "attention" not in from_npz


def test_infer_writes_npy_and_plot(pipeline):
    root, _, model = pipeline
    np.save(root / "one.npy", np.array([[[-1.0, -1.0], [-1.0, 1.0]]], np.float32))
    result = cli("infer", model, "--input", root / "one.npy", "--target-len", "5",
                 "--output", root / "out.npy", "--plot", root / "plot.png")
    assert result.returncode == 0, result.stderr
    assert np.load(root / "out.npy").shape == (1, 5, 2)
    assert (root / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {root / 'plot.png'} (item 0 of 1)" in result.stderr, result.stderr


@pytest.mark.parametrize(("n", "said"), [(0, "no items"), (1, "item 0"), (2, "items 0-1"), (9, "items 0-3")])
def test_a_plot_names_the_items_it_shows(n, said):
    from runtime.plot import shown_items

    assert shown_items(n) == said


@pytest.mark.parametrize(("shown", "decoded", "said"), [(4, 10, "the first 4 of 10 inputs"), (3, 3, "all 3 inputs"),
                                                       (1, 1, "the input")])
def test_a_token_plot_title_names_the_inputs_it_shows(shown, decoded, said):
    """'the first 1 of 1 inputs' was the title of a plot of one text."""
    from runtime.plot import shown_inputs

    assert shown_inputs(shown, decoded) == said


NO_HOME = "/proc/seq2onnx-no-home"  # no directory can be made there, not even by root
HISTORY_PLOT = ("import sys; from pathlib import Path; from training.plots import plot_history; "
                "plot_history({'train': [1.0, 0.5], 'val': [1.1, 0.6]}, Path(sys.argv[1]))")


@pytest.mark.parametrize("what", ["infer --plot", "train's loss.png"])
def test_plots_say_nothing_of_matplotlibs_config_where_home_cannot_hold_it(pipeline, tmp_path, what):
    """matplotlib falls back to a temporary config directory there, and said so in two lines of advice about
    MPLCONFIGDIR ('mkdir -p failed ...'), on every plot."""
    _, _, model = pipeline
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    env["HOME"] = NO_HOME
    png = tmp_path / "p.png"
    if what == "infer --plot":
        command = [sys.executable, "-m", "cli", "infer", str(model), "--input", "-", "--plot", str(png)]
    else:
        command = [sys.executable, "-c", HISTORY_PLOT, str(png)]
    result = subprocess.run(command, input="[[[0.0, 0.0], [1.0, 1.0]]]", capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "MPLCONFIGDIR" not in result.stderr and "matplotlib" not in result.stderr.lower(), result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_extra_before_any_work(pipeline, tmp_path):
    _, _, model = pipeline
    code = NO_TORCH.replace("sys.modules['torch'] = None", "sys.modules['torch'] = sys.modules['matplotlib'] = None")
    result = subprocess.run([sys.executable, "-c", code, "infer", str(model), "--input", "-", "--plot",
                             str(tmp_path / "p.png")], input="[[[0.0, 0.0]]]", capture_output=True, text=True)
    assert_user_error(result, "--plot needs matplotlib", "'.[plot]'")
    assert result.stdout == "" and not (tmp_path / "p.png").exists()
    bench = subprocess.run([sys.executable, "-c", code, "bench", str(model), "--repeats", "1", "--warmup", "0",
                            "--plot", str(tmp_path / "b.png"), "--json", str(tmp_path / "b.json")],
                           capture_output=True, text=True)
    assert_user_error(bench, "--plot needs matplotlib", "'.[plot]'")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("payload,fragments", [
    ("[[[1.0, 2.0, 3.0]]]", ["--input: stdin: source: expected shape (batch, source_len, 2)"]),
    ("[[[1.0, NaN]]]", ["--input: stdin: source: expected finite values", "NaN or Inf"]),
    ("not json", ["--input", "not valid JSON"]),
    ('{"points": []}', ["understood keys are ['source', 'source_mask']"]),
])
def test_infer_bad_input_is_one_line_and_non_zero(pipeline, payload, fragments):
    _, _, model = pipeline
    result = cli("infer", model, "--input", "-", stdin=payload, no_torch=True)
    assert_user_error(result, *fragments)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_what_a_file_holds_is_refused_naming_the_file(pipeline, tmp_path):
    """The file's name leads: it read 'source: expected shape ...' with nothing to say which input held it."""
    _, _, model = pipeline
    (tmp_path / "flat.json").write_text("[1.0, 2.0]")  # ([] is no longer one: it is batch 0, answered empty)
    result = cli("infer", model, "--input", tmp_path / "flat.json", no_torch=True)
    assert result.returncode == 1 and result.stderr.strip() == (
        f"Error: --input: {tmp_path / 'flat.json'}: source: expected shape (batch, source_len, 2), got a list of "
        "shape (2,), holding numbers"), result.stderr


def test_infer_bad_target_len_and_missing_model(pipeline, tmp_path):
    _, _, model = pipeline
    assert_user_error(cli("infer", model, "--input", "-", "--target-len", "0", stdin="[[[0.0, 0.0]]]"),
                      "--target-len", "0 is not in the range 1<=x<=10000")
    assert_user_error(cli("infer", tmp_path / "nope", "--input", "-", stdin="[[[0.0, 0.0]]]"), "does not exist")


def test_infer_refuses_a_bad_output_name_before_work(pipeline, tmp_path):
    _, _, model = pipeline
    assert_user_error(cli("infer", model, "--input", "-", "--output", tmp_path / "out.csv", stdin="[[[0.0, 0.0]]]"),
                      "--output", ".json, .npy, .npz")
    assert_user_error(cli("infer", model, "--input", "-", "--attention", "--output", tmp_path / "o.npy",
                          stdin="[[[0.0, 0.0]]]"), "use .json or .npz")
    assert list(tmp_path.iterdir()) == []


def test_a_named_pipe_where_a_marker_belongs_is_refused_at_once_not_read(tmp_path):
    """A FIFO named manifest.json (spec.json) in --out: the check whether the directory is seq2onnx's read it and
    waited for a writer for ever, in `export --force`, `train --force` and `train --resume` (found by a fresh walk).
    It is no marker of ours: refused at once, by what it is; a directory beside it is not taken for an export."""
    export, checkpoint = tmp_path / "e", tmp_path / "c"
    export.mkdir(), checkpoint.mkdir()
    os.mkfifo(export / "manifest.json"), (export / "a.onnx").touch()
    os.mkfifo(checkpoint / "spec.json"), (checkpoint / "weights.pt").touch()
    pipe = "that is not a regular file (mode prw"
    assert_user_error(cli("export", SQUARES_CHECKPOINT, "--out", export, "--force", timeout=60), f"{export}: holds a "
                      f"manifest.json {pipe}", "refusing, even with --force")
    for how in (["--force"], ["--resume", "--epochs", "2"]):
        assert_user_error(cli("train", "--data", "squares", "--epochs", "1", "--out", checkpoint, *how, timeout=60),
                          f"{checkpoint}: holds a spec.json {pipe}")
    assert sorted(p.name for p in export.iterdir()) == ["a.onnx", "manifest.json"]


@pytest.mark.parametrize(("make", "kind"), [(os.mkfifo, "a named pipe (FIFO)"), ("socket", "a socket")])
def test_force_never_replaces_what_is_not_a_file(tmp_path, make, kind):
    """`--force` replaced a named pipe (whose reader then waited for ever) or a device node with a regular file:
    it replaces a file or a link only (found by a fresh walk)."""
    import socket
    import stat

    out = tmp_path / "out.json"
    if make == "socket":
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(out))
    else:
        make(out)
    done = cli("infer", SQUARES_MODEL, "--input", "-", "--output", out, "--force", stdin="[[[0.0, 0.0]]]")
    assert_user_error(done, f"--output: {out}: is {kind}, not a file; an output replaces only a file or a link, "
                      "even with --force")
    assert done.returncode == 1 and not stat.S_ISREG(os.lstat(out).st_mode)
    if make == "socket":
        listener.close()


def test_verify_passes_and_fails_on_tolerance(pipeline):
    _, ckpt, model = pipeline
    ok = cli("verify", ckpt, model)
    assert ok.returncode == 0, ok.stderr
    assert "train [0:" in ok.stdout and "all " in ok.stdout  # the checkpoint's training data was used
    strict = cli("verify", ckpt, model, "--atol", "1e-30", "--rtol", "0")
    assert_user_error(strict, "exceed atol=1e-30")
    # the export names this checkpoint: the tolerance is the suspect, not the pair
    assert "tighter than an export can hold" in strict.stderr and "not a pair" not in strict.stderr


def test_verify_refuses_a_mismatched_pair(pipeline, tmp_path):
    root, ckpt, model = pipeline
    other = tmp_path / "other"
    assert cli("train", "--epochs", "1", "--attention", "none", "--out", other, "--quiet").returncode == 0
    assert_user_error(cli("verify", other, model), "cannot be compared")
    # the same spec trained again (other weights) under the checkpoint's own name: the pair is the suspect
    again = tmp_path / "again" / ckpt.name
    retrained = cli("train", "--epochs", "1", "--hidden-dim", "4", "--seed", "7", "--out", again, "--quiet",
                    "--threads", "1")
    assert retrained.returncode == 0, retrained.stderr
    mixed = cli("verify", again, model)
    assert_user_error(mixed, "the two are not a pair")
    assert "trained again" in mixed.stderr and "tighter than an export" not in mixed.stderr
    assert "float32-sized" not in mixed.stderr  # other weights: no hint that the tolerance is to blame


@pytest.mark.parametrize(("command", "says", "not_says"), [
    ("train", "lr_decay**e. [default: 0.8]", "transformers: 0.8"),  # one default where both archs agree
    ("train", "[default: 1; transformers: 2]", None),  # --layers: two where they differ
    ("train", "[default: 100 for points, 12 for tokens] [x>=1]", "12 for transformers"),  # --epochs: 12 said once
    ("infer", "[default: the usable CPUs, at most 4]", None),
    ("eval", "[default: the usable CPUs, at most 4]", None),
])
def test_help_states_each_default_once(command: str, says: str, not_says: str | None) -> None:
    shown = " ".join(CliRunner().invoke(main, [command, "--help"], terminal_width=200).output.split())
    assert says in shown and (not_says is None or not_says not in shown), shown


def test_infer_attention_of_a_point_model_without_attention_is_refused(exports, tmp_path):
    """`--attention` on a model whose spec says attention 'none' is a usage error, as for token models (it printed
    the outputs alone, exit 0)."""
    points = tmp_path / "points.npy"
    np.save(points, np.zeros((2, 3, 2), np.float32))
    result = CliRunner().invoke(main, ["infer", str(exports["none"].path), "--input", str(points), "--attention"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--attention: " in result.output and "has no attention (its spec says attention 'none')" in result.output
    assert CliRunner().invoke(main, ["infer", str(exports["none"].path), "--input", str(points)]).exit_code == 0


@pytest.mark.parametrize("features", [1, 2, 3])
def test_a_point_plot_draws_any_feature_count_and_long_paths(features, tmp_path):
    """One feature is drawn as its value by position, three or more as their first two (said in the item's title);
    a path of thousands of points labels only every k-th, with a bounded count of heatmap ticks (it crashed for one
    feature, and took minutes and warnings for 10,000 steps: a label and a tick per point)."""
    import warnings

    from matplotlib.figure import Figure

    from runtime.plot import MAX_POINT_LABELS, MAX_POINT_TICKS, _draw_attention, _draw_item, plot_predictions

    rng = np.random.default_rng(0)
    source = rng.normal(size=(1, 50, features)).astype(np.float32)  # (N, Ls, F)
    outputs = rng.normal(size=(1, 3000, features)).astype(np.float32)  # (N, Lt, F)
    alphas = rng.uniform(size=(1, 3000, 50)).astype(np.float32)  # (N, Lt, Ls)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "loc='best' can be slow" among them
        with open(tmp_path / "p.png", "wb") as f:
            plot_predictions(source, outputs, alphas, f)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    fig = Figure()
    item, heat = fig.subplots(1, 2)
    _draw_item(item, source[0], outputs[0], 0)
    _draw_attention(fig, heat, alphas[0], heads=False)
    assert len(item.texts) <= MAX_POINT_LABELS + 1
    assert len(heat.get_yticks()) <= MAX_POINT_TICKS + 1 and len(heat.get_xticks()) <= MAX_POINT_TICKS + 1
    said = {1: "item 0 (value by position)", 2: "item 0", 3: "item 0 (features 0-1 of 3)"}[features]
    assert item.get_title() == said
