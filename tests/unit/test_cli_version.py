"""``pyxds --version`` prints the package's version and exits 0."""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import subprocess
import sys

import pyxds

SRC = str(pathlib.Path(__file__).resolve().parents[2] / "src")


def test_pyxds_version_prints_the_package_version():
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "pyxds.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"pyxds {pyxds.__version__}"


def test_the_installed_distribution_carries_the_same_version():
    assert importlib.metadata.version("pyxds") == pyxds.__version__
