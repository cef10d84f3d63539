"""Triton model repositories from the tiny BERT engine, parsed with tritonclient's protobuf."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.models import BERT_INPUTS, bert_inputs, tiny_bert
from trtforge.cli.main import main

pytestmark = pytest.mark.trt_build
mc = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] not installed")
text_format = pytest.importorskip("google.protobuf.text_format")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bert_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import trtforge

    out = tmp_path_factory.mktemp("engine") / "bert.engine"
    trtforge.compile(
        tiny_bert(),
        bert_inputs(2, 8),
        out,
        dynamic="batch,seq",
        output_names=["last_hidden_state", "pooler_output"],
        shapes=[f"{n}:1x1:4x16:8x64" for n in BERT_INPUTS],
        streams=2,
        progress=False,
    )
    return out


def _parse(path: Path):
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def test_default_repository(bert_engine: Path, tmp_path: Path, capsys) -> None:
    repo = tmp_path / "repo"
    assert main(["export-triton", str(bert_engine), "-o", str(repo)]) == 0
    assert (repo / "bert" / "1" / "model.plan").read_bytes() == bert_engine.read_bytes()
    cfg = _parse(repo / "bert" / "config.pbtxt")
    manifest = json.loads(Path(str(bert_engine) + ".json").read_text())
    assert cfg.name == "bert" and cfg.platform == "tensorrt_plan"
    assert cfg.max_batch_size == 8 == manifest["profiles"][0]["input_ids"]["max"][0]
    assert [i.name for i in cfg.input] == [t["name"] for t in manifest["inputs"]]
    assert all(mc.DataType.Name(i.data_type) == "TYPE_INT64" and list(i.dims) == [-1] for i in cfg.input)
    assert [(o.name, list(o.dims)) for o in cfg.output] == [
        ("last_hidden_state", [-1, 32]),
        ("pooler_output", [32]),
    ]
    assert [list(g.profile) for g in cfg.instance_group] == [["0"]]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 0
    assert "validated" in capsys.readouterr().out
    mask = os.umask(0)
    os.umask(mask)  # (before: 0700, the staging directory's mode from mkdtemp: unreadable to a Triton user)
    assert (repo / "bert").stat().st_mode & 0o777 == 0o777 & ~mask


def test_instances_get_distinct_profiles(bert_engine: Path, tmp_path: Path) -> None:
    argv = [
        "export-triton",
        str(bert_engine),
        "-o",
        str(tmp_path),
        "--name",
        "b2",
        "--instances",
        "2",
        "--max-batch",
        "4",
        "--preferred-batch-size",
        "4",
        "--max-queue-delay-us",
        "100",
    ]
    assert main(argv) == 0
    cfg = _parse(tmp_path / "b2" / "config.pbtxt")
    assert [list(g.profile) for g in cfg.instance_group] == [["0"], ["1"]]
    assert all(
        g.count == 1 and mc.ModelInstanceGroup.Kind.Name(g.kind) == "KIND_GPU" for g in cfg.instance_group
    )
    assert cfg.max_batch_size == 4 and list(cfg.dynamic_batching.preferred_batch_size) == [4]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 100


def test_no_batching(bert_engine: Path, tmp_path: Path) -> None:
    assert main(["export-triton", str(bert_engine), "-o", str(tmp_path), "--max-batch", "0"]) == 0
    cfg = _parse(tmp_path / "bert" / "config.pbtxt")
    assert cfg.max_batch_size == 0 and list(cfg.input[0].dims) == [-1, -1]
    assert not cfg.HasField("dynamic_batching")


def _fails(argv: list[str], capsys, expected: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err, err


def test_bad_inputs(bert_engine: Path, tmp_path: Path, capsys) -> None:
    repo = tmp_path / "repo"
    _fails(["export-triton", str(bert_engine), "-o", str(repo), "--max-batch", "64"], capsys, "at most 8")
    _fails(["export-triton", str(bert_engine), "-o", str(repo), "--instances", "3"], capsys, "--streams 3")
    assert not (repo / "bert").exists()
    lonely = tmp_path / "lonely.engine"
    shutil.copy(bert_engine, lonely)
    _fails(["export-triton", str(lonely), "-o", str(repo)], capsys, "has no manifest")
    assert main(["export-triton", str(bert_engine), "-o", str(repo)]) == 0
    config = (repo / "bert" / "config.pbtxt").read_text()
    _fails(["export-triton", str(bert_engine), "-o", str(repo), "--max-batch", "2"], capsys, "--force")
    assert (repo / "bert" / "config.pbtxt").read_text() == config, "existing model untouched"
    assert main(["export-triton", str(bert_engine), "-o", str(repo), "--max-batch", "2", "--force"]) == 0
    assert _parse(repo / "bert" / "config.pbtxt").max_batch_size == 2
    assert sorted(p.name for p in repo.iterdir()) == ["bert"], "no staging directories left behind"


def test_plugin_engines_refused(bert_engine: Path, tmp_path: Path, capsys) -> None:
    eng = tmp_path / "plug.engine"
    shutil.copy(bert_engine, eng)
    manifest = json.loads(Path(str(bert_engine) + ".json").read_text())
    manifest["plugins"] = [{"name": "FlashAttention", "namespace": "trtforge", "version": "1"}]
    Path(str(eng) + ".json").write_text(json.dumps(manifest))
    _fails(["export-triton", str(eng), "-o", str(tmp_path / "r")], capsys, "--attention native")
    assert not (tmp_path / "r").exists()


def test_names_with_quotes_are_escaped_and_unusable_names_refused(
    bert_engine: Path, tmp_path, capsys
) -> None:
    """Before: a quote in a name ended the pbtxt string (a broken config, or protobuf's ParseError as an
    internal error); a newline or a non-UTF-8 file name made a model directory Triton cannot name."""
    from trtforge.compiler.triton import pbtxt_string

    assert pbtxt_string('a"b\\c\nd\x01') == '"a\\"b\\\\c\\nd\\001"'
    assert main(["export-triton", str(bert_engine), "-o", str(tmp_path / "r"), "--name", 'say "hi"']) == 0
    assert _parse(tmp_path / "r" / 'say "hi"' / "config.pbtxt").name == 'say "hi"'
    _fails(
        ["export-triton", str(bert_engine), "-o", str(tmp_path), "--name", "a\nb"], capsys, "--name 'a\\nb'"
    )
    odd = tmp_path / (b"caf\xe9.engine").decode("utf-8", "surrogateescape")
    shutil.copy(bert_engine, odd)
    shutil.copy(Path(str(bert_engine) + ".json"), Path(str(odd) + ".json"))
    _fails(["export-triton", str(odd), "-o", str(tmp_path / "r")], capsys, "choose one with --name")
    assert main(["export-triton", str(odd), "-o", str(tmp_path / "r"), "--name", "cafe"]) == 0


def test_a_repository_that_cannot_be_created_is_a_user_error(bert_engine: Path, tmp_path, capsys) -> None:
    """Before: FileNotFoundError/NotADirectoryError from mkdir as an internal error."""
    (tmp_path / "file").write_text("x")
    _fails(
        ["export-triton", str(bert_engine), "-o", str(tmp_path / "file" / "repo")], capsys, "cannot create"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("swap", ["exchange", "renames"])
def test_a_signal_during_the_swap_waits_for_it(bert_engine: Path, tmp_path: Path, monkeypatch, swap) -> None:
    """--force over an existing model directory: a SIGTERM arriving as the old directory is moved aside (CI
    caught one left behind beside the model, or could find the model gone) is held until the new
    directory is in place and the old one removed, then raised; the same right after the exchange that
    swaps them where the filesystem has it (the old one then under the new one's staged name)."""
    from tests.test_directory_swap import require_exchange, two_renames_only
    from trtforge import _fileio
    from trtforge._fileio import temp_name
    from trtforge.compiler import triton

    repo = tmp_path / "repo"
    assert main(["export-triton", str(bert_engine), "-o", str(repo)]) == 0
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*"))
    aside: list[str] = []

    def stop(signum, frame):
        raise SystemExit(143)

    if swap == "exchange":
        require_exchange(tmp_path)
        real_exchange = _fileio._rename_exchange

        def exchange_then_signal(a, b):
            real_exchange(a, b)
            aside.append(str(a))
            signal.raise_signal(signal.SIGTERM)

        monkeypatch.setattr(_fileio, "_rename_exchange", exchange_then_signal)
    else:
        two_renames_only(monkeypatch)
        real_rename = os.rename

        def rename_then_signal(src, dst):
            real_rename(src, dst)
            if Path(dst) == temp_name(repo / "bert", "old"):
                aside.append(str(dst))
                signal.raise_signal(signal.SIGTERM)

        monkeypatch.setattr(os, "rename", rename_then_signal)
    old = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(SystemExit):
            triton.export_triton(bert_engine, repo, triton.TritonOptions(force=True))
    finally:
        signal.signal(signal.SIGTERM, old)
    assert aside, "the old directory was moved aside (the signal came)"
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == before
    assert (repo / "bert" / "1" / "model.plan").read_bytes() == bert_engine.read_bytes()


# Run export_triton in a child process that SIGKILLs itself at one step: after making the model's
# version directory "1" (while writing the new model), after moving the old model directory aside (on a
# filesystem without the exchange: two renames), or after the exchange that swaps old and new.
_KILLED_EXPORT = """
import errno, os, pathlib, signal, sys
from trtforge import _fileio
from trtforge.compiler import triton
engine, repo, where = sys.argv[1:]
if where == "writing":
    real_mkdir = pathlib.Path.mkdir
    def mkdir(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self.name == "1":
            os.kill(os.getpid(), signal.SIGKILL)
    pathlib.Path.mkdir = mkdir
elif where == "exchanging":
    real_exchange = _fileio._rename_exchange
    def exchange(a, b):
        real_exchange(a, b)
        os.kill(os.getpid(), signal.SIGKILL)
    _fileio._rename_exchange = exchange
else:
    def no_exchange(a, b):
        raise OSError(errno.EINVAL, "Invalid argument", str(a))
    _fileio._rename_exchange = no_exchange
    real_rename = os.rename
    def rename(src, dst):
        real_rename(src, dst)
        if str(dst).endswith(".old"):
            os.kill(os.getpid(), signal.SIGKILL)
    os.rename = rename
triton.export_triton(engine, repo, triton.TritonOptions(force=True, max_batch=2))
"""


def _killed_export(engine: Path, repo: Path, where: str) -> None:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    argv = [sys.executable, "-c", _KILLED_EXPORT, str(engine), str(repo), where]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_what_a_killed_export_leaves_the_next_one_repairs(bert_engine: Path, tmp_path: Path, capsys) -> None:
    """Before: export-triton staged in a directory of its own (repo/.trtforge-export.*) that a SIGKILL while
    writing the model left in the repository for good, beside the models Triton polls. It now stages with
    _fileio.staged_directory: the next export removes what a killed one was writing, and puts back a model
    directory a kill between the two renames left aside (so an export without --force still refuses it):
    the swap of a filesystem without the exchange."""
    repo = tmp_path / "repo"
    assert main(["export-triton", str(bert_engine), "-o", str(repo)]) == 0
    config = (repo / "bert" / "config.pbtxt").read_text()
    _killed_export(bert_engine, repo, "writing")
    assert (repo / "bert" / "config.pbtxt").read_text() == config, "the model as it was"
    assert len(list(repo.iterdir())) == 2, "what the killed export was writing"
    assert main(["export-triton", str(bert_engine), "-o", str(repo), "--force", "--max-batch", "4"]) == 0
    assert sorted(p.name for p in repo.iterdir()) == ["bert"]
    assert _parse(repo / "bert" / "config.pbtxt").max_batch_size == 4
    config = (repo / "bert" / "config.pbtxt").read_text()
    _killed_export(bert_engine, repo, "swapping")
    assert not (repo / "bert").exists(), "killed between the renames: the model directory is aside"
    _fails(["export-triton", str(bert_engine), "-o", str(repo)], capsys, "already exists; pass --force")
    assert sorted(p.name for p in repo.iterdir()) == ["bert"]
    assert (repo / "bert" / "config.pbtxt").read_text() == config


def test_an_export_killed_right_after_its_exchange_leaves_the_new_model_whole(
    bert_engine: Path, tmp_path: Path, capsys
) -> None:
    """Before: `export-triton --force` killed between its two renames left the model directory missing
    (Triton, polling, unloaded the model) until the next export put the old one back. Where the
    filesystem has the exchange, old and new swap in one step: a kill right after it leaves the new
    model directory in place, whole, and the old one under the staged name, which the next export
    removes."""
    from tests.test_directory_swap import require_exchange

    require_exchange(tmp_path)
    repo = tmp_path / "repo"
    assert main(["export-triton", str(bert_engine), "-o", str(repo), "--max-batch", "4"]) == 0
    _killed_export(bert_engine, repo, "exchanging")
    assert _parse(repo / "bert" / "config.pbtxt").max_batch_size == 2, "the new model, whole"
    assert len(list(repo.iterdir())) == 2, "the old model under the new one's staged name"
    _fails(["export-triton", str(bert_engine), "-o", str(repo)], capsys, "already exists; pass --force")
    assert sorted(p.name for p in repo.iterdir()) == ["bert"]
    assert _parse(repo / "bert" / "config.pbtxt").max_batch_size == 2


@pytest.mark.parametrize("swap", ["exchange", "renames"])
def test_two_exports_into_one_repository_take_turns(
    bert_engine: Path, tmp_path: Path, monkeypatch, swap
) -> None:
    """Two `export-triton --force` of one model at once: the second one's swap landed between the first
    one's two renames, whose second then failed (ENOTEMPTY, an internal error) and left the old model
    directory behind (then repo/.trtforge-replaced.*). The staged swap now takes the repository's lock,
    for the two renames (a filesystem without the exchange) and for the exchange and the old one's
    removal after it."""
    import os

    from tests.test_concurrent_outputs import _Pause, _race
    from tests.test_directory_swap import require_exchange, two_renames_only
    from trtforge import _fileio
    from trtforge.compiler import triton

    repo = tmp_path / "repo"
    assert main(["export-triton", str(bert_engine), "-o", str(repo)]) == 0
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*"))
    pause = _Pause()
    if swap == "exchange":
        require_exchange(tmp_path)
        real_exchange = _fileio._rename_exchange

        def exchange(a, b):
            real_exchange(a, b)
            pause.here()  # the new directory in, the old one not yet removed

        monkeypatch.setattr(_fileio, "_rename_exchange", exchange)
    else:
        two_renames_only(monkeypatch)
        real_rename = os.rename

        def rename(src, dst):
            real_rename(src, dst)
            if str(dst).endswith(".old"):  # the old directory moved aside, the new one not yet in
                pause.here()

        monkeypatch.setattr(os, "rename", rename)

    def export() -> None:
        triton.export_triton(bert_engine, repo, triton.TritonOptions(force=True))

    _race(pause, export, export)
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == before
    assert (repo / "bert" / "1" / "model.plan").read_bytes() == bert_engine.read_bytes()


@pytest.fixture(scope="module")
def vector_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An engine whose input and outputs are only the batch dimension: x [N] float -> y [N] float, z [N]
    bool (a per-sample score and flag, as a classifier's label output is)."""
    import onnx
    from onnx import TensorProto, helper

    import trtforge

    d = tmp_path_factory.mktemp("vector")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("Greater", ["y", "x"], ["z"])],
        "vector",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"]),
            helper.make_tensor_value_info("z", TensorProto.BOOL, ["N"]),
        ],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), d / "vec.onnx")
    out = d / "vec.engine"
    trtforge.compile(str(d / "vec.onnx"), output=out, shapes=["x:1:4:8"], progress=False)
    return out


