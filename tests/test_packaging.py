"""The distribution as `pip install .` builds it (not the editable install the tests run from): every package and
subpackage is in the wheel, and imports from it."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("runtime", "training", "export", "serving", "cli")


def source_packages() -> set[str]:
    """Every package of the checkout: a directory with an __init__.py under a top-level package."""
    return {str(init.parent.relative_to(ROOT)).replace("/", ".")
            for top in TOP_LEVEL for init in (ROOT / top).rglob("__init__.py")}


@pytest.mark.slow  # builds a wheel
def test_the_wheel_holds_every_package_and_imports_from_itself(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: setuptools' build/ in the checkout would lend the wheel stale files
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", ".ci-venv", "build", "*.egg-info",
                                                                 "__pycache__", "artifacts", "tests"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(tmp_path / "wheel"), str(source)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packaged = {name.rsplit("/", 1)[0].replace("/", ".") for name in archive.namelist()
                    if name.endswith("/__init__.py")}
        archive.extractall(tmp_path / "site")
    assert packaged == source_packages()
    # Imported with the unpacked wheel first on the path, from a directory outside the checkout.
    probe = ("import importlib, sys; mods = sys.argv[1:]; [importlib.import_module(m) for m in mods]; "
             "print(sorted({sys.modules[m].__file__.split('/site/')[0] for m in mods}))")
    result = subprocess.run([sys.executable, "-c", probe, *sorted(packaged)], capture_output=True, text=True,
                            cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == repr([str(tmp_path)]), result.stdout
