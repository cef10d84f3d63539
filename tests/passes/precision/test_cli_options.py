"""The shared click options and the conversion they drive."""

from __future__ import annotations

import json

import click
import numpy as np
from click.testing import CliRunner

from tests.passes.precision.test_convert import _mlp
from trtforge.passes.precision.cli_options import convert_with_options, precision_options


@click.command()
@precision_options
def _cmd(**params) -> None:
    click.echo(json.dumps(params))


@click.command()
@precision_options(default="fp32")
def _cmd32(**params) -> None:
    click.echo(json.dumps(params))


def test_options_parse_and_default() -> None:
    res = CliRunner().invoke(
        _cmd, ["--precision", "BF16", "--keep-fp32", "Softmax", "--keep-fp32", "mm1", "--low-precision-io"]
    )
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got == {
        "precision": "bf16",
        "keep_fp32": ["Softmax", "mm1"],
        "keep_io_types": False,
        "precision_data": None,
    }
    assert json.loads(CliRunner().invoke(_cmd32, []).output)["precision"] == "fp32"
    assert json.loads(CliRunner().invoke(_cmd, []).output)["keep_io_types"] is True
    bad = CliRunner().invoke(_cmd, ["--precision", "int8"])
    assert bad.exit_code == 2 and "int8" in bad.output


def test_convert_with_options_reads_precision_data(tmp_path) -> None:
    path = tmp_path / "samples.npz"
    np.savez(path, x=np.random.default_rng(1).standard_normal((6, 16)).astype(np.float32))
    _, rec = convert_with_options(_mlp(), precision="fp16", keep_fp32=["mm2"], precision_data=str(path))
    assert rec.data_source == "user data" and rec.sample_batches >= 1
    assert [k.name for k in rec.kept_fp32] == ["mm2"]
    _, noop = convert_with_options(_mlp(), precision="fp32", precision_data=str(tmp_path / "missing.npz"))
    assert noop.status == "noop-fp32"