def test_batch_only_tensors_get_dims_triton_accepts(vector_engine: Path, tmp_path: Path) -> None:
    """Before: a tensor that is only the batch dimension got `dims: [ ]`, which Triton refuses at load
    ("must specify 'dims'"); its documented form is dims [1] with an empty reshape."""
    assert main(["export-triton", str(vector_engine), "-o", str(tmp_path)]) == 0
    cfg = _parse(tmp_path / "vec" / "config.pbtxt")
    assert cfg.max_batch_size == 8
    for t in [*cfg.input, *cfg.output]:
        assert list(t.dims) == [1] and t.HasField("reshape") and list(t.reshape.shape) == [], t
    assert [mc.DataType.Name(t.data_type) for t in cfg.output] == ["TYPE_FP32", "TYPE_BOOL"]
    argv = ["export-triton", str(vector_engine), "-o", str(tmp_path), "--name", "nb", "--max-batch", "0"]
    assert main(argv) == 0
    cfg = _parse(tmp_path / "nb" / "config.pbtxt")
    assert all(list(t.dims) == [-1] and not t.HasField("reshape") for t in [*cfg.input, *cfg.output])


@pytest.mark.parametrize(("shape", "expected"), [([], "is a scalar"), ([-1, 0], "zero-size")])
def test_tensors_triton_cannot_describe_are_refused(
    vector_engine: Path, tmp_path: Path, capsys, shape: list[int], expected: str
) -> None:
    """Before: a scalar output of a non-batching engine got `dims: [ ]` and a zero-size dimension `0`,
    both configs Triton refuses at load; the export said it validated them."""
    eng = tmp_path / "odd.engine"
    shutil.copy(vector_engine, eng)
    manifest = json.loads(Path(str(vector_engine) + ".json").read_text())
    manifest["outputs"][0]["shape"] = shape
    Path(str(eng) + ".json").write_text(json.dumps(manifest))
    _fails(["export-triton", str(eng), "-o", str(tmp_path / "r")], capsys, expected)
    assert not (tmp_path / "r").exists()


