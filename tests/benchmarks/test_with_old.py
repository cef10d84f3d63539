"""`with_old` (benchmarks/device_env.sh) runs a benchmark on an older tree by putting it first on
PYTHONPATH: the scripts must import trtforge from there, not from this checkout. From 803eff4 until
session 38 bench_serving imported bench_throughput, which put this checkout first on sys.path, so every
"old" run of the 1.1B no-regression check measured this tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "imported the tree given first on PYTHONPATH"


@pytest.mark.parametrize("script", ["bench_serving.py", "bench_throughput.py"])
def test_a_tree_first_on_pythonpath_is_the_trtforge_a_benchmark_imports(tmp_path, script) -> None:
    package = tmp_path / "trtforge"
    package.mkdir()
    (package / "__init__.py").write_text(f"import sys\nprint({MARK!r})\nsys.exit(7)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 7 and MARK in run.stdout, (run.returncode, run.stdout[-500:], run.stderr[-2000:])