def test_default_name_is_the_stem(bert_engine: Path, tmp_path: Path) -> None:
    """Before: the default name was the file name up to its first dot (--help says the stem), so
    bert.fp16.engine and bert.int8.engine were both 'bert': the second export was refused, and with
    --force it replaced the first model."""
    repo = tmp_path / "repo"
    for variant in ("fp16", "int8"):
        eng = tmp_path / f"bert.{variant}.engine"
        shutil.copy(bert_engine, eng)
        shutil.copy(Path(str(bert_engine) + ".json"), Path(str(eng) + ".json"))
        assert main(["export-triton", str(eng), "-o", str(repo), "--force"]) == 0
    assert sorted(p.name for p in repo.iterdir()) == ["bert.fp16", "bert.int8"]
    assert _parse(repo / "bert.int8" / "config.pbtxt").name == "bert.int8"


def test_a_missing_engine_is_named_missing(tmp_path: Path, capsys) -> None:
    """Before: an engine path that does not exist was said to have no manifest, with advice to rebuild or
    keep the .engine.json beside it: a typo in the path read as a missing manifest."""
    _fails(
        ["export-triton", str(tmp_path / "typo.engine"), "-o", str(tmp_path / "r")],
        capsys,
        "typo.engine' does not exist (nor its manifest",
    )
    assert not (tmp_path / "r").exists()


def test_a_version_is_added_beside_the_others(bert_engine: Path, tmp_path: Path, capsys) -> None:
    """Before: there was no --version: every export wrote version 1, and the only way to put a new engine
    in an existing model was --force, which deleted the model's other versions with it."""
    repo = tmp_path / "repo"
    assert main(["export-triton", str(bert_engine), "-o", str(repo)]) == 0
    config = (repo / "bert" / "config.pbtxt").read_bytes()
    capsys.readouterr()
    assert main(["export-triton", str(bert_engine), "-o", str(repo), "--version", "2"]) == 0
    assert "wrote version 2 into" in capsys.readouterr().out
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == [
        "bert",
        "bert/1",
        "bert/1/model.plan",
        "bert/2",
        "bert/2/model.plan",
        "bert/config.pbtxt",
    ]
    assert (repo / "bert" / "2" / "model.plan").read_bytes() == bert_engine.read_bytes()
    assert (repo / "bert" / "config.pbtxt").read_bytes() == config
    # --force replaces the model directory whole, as --help says: only the version written is left
    assert main(["export-triton", str(bert_engine), "-o", str(repo), "--version", "7", "--force"]) == 0
    assert sorted(p.name for p in (repo / "bert").iterdir()) == ["7", "config.pbtxt"]


def test_a_model_made_meanwhile_is_not_replaced_without_force(
    bert_engine: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Before: the model directory was looked for before the model was written and never again, so a
    model another export (or a person) put there meanwhile was replaced without --force, and both exports
    said they wrote it. The swap now refuses, under the repository's lock, a directory there by then."""
    from trtforge.compiler import triton

    repo = tmp_path / "repo"
    real = triton.write_synced

    def write_then_race(path: Path, data: bytes) -> None:
        real(path, data)
        if path.name == "config.pbtxt":  # the new model staged: another one appears at its place
            (repo / "bert" / "9").mkdir(parents=True)
            (repo / "bert" / "9" / "model.plan").write_bytes(b"theirs")

    monkeypatch.setattr(triton, "write_synced", write_then_race)
    assert main(["export-triton", str(bert_engine), "-o", str(repo)]) == 2
    assert "error: model directory" in capsys.readouterr().err
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == [
        "bert",
        "bert/9",
        "bert/9/model.plan",
    ]


def test_a_failed_export_removes_the_repository_it_made(bert_engine: Path, tmp_path: Path, monkeypatch):
    """Before: a failed write (a full disk) left the repository directories the export had created,
    empty, behind; the export now leaves the filesystem as it found it."""
    import errno

    from trtforge.compiler import triton

    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(triton, "write_synced", full)
    assert main(["export-triton", str(bert_engine), "-o", str(tmp_path / "a" / "repo")]) == 2
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    assert main(["export-triton", str(bert_engine), "-o", str(tmp_path / "kept")]) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []


def test_an_interrupted_version_add_leaves_the_model_as_it_was(
    bert_engine: Path, tmp_path: Path, monkeypatch
) -> None:
    """SIGTERM while `--version 2` writes its model.plan into an existing model: the model directory keeps
    its version 1 and config.pbtxt, with no version 2 and nothing staged beside them."""
    from trtforge.compiler import triton

    repo = tmp_path / "repo"
    assert main(["export-triton", str(bert_engine), "-o", str(repo)]) == 0
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*"))
    real = triton.write_synced

    def write_then_signal(path: Path, data: bytes) -> None:
        real(path, data)
        signal.raise_signal(signal.SIGTERM)

    def stop(signum, frame):
        raise SystemExit(143)

    monkeypatch.setattr(triton, "write_synced", write_then_signal)
    old = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(SystemExit):
            triton.export_triton(bert_engine, repo, triton.TritonOptions(version=2))
    finally:
        signal.signal(signal.SIGTERM, old)
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == before


def test_every_manifest_dtype_is_mapped_to_a_triton_type_or_refused() -> None:
    """Each dtype an engine's manifest can hold (BF16, FP8, INT8, bool, int64, ...) becomes a DataType that
    Triton's ModelConfig has, or a one-paragraph refusal naming the tensor and the types Triton serves."""
    from trtforge.compiler.triton import TRITON_DTYPES, _check_servable
    from trtforge.core.backend import MANIFEST_DTYPES
    from trtforge.core.tensor_spec import TensorSpec
    from trtforge.errors import UserError

    assert {"bfloat16", "int8", "bool", "int64", "float16", "float32"} <= set(TRITON_DTYPES)
    for dtype in sorted(MANIFEST_DTYPES):
        spec = TensorSpec(name="t", dtype=dtype, shape=[-1, 4])
        if dtype in TRITON_DTYPES:
            assert mc.DataType.Value(TRITON_DTYPES[dtype]) != mc.DataType.Value("TYPE_INVALID")
            _check_servable("input", spec, batched=True)
        else:
            with pytest.raises(UserError, match=rf"input 't' has dtype {dtype}, .* \(it serves bfloat16,"):
                _check_servable("input", spec, batched=True)


def test_a_profile_batch_past_int32_is_served_at_triton_s_largest(tmp_path: Path) -> None:
    """Before: an engine whose profiles allow batches of 2**31 or more got that as its max_batch_size, out of
    the int32 Triton reads: protobuf's ParseError (an internal error), or with --no-validate a config
    Triton refuses. The default is now the largest batch Triton can be told, 2**31 - 1."""
    from tests.cli.test_encoder_hostile_inputs import _engine

    eng = _engine(tmp_path)
    manifest = json.loads(Path(str(eng) + ".json").read_text())
    manifest["profiles"][0]["x"]["max"][0] = 2**32
    Path(str(eng) + ".json").write_text(json.dumps(manifest))
    assert main(["export-triton", str(eng), "-o", str(tmp_path / "repo")]) == 0
    assert _parse(tmp_path / "repo" / "m" / "config.pbtxt").max_batch_size == 2**31 - 1


def test_instances_of_a_static_engine_are_one_group(tmp_path: Path) -> None:
    """Before: a static-shape engine got one instance group per instance, so --instances 10**9 ran a loop
    of a billion groups (memory and time without end) for a config Triton reads as one group of that
    count. It is one group now, `count: N`."""
    from tests.cli.test_encoder_hostile_inputs import _engine

    eng = _engine(tmp_path)
    manifest = json.loads(Path(str(eng) + ".json").read_text())
    for t in [*manifest["inputs"], *manifest["outputs"]]:
        t["shape"][0] = 4
    manifest["profiles"] = []
    Path(str(eng) + ".json").write_text(json.dumps(manifest))
    argv = ["export-triton", str(eng), "-o", str(tmp_path / "repo"), "--instances", "5"]
    assert main(argv) == 0
    cfg = _parse(tmp_path / "repo" / "m" / "config.pbtxt")
    assert cfg.max_batch_size == 0 and [(g.count, list(g.profile)) for g in cfg.instance_group] == [(5, [])]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"max_batch": -1}, r"--max-batch -1: expected a whole number >= 0"),
        ({"max_batch": True}, r"--max-batch True: expected a whole number >= 0"),
        ({"preferred_batch_sizes": [2.5]}, r"--preferred-batch-size \[2\.5\]: expected whole numbers"),
    ],
)
def test_api_options_of_the_wrong_kind_are_user_errors(tmp_path: Path, options: dict, expected: str) -> None:
    """Before: export_triton(max_batch=-1) wrote `max_batch_size: -1` (Triton refuses the model) and said
    it validated it; max_batch=True and a preferred batch size of 2.5 were protobuf's ParseError."""
    from tests.cli.test_encoder_hostile_inputs import _engine
    from trtforge.compiler import triton
    from trtforge.errors import UserError

    eng = _engine(tmp_path)
    with pytest.raises(UserError, match=expected):
        triton.export_triton(eng, tmp_path / "repo", triton.TritonOptions(**options))
    assert not (tmp_path / "repo").exists()


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 16 KiB tmpfs at tmp_path/mnt (root only; skipped elsewhere), unmounted afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_read_only_or_full_repository_is_a_user_error(tmp_path: Path, small_tmpfs: Path, capsys) -> None:
    """A repository on a read-only or full filesystem: exit 2 naming the path, and the filesystem as it was
    (on a full one, the repository directory the export created is removed again)."""
    from tests.cli.test_encoder_hostile_inputs import _engine

    eng = _engine(tmp_path / "e")
    (small_tmpfs / "repo").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    _fails(["export-triton", str(eng), "-o", str(small_tmpfs / "repo")], capsys, "Read-only file system")
    _fails(["export-triton", str(eng), "-o", str(small_tmpfs / "new")], capsys, "cannot create the model")
    subprocess.run(["mount", "-o", "remount,rw", str(small_tmpfs)], check=True)
    assert [p.name for p in small_tmpfs.iterdir()] == ["repo"] and not list((small_tmpfs / "repo").iterdir())
    (small_tmpfs / "filler").write_bytes(b"x" * 12288)
    _fails(["export-triton", str(eng), "-o", str(small_tmpfs / "new")], capsys, "No space left on device")
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler", "repo"]


def test_tensor_names_needing_escapes_round_trip(tmp_path: Path) -> None:
    """Tensor names with a quote, a backslash, a newline, a tab, DEL, non-ASCII letters, an emoji and
    U+2028 are written as protobuf text-format string literals that parse back (tritonclient's
    ModelConfig) to the very names the engine's manifest gives."""
    from tests.cli.test_encoder_hostile_inputs import _engine

    eng = _engine(tmp_path)
    manifest = json.loads(Path(str(eng) + ".json").read_text())
    names = ['in "q" \\ x\ny\tz\x7f', "é中😀\u2028s"]
    manifest["inputs"][0]["name"] = names[0]
    manifest["profiles"][0] = {names[0]: manifest["profiles"][0]["x"]}
    manifest["outputs"][1]["name"] = names[1]
    Path(str(eng) + ".json").write_text(json.dumps(manifest))
    assert main(["export-triton", str(eng), "-o", str(tmp_path / "repo")]) == 0
    cfg = _parse(tmp_path / "repo" / "m" / "config.pbtxt")
    assert [t.name for t in cfg.input] == [names[0]]
    assert [t.name for t in cfg.output] == ["y", names[1]]


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("paged", r"Serve it with `trtforge serve .*step\.engine --tokenizer DIR`"),
        ("slot", r"Serve the Hugging Face model directory with `trtforge serve DIR`.*--cache-layout paged`"),
    ],
)
def test_a_decoder_step_engine_is_refused_with_what_serves_it(
    tmp_path: Path, capsys, layout: str, expected: str
) -> None:
    """Before: a step engine (compile --generate) was exported like an encoder, max_batch_size 2 with the
    dynamic batcher on and its prefill and decode profiles in one instance group: a Triton model that
    runs single steps with nothing carrying the KV cache between them, so no generation. It is recognised
    by its manifest's generation section (as `inspect` does) and refused, naming `trtforge serve`."""
    import re

    from tests.cli.test_encoder_hostile_inputs import _engine

    eng = _engine(tmp_path, "step.engine")
    manifest = json.loads(Path(str(eng) + ".json").read_text())
    manifest["generation"] = {"cache": {"layout": layout}, "profiles": {"prefill": 0, "decode": 0}}
    Path(str(eng) + ".json").write_text(json.dumps(manifest))
    assert main(["export-triton", str(eng), "-o", str(tmp_path / "repo")]) == 2
    err = capsys.readouterr().err
    assert "is a decoder step engine" in err and re.search(expected, err), err
    assert not (tmp_path / "repo").exists()


def _axes_engine(d: Path, x: list, y: list, shape: str, perm: list[int] | None = None) -> Path:
    """d/m.engine from an ONNX graph y = 2 * x (transposed by `perm`), its axes named as `x` and `y` give
    them (str: a dynamic axis of that name; int: static), built with the profile `shape`."""
    import onnx
    from onnx import TensorProto, helper

    import trtforge

    nodes = [helper.make_node("Mul", ["x", "two"], ["t" if perm else "y"])]
    if perm:
        nodes.append(helper.make_node("Transpose", ["t"], ["y"], perm=perm))
    graph = helper.make_graph(
        nodes,
        "axes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    d.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), d / "m.onnx")
    trtforge.compile(str(d / "m.onnx"), output=d / "m.engine", shapes=[shape], progress=False)
    return d / "m.engine"


_NOT_BATCHES = {  # x's and y's axes, the profile, y's transpose, and the note's reason
    "batch-second": (
        (["seq", "batch", 4], ["seq", "batch", 4], "x:1x1x4:4x2x4:8x4x4", None),
        r"the batch is axis 1 of input 'x' \(named 'batch'\), not axis 0",
    ),
    "transposed-output": (
        (["batch", "seq"], ["seq", "batch"], "x:1x1:2x4:8x8", [1, 0]),
        r"axis 0 of input 'x' is 'batch', which is axis 1 of output 'y', not a batch axis",
    ),
    "static-first": (
        ([2, "N"], [2, "N"], "x:2x1:2x4:2x8", None),
        r"axis 0 of input 'x' is static \(2\), not a batch axis \(its dynamic axis is axis 1\)",
    ),
}


@pytest.mark.parametrize(("axes", "note"), list(_NOT_BATCHES.values()), ids=list(_NOT_BATCHES))
def test_an_engine_whose_axis_0_is_not_the_batch_is_not_batched(
    tmp_path: Path, capsys, axes: tuple, note: str
) -> None:
    """Before: an engine whose inputs are [seq, batch, ...] (or whose output is transposed to [seq, batch])
    got max_batch_size 8, the profiles' axis-0 maximum: Triton then split and joined requests along the
    sequence. compile now records each axis's ONNX name; export-triton writes max_batch_size 0 with a note
    saying why, and refuses --max-batch N, naming the tensor and axis, with nothing written."""
    eng = _axes_engine(tmp_path / "e", *axes)
    repo = tmp_path / "repo"
    assert main(["export-triton", str(eng), "-o", str(repo)]) == 0
    assert _parse(repo / "m" / "config.pbtxt").max_batch_size == 0
    err = capsys.readouterr().err
    assert re.search(r"note: max_batch_size 0, so Triton does not batch requests: " + note, err), err
    _fails(
        ["export-triton", str(eng), "-o", str(tmp_path / "r2"), "--max-batch", "4"],
        capsys,
        "--max-batch 4: Triton cannot batch this engine",
    )
    assert not (tmp_path / "r2").exists()


def test_an_axis_0_not_named_as_a_batch_is_batched_only_when_asked(tmp_path: Path, capsys) -> None:
    """An input [seq, 4] (axis 0 named 'seq' in the model) may still be a batch of rows, but nothing says
    so: the default is max_batch_size 0 with a note naming the axis; --max-batch N is taken as the user's
    word. An axis 0 named as a batch (batch_size, N) keeps the profiles' largest batch."""
    eng = _axes_engine(tmp_path / "seq", ["seq", 4], ["seq", 4], "x:1x4:4x4:8x4")
    assert main(["export-triton", str(eng), "-o", str(tmp_path / "r")]) == 0
    assert _parse(tmp_path / "r" / "m" / "config.pbtxt").max_batch_size == 0
    assert "axis 0 of input 'x' is named 'seq' in the model, not a batch; pass --max-batch N" in (
        capsys.readouterr().err
    )
    assert main(["export-triton", str(eng), "-o", str(tmp_path / "r2"), "--max-batch", "4"]) == 0
    assert _parse(tmp_path / "r2" / "m" / "config.pbtxt").max_batch_size == 4
    eng = _axes_engine(tmp_path / "bs", ["batch_size", 4], ["batch_size", 4], "x:1x4:4x4:8x4")
    assert main(["export-triton", str(eng), "-o", str(tmp_path / "r3")]) == 0
    assert _parse(tmp_path / "r3" / "m" / "config.pbtxt").max_batch_size == 8
    assert "note:" not in capsys.readouterr().err


def test_config_text_is_strict_text_format_for_any_name_dtype_and_dim(tmp_path: Path) -> None:
    """Red team of config.pbtxt: tensor names holding every ASCII control character, DEL, the text format's
    own punctuation, C1 controls, line and paragraph separators and a BOM; an int64 input, a bool output;
    dims past the int32 range. The text parses with tritonclient's ModelConfig to the manifest's very
    names, types and dims, and keeps to what Triton's C++ tokenizer takes: valid UTF-8, and no raw control
    character or DEL outside the line breaks between fields (a string literal never crosses a line)."""
    from tests.cli.test_encoder_hostile_inputs import _engine

    eng = _engine(tmp_path)
    manifest = json.loads(Path(str(eng) + ".json").read_text())
    nasty = "".join(map(chr, range(1, 32))) + '\x7f"\\#{}[]:<>,;' + "\x85\x9f\u2028\u2029\ufeff"
    names = [f"in {nasty}", f"out {nasty[::-1]}"]
    manifest["inputs"][0] |= {"name": names[0], "dtype": "int64"}
    manifest["profiles"][0] = {names[0]: manifest["profiles"][0]["x"]}
    manifest["outputs"][0] |= {"name": names[1], "dtype": "bool", "shape": [-1, 2**40]}
    Path(str(eng) + ".json").write_text(json.dumps(manifest))
    assert main(["export-triton", str(eng), "-o", str(tmp_path / "repo")]) == 0
    text = (tmp_path / "repo" / "m" / "config.pbtxt").read_bytes().decode("utf-8")
    assert not [c for c in text if (ord(c) < 0x20 and c != "\n") or c == "\x7f"]
    cfg = _parse(tmp_path / "repo" / "m" / "config.pbtxt")
    assert [t.name for t in cfg.input] == [names[0]] and mc.DataType.Name(
        cfg.input[0].data_type
    ) == "TYPE_INT64"
    out = cfg.output[0]
    assert (out.name, mc.DataType.Name(out.data_type), list(out.dims)) == (names[1], "TYPE_BOOL", [2**40])


@pytest.mark.parametrize(
    ("record", "max_batch", "note"),
    [
        (None, 32, ""),  # an engine built before compile recorded axis names: the profiles decide
        ({"inputs": [["batch", None]], "outputs": [["batch", None], ["batch"]]}, 32, ""),
        (
            {"inputs": [["tokens", None]]},
            0,
            "axis 0 of input 'x' is named 'tokens' in the model, not a batch",
        ),
        ({"outputs": [[None, "batch"], [None]]}, 0, "the batch is axis 1 of output 'y' (named 'batch'), not"),
        ({"inputs": [["batch", "rows"]], "outputs": [["rows", None], [None]]}, 0, "which is axis 1 of input"),
    ],
    ids=["unrecorded", "batch", "tokens", "batch-later", "name-later"],
)
def test_the_recorded_axis_names_decide_the_default_max_batch(
    tmp_path: Path, record: dict | None, max_batch: int, note: str
) -> None:
    """The stand-in engine x [B, 64] -> y [B, 64], s [B] (profiles up to 32) with the axis names its build
    record gives: max_batch_size and the note export_triton returns."""
    from tests.cli.test_encoder_hostile_inputs import _engine
    from trtforge.compiler import triton

    eng = _engine(tmp_path)
    manifest = json.loads(Path(str(eng) + ".json").read_text())
    if record is not None:
        manifest["records"]["build"] = {
            kind: [
                {"name": t["name"], "symbols": symbols}
                for t, symbols in zip(manifest[kind], record.get(kind, []), strict=False)
            ]
            for kind in ("inputs", "outputs")
        }
    Path(str(eng) + ".json").write_text(json.dumps(manifest))
    result = triton.export_triton(eng, tmp_path / "repo", triton.TritonOptions())
    assert result.max_batch_size == max_batch and note in result.note and bool(note) == bool(result.note)


_KILLED_ADDING_A_VERSION = """
import os, pathlib, signal, sys
from trtforge.compiler import triton
engine, repo = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
real_write = triton.write_synced
def write_synced(path, data):
    real_write(path, data)
    os.kill(os.getpid(), signal.SIGKILL)  # (the version's plan written into its staging directory)
triton.write_synced = write_synced
triton.export_triton(engine, repo, triton.TritonOptions(version=2))
"""


def test_a_killed_export_of_a_new_version_leaves_nothing_in_the_model_directory(
    bert_engine: Path, tmp_path: Path
) -> None:
    """`export-triton --version 2` killed by SIGKILL while writing left its staging directory (the whole
    plan) inside the model directory. Before, only an export of that same version (or --force of the
    model) removed it: `--version 3` after it left it there for good, beside the versions Triton serves.
    Now adding any version removes the dead writers' staging directories in the model directory."""
    repo = tmp_path / "repo"
    assert main(["export-triton", str(bert_engine), "-o", str(repo)]) == 0
    path = str(Path(__file__).resolve().parents[2])
    argv = [sys.executable, "-c", _KILLED_ADDING_A_VERSION, str(bert_engine), str(repo)]
    proc = subprocess.run(argv, env=dict(os.environ, PYTHONPATH=path), capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(os.listdir(repo / "bert")) == 3, "the killed export's staging directory"
    assert main(["export-triton", str(bert_engine), "-o", str(repo), "--version", "3"]) == 0
    assert sorted(os.listdir(repo / "bert")) == ["1", "3", "config.pbtxt"]
