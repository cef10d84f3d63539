"""A corpus of bad inputs to the CLI (issue #15): each exits 2 with one clear message, no traceback, and
leaves nothing behind (no output, no staged file, no work directory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.models import tiny_onnx, tiny_onnx_external
from trtforge.cli.main import main

Setup = Callable[[Path], list[str]]

FACTORY_HEAD = """
import torch

class Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x)
"""


def _module(d: Path, name: str, body: str) -> str:
    (d / f"{name}.py").write_text(body)
    return name


def _factory(body: str) -> Setup:
    def setup(d: Path) -> list[str]:
        name = _module(d, f"um_{abs(hash(body)) % 10**8}", FACTORY_HEAD + body)
        return ["compile", f"{name}:make", "-o", "out.engine"]

    return setup


def _report_factory(body: str) -> Setup:
    def setup(d: Path) -> list[str]:
        argv = _factory(body)(d)
        return ["report", argv[1], "-o", "rep", "--targets", "torch,ort", "--no-progress"]

    return setup


def _embedding_onnx(d: Path) -> Path:
    """input_ids[B,S] -> Gather(E[16,32]) -> MatMul(W[32,32]): a vocabulary of 16 token ids."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    e = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "E")
    w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "W")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["E", "input_ids"], ["h"]),
            helper.make_node("MatMul", ["h", "W"], ["y"]),
        ],
        "emb",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])],
        [e, w],
    )
    path = d / "emb.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _calib(fn_body: str) -> Setup:
    def setup(d: Path) -> list[str]:
        name = _module(d, f"cal_{abs(hash(fn_body)) % 10**8}", fn_body)
        model = _embedding_onnx(d)
        return [
            "compile",
            str(model),
            "-o",
            "out.engine",
            "--precision",
            "int8",
            "--calib-data",
            f"{name}:data",
        ]

    return setup


def _oov_calibration(token: int = 99) -> Setup:
    """compile --precision int8 of the 16-token embedding model, calibrated on ids all `token`."""

    def setup(d: Path) -> list[str]:
        np.savez(d / "oov.npz", input_ids=np.full((4, 5), token, dtype=np.int64))
        return [
            "compile",
            str(_embedding_onnx(d)),
            "-o",
            "out.engine",
            "--precision",
            "int8",
            "--calib-data",
            "oov.npz",
        ]

    return setup


def _manifest_file(content: bytes) -> Setup:
    def setup(d: Path) -> list[str]:
        (d / "m.engine").write_bytes(b"engine bytes")
        (d / "m.engine.json").write_bytes(content)
        return ["inspect", "m.engine"]

    return setup


def _external_data_missing(command: str) -> Setup:
    def setup(d: Path) -> list[str]:
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        w = numpy_helper.from_array(np.ones((64, 64), np.float32), "W")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "W"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
            [w],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.save(
            model, str(d / "ext.onnx"), save_as_external_data=True, location="ext.bin", size_threshold=0
        )
        (d / "ext.bin").unlink()
        return [command, "ext.onnx", "-o", "out.onnx" if command == "optimize" else "out.engine"]

    return setup


def _tiny(*argv: str) -> Setup:
    def setup(d: Path) -> list[str]:
        tiny_onnx(d / "m.onnx")
        return [a.replace("LONG", "e" * 300) for a in argv]

    return setup


def _dir_named_onnx(d: Path) -> list[str]:
    (d / "x.onnx").mkdir()
    return ["compile", "x.onnx", "-o", "out.engine"]


def _not_an_archive(d: Path) -> list[str]:
    (d / "bad.pt2").write_bytes(b"PK\x03\x04 not really a zip archive")
    return ["compile", "bad.pt2", "-o", "out.engine"]


def _report_data(arrays: dict[str, np.ndarray]) -> Setup:
    def setup(d: Path) -> list[str]:
        np.savez(d / "data.npz", **arrays)
        model = _embedding_onnx(d)
        return ["report", str(model), "-o", "rep", "--targets", "ort", "--data", "data.npz", "--no-progress"]

    return setup


def _tampered_engine(d: Path) -> list[str]:
    from trtforge._fileio import sha256_bytes
    from trtforge.core.manifest import publish_engine
    from trtforge.runtime.standin import standin_manifest

    data = b"engine bytes" * 20
    m = standin_manifest()
    m.engine_file, m.engine_bytes, m.engine_sha256 = "m.engine", len(data), sha256_bytes(data)
    publish_engine(d / "m.engine", data, m)
    (d / "m.engine").write_bytes(data[:-1] + b"!")
    return ["report", "m.engine", "-o", "rep", "--no-progress"]


def _garbage_data(name: str) -> Setup:
    def setup(d: Path) -> list[str]:
        (d / name).write_bytes(b"PK\x03\x04 garbage, not numpy")
        return [
            "compile",
            str(_embedding_onnx(d)),
            "-o",
            "o.engine",
            "--precision",
            "int8",
            "--calib-data",
            name,
        ]

    return setup


def _fifo(d: Path) -> list[str]:
    os.mkfifo(d / "pipe.onnx")
    return ["compile", "pipe.onnx", "-o", "o.engine"]


def _graph_onnx(name: str, nodes, inputs, outputs, *, opset: int = 17, command: str = "compile") -> Setup:
    """An ONNX file built from helper.make_* pieces (no checker run: hostile graphs are the point)."""

    def setup(d: Path) -> list[str]:
        import onnx
        from onnx import helper

        graph = helper.make_graph(nodes(), name, inputs(), outputs())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        onnx.save(model, str(d / f"{name}.onnx"))
        out = "out.onnx" if command == "optimize" else "out.engine"
        return [command, f"{name}.onnx", "-o", out]

    return setup


def _vi(name: str, elem: str, dims: list) -> object:
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, getattr(TensorProto, elem), dims)


def _relu(src: str = "x", dst: str = "y") -> Callable[[], list]:
    from onnx import helper

    return lambda: [helper.make_node("Relu", [src], [dst])]


def _empty_file(command: str) -> Setup:
    def setup(d: Path) -> list[str]:
        (d / "empty.onnx").write_bytes(b"")
        return [command, "empty.onnx", "-o", "out.onnx" if command == "optimize" else "out.engine"]

    return setup


def _overwrite_input(*argv: str) -> Setup:
    def setup(d: Path) -> list[str]:
        tiny_onnx_external(d, "w.bin")
        np.savez(d / "c.npz", x=np.ones((4, 4), np.float32))
        return [*argv, "--force"]

    return setup


def _save_onnx_data_is_the_models() -> Setup:
    """The model's weights in s.onnx.data, the file --save-onnx s.onnx would write a large model's into."""

    def setup(d: Path) -> list[str]:
        tiny_onnx_external(d, "s.onnx.data")
        return ["compile", "m.onnx", "-o", "m.engine", "--save-onnx", "s.onnx", "--force"]

    return setup


def _onnx_data_exists(*argv: str) -> Setup:
    """The tiny model, and an existing out.onnx.data beside an output out.onnx that is not there yet (where
    a large model's weights would go)."""

    def setup(d: Path) -> list[str]:
        tiny_onnx(d / "m.onnx")
        (d / "out.onnx.data").write_bytes(b"someone's weights")
        return list(argv)

    return setup


def _unknown_dtype_engine(command: str) -> Setup:
    """A consistent engine + manifest pair whose manifest gives input 0 a dtype no tool knows."""

    def setup(d: Path) -> list[str]:
        from trtforge._fileio import sha256_bytes
        from trtforge.core.manifest import publish_engine
        from trtforge.runtime.standin import standin_manifest

        data = b"engine bytes" * 20
        m = standin_manifest()
        m.engine_file, m.engine_bytes, m.engine_sha256 = "m.engine", len(data), sha256_bytes(data)
        publish_engine(d / "m.engine", data, m)
        path = d / "m.engine.json"
        path.write_text(path.read_text().replace(f'"dtype": "{m.inputs[0].dtype}"', '"dtype": "quux"', 1))
        if command == "report":
            return ["report", "m.engine", "-o", "rep", "--no-progress"]
        return [command, "m.engine"]

    return setup


def _checkpoint(command: str) -> Setup:
    def setup(d: Path) -> list[str]:
        import torch

        torch.save(torch.nn.Linear(2, 2).state_dict(), d / "weights.pth")
        return [command, "weights.pth", "-o", "rep" if command == "report" else "out.engine"]

    return setup


def _gzipped_onnx(d: Path) -> list[str]:
    import gzip

    (d / "m.onnx").write_bytes(gzip.compress(tiny_onnx(d / "t.onnx").read_bytes()))
    (d / "t.onnx").unlink()
    return ["compile", "m.onnx", "-o", "out.engine"]


NON_UTF8 = os.fsdecode(b"caf\xe9")

CASES: dict[str, tuple[Setup, str]] = {
    "factory forward fails on its example inputs": (
        _factory(
            "def make():\n    class Bad(Lin):\n        def forward(self, x):\n"
            "            raise RuntimeError('boom')\n    return Bad(), (torch.zeros(2, 4),)\n"
        ),
        r"forward\(x=\(2, 4\)\) on its own example inputs raised RuntimeError: boom",
    ),
    "factory example inputs name the wrong argument": (
        _factory("def make():\n    return Lin(), {'y': torch.zeros(2, 4)}\n"),
        r"Lin\.forward\(y=\(2, 4\)\) on its own example inputs raised TypeError",
    ),
    "report: factory forward fails on its example inputs": (
        _report_factory(
            "def make():\n    class Bad(Lin):\n        def forward(self, x):\n"
            "            raise RuntimeError('boom')\n    return Bad(), (torch.zeros(2, 4),)\n"
        ),
        r"forward\(x=\(2, 4\)\) on its own example inputs raised RuntimeError: boom",
    ),
    "--opset out of range": (
        lambda d: [*_factory("def make():\n    return Lin(), (torch.zeros(2, 4),)\n")(d), "--opset", "999"],
        r"--opset 999 is out of range",
    ),
    "factory raises": (
        _factory("def make():\n    raise ValueError('no weights here')\n"),
        r"factory 'um_\d+:make' raised ValueError: no weights here",
    ),
    "factory returns the wrong type": (
        _factory("def make():\n    return Lin()\n"),
        r"must return \(nn\.Module, example_inputs\)",
    ),
    "syntax error in the user's module": (
        lambda d: ["compile", _module(d, "um_syntax", "def f(:\n") + ":make", "-o", "out.engine"],
        r"importing module 'um_syntax' .* raised SyntaxError",
    ),
    "user's module raises at import": (
        lambda d: ["compile", _module(d, "um_imp", "raise KeyError(1)\n") + ":make", "-o", "out.engine"],
        r"importing module 'um_imp' .* raised KeyError",
    ),
    "compile ':'": (lambda d: ["compile", ":", "-o", "out.engine"], "not a 'package.module:name' reference"),
    "unknown module": (lambda d: ["compile", "no_such_mod:make", "-o", "out.engine"], "no module named"),
    "out-of-vocabulary token ids in calibration data": (
        _oov_calibration(),
        r"calibration data oov\.npz: input 'input_ids' holds the id 99, but it indexes a table of 16 rows "
        r"\(ids 0\.\.15\)",
    ),
    "negative token ids in calibration data (ORT's Gather counts them from the end)": (
        _oov_calibration(-3),
        r"calibration data oov\.npz: input 'input_ids' holds the id -3, but it indexes a table of 16 rows",
    ),
    "calibration function raises": (
        _calib("def data():\n    raise ValueError('calib boom')\n"),
        r"calibration data function 'cal_\d+:data' raised ValueError: calib boom",
    ),
    "calibration function returns the wrong type": (
        _calib("def data():\n    return 42\n"),
        r"returned int; expected an iterable",
    ),
    "calibration generator raises while iterated": (
        _calib("def data():\n    yield {'input_ids': [[1, 2]]}\n    raise OSError('disk gone')\n"),
        r"while iterating its result\) raised OSError: disk gone",
    ),
    "manifest name over the filesystem limit": (
        _tiny("compile", "m.onnx", "-o", "e" * 252),
        r"output manifest '.*e{252}\.json': the file name is 257 bytes long; this filesystem allows 255",
    ),
    "engine name over the filesystem limit": (
        _tiny("compile", "m.onnx", "-o", "LONG"),
        r"the file name is 300 bytes long",
    ),
    "binary manifest": (_manifest_file(b"\xff\xfe\x00binary"), "is not valid JSON"),
    "non-object manifest": (_manifest_file(b"[1, 2, 3]"), "expected a JSON object, found a JSON list"),
    "overflowing --shape dimension": (
        _tiny("compile", "m.onnx", "-o", "out.engine", "--shape", "x:1x4:2x4:99999999999999999999x4"),
        "dimension 99999999999999999999 in .* is above the limit",
    ),
    "non-UTF-8 model path": (
        lambda d: ["compile", f"{NON_UTF8}.onnx", "-o", "out.engine"],
        r"model file 'caf\\xe9\.onnx' holds bytes that are not valid UTF-8",
    ),
    "non-UTF-8 output directory": (
        _tiny("compile", "m.onnx", "-o", f"{NON_UTF8}/out.engine"),
        r"directory 'caf\\xe9' does not exist",
    ),
    "optimize: external data missing": (_external_data_missing("optimize"), "ext.bin"),
    "compile: external data missing": (_external_data_missing("compile"), "ext.bin"),
    ".pt2 that is not an archive": (_not_an_archive, "is not a torch.export archive"),
    "-o names a new directory": (_tiny("compile", "m.onnx", "-o", "newdir/"), "ends with '/'"),
    "-o ''": (_tiny("compile", "m.onnx", "-o", ""), "the path is empty"),
    "report -o ''": (_tiny("report", "m.onnx", "-o", ""), "the path is empty"),
    "inspect ''": (lambda d: ["inspect", ""], "the path is empty"),
    "--save-onnx equal to -o": (
        _tiny("compile", "m.onnx", "-o", "out.engine", "--save-onnx", "out.engine"),
        r"--save-onnx and -o \(engine\) name the same file",
    ),
    "--save-onnx equal to the manifest": (
        _tiny("compile", "m.onnx", "-o", "out.engine", "--save-onnx", "./out.engine.json"),
        "name the same file",
    ),
    "--calib-cache equal to -o": (
        _tiny("compile", "m.onnx", "-o", "out.engine", "--precision", "int8", "--calib-cache", "out.engine"),
        r"--calib-cache and -o \(engine\) name the same file",
    ),
    "a directory named x.onnx": (_dir_named_onnx, r"'x\.onnx' is a directory; expected a file"),
    "report: wrong-named --data": (
        _report_data({"ids": np.ones((2, 5), np.int64)}),
        "--data 'data.npz' does not fit the model",
    ),
    "report: wrong-shaped --data": (
        _report_data({"input_ids": np.ones((2, 5, 3), np.int64)}),
        "--data 'data.npz' does not fit the model",
    ),
    "report: tampered engine": (_tampered_engine, "does not match its manifest"),
    "unreadable .npy calibration data": (_garbage_data("g.npy"), r"'g\.npy' is not a readable \.npy file"),
    "unreadable .npz calibration data": (_garbage_data("g.npz"), r"'g\.npz' is not a readable \.npz file"),
    "overflowing --workspace": (
        _tiny("compile", "m.onnx", "-o", "o.engine", "--workspace", "9" * 15),
        "--workspace",
    ),
    "overflowing --aux-streams": (
        _tiny("compile", "m.onnx", "-o", "o.engine", "--aux-streams", "9" * 12),
        "--aux-streams must be",
    ),
    "huge --streams": (
        _tiny("compile", "m.onnx", "-o", "o.engine", "--streams", "9" * 11),
        r"--streams.*not in the range 1<=x<=32",
    ),
    "a pipe as the model": (_fifo, "is not a regular file"),
    "compile: empty ONNX file": (_empty_file("compile"), r"ONNX model 'empty\.onnx' is empty \(0 bytes\)"),
    "optimize: empty ONNX file": (_empty_file("optimize"), r"ONNX model 'empty\.onnx' is empty \(0 bytes\)"),
    "ONNX graph without outputs": (
        _graph_onnx("noout", _relu(), lambda: [_vi("x", "FLOAT", [2, 4])], list, command="optimize"),
        r"'noout\.onnx' declares no graph outputs",
    ),
    "ONNX opset newer than onnx knows": (
        _graph_onnx(
            "op99",
            _relu(),
            lambda: [_vi("x", "FLOAT", [2, 4])],
            lambda: [_vi("y", "FLOAT", [2, 4])],
            opset=99,
        ),
        r"'op99\.onnx' imports ONNX opset 99; the installed onnx .* knows opsets up to \d+",
    ),
    "optimize: two nodes write one tensor": (
        _graph_onnx(
            "twice",
            lambda: [*_relu()(), *_relu()()],
            lambda: [_vi("x", "FLOAT", [2, 4])],
            lambda: [_vi("y", "FLOAT", [2, 4])],
            command="optimize",
        ),
        r"ONNX model 'twice\.onnx' fails ONNX checking: .*'y' has been used as output names multiple times",
    ),
    "huge declared input dims": (
        _graph_onnx(
            "huge",
            _relu(),
            lambda: [_vi("x", "FLOAT", [10**5] * 3)],
            lambda: [_vi("y", "FLOAT", [10**5] * 3)],
        ),
        r"input 'x' is declared \[100000, 100000, 100000\] \(float32\): one sample is .* GiB",
    ),
    "compile: an output that is a graph input": (
        _graph_onnx(
            "passthrough",
            _relu(),
            lambda: [_vi("x", "FLOAT", ["batch", 4])],
            lambda: [_vi("y", "FLOAT", ["batch", 4]), _vi("x", "FLOAT", ["batch", 4])],
        ),
        r"output\(s\) \['x'\] are graph inputs returned unchanged",
    ),
    "compile: a string input": (
        _graph_onnx(
            "strings",
            lambda: [__import__("onnx").helper.make_node("Identity", ["x"], ["y"])],
            lambda: [_vi("x", "STRING", [2])],
            lambda: [_vi("y", "STRING", [2])],
        ),
        r"input 'x' is a string tensor; TensorRT engines bind numeric and bool tensors only",
    ),
    "compile -o the input model (--force)": (
        _overwrite_input("compile", "m.onnx", "-o", "./m.onnx"),
        r"-o \(engine\) '(\./)?m\.onnx' is the input model 'm\.onnx' itself",
    ),
    "compile -o the model's external data (--force)": (
        _overwrite_input("compile", "m.onnx", "-o", "w.bin"),
        r"'w\.bin' is the external data file #1 of the model",
    ),
    "compile --save-onnx the input model (--force)": (
        _overwrite_input("compile", "m.onnx", "-o", "m.engine", "--save-onnx", "m.onnx"),
        r"--save-onnx 'm\.onnx' is the input model",
    ),
    "compile --save-onnx whose external data file is the model's (--force)": (
        _save_onnx_data_is_the_models(),
        r"--save-onnx's external data file 's\.onnx\.data' is the external data file #1 of the model",
    ),
    "compile --save-onnx whose external data file exists (no --force)": (
        _onnx_data_exists("compile", "m.onnx", "-o", "m.engine", "--save-onnx", "out.onnx"),
        r"--save-onnx's external data file 'out\.onnx\.data' already exists; pass --force",
    ),
    "compile --generate --save-onnx whose external data file exists (no --force)": (
        _onnx_data_exists("compile", "m.onnx", "--generate", "-o", "e.engine", "--save-onnx", "out.onnx"),
        r"--save-onnx's external data file 'out\.onnx\.data' already exists; pass --force",
    ),
    "optimize -o whose external data file exists (no --force)": (
        _onnx_data_exists("optimize", "m.onnx", "-o", "out.onnx"),
        r"-o's external data file 'out\.onnx\.data' already exists; pass --force",
    ),
    "calibrate -o whose external data file exists (no --force)": (
        _onnx_data_exists("calibrate", "m.onnx", "--data", "m.onnx", "-o", "out.onnx"),
        r"-o's external data file 'out\.onnx\.data' already exists; pass --force",
    ),
    "optimize -o the input model (--force)": (
        _overwrite_input("optimize", "m.onnx", "-o", "m.onnx"),
        r"-o 'm\.onnx' is the input model 'm\.onnx' itself",
    ),
    "optimize --ledger the model's external data (--force)": (
        _overwrite_input("optimize", "m.onnx", "-o", "o.onnx", "--ledger", "w.bin"),
        r"--ledger 'w\.bin' is the external data file #1 of the model",
    ),
    "calibrate -o the calibration data (--force)": (
        _overwrite_input("calibrate", "m.onnx", "--data", "c.npz", "-o", "c.npz"),
        r"-o 'c\.npz' is the --data 'c\.npz' itself",
    ),
    "calibrate --calib-cache equal to -o": (
        _overwrite_input("calibrate", "m.onnx", "--data", "c.npz", "-o", "q.onnx", "--calib-cache", "q.onnx"),
        r"the calibration cache and -o name the same file 'q\.onnx'",
    ),
    "report: manifest with an unknown dtype": (
        _unknown_dtype_engine("report"),
        r"malformed manifest: inputs\[0\]\.dtype is 'quux'; expected one of \[",
    ),
    "inspect: manifest with an unknown dtype": (
        _unknown_dtype_engine("inspect"),
        r"malformed manifest: inputs\[0\]\.dtype is 'quux'",
    ),
    "compile: a torch checkpoint": (_checkpoint("compile"), r"'weights\.pth' is a torch checkpoint: "),
    "report: a torch checkpoint": (_checkpoint("report"), r"'weights\.pth' is a torch checkpoint"),
    "ONNX graph listing one output twice": (
        _graph_onnx(
            "twice_out",
            _relu(),
            lambda: [_vi("x", "FLOAT", [2, 4])],
            lambda: [_vi("y", "FLOAT", [2, 4]), _vi("y", "FLOAT", [2, 4])],
            command="optimize",
        ),
        r"'twice_out\.onnx' lists output\(s\) \['y'\] more than once in graph\.output",
    ),
    "compile: missing --precision-data": (
        _tiny("compile", "m.onnx", "-o", "o.engine", "--precision", "fp16", "--precision-data", "nope.npz"),
        r"--precision-data 'nope\.npz' does not exist",
    ),
    "calibrate: missing --data": (
        _tiny("calibrate", "m.onnx", "--data", "nope.npz", "-o", "q.onnx"),
        r"--data 'nope\.npz' does not exist",
    ),
    "gzip-compressed ONNX": (_gzipped_onnx, r"not a readable ONNX model .* It looks like a gzip file"),
    "ONNX opset 1": (
        _graph_onnx(
            "op1", _relu(), lambda: [_vi("x", "FLOAT", [2, 4])], lambda: [_vi("y", "FLOAT", [2, 4])], opset=1
        ),
        r"'op1\.onnx' imports ONNX opset 1; ONNX Runtime and TensorRT run opset 7 and later",
    ),
    "export-triton given an ONNX model": (
        _tiny("export-triton", "m.onnx", "-o", "repo"),
        r"'m\.onnx' is a model, not an engine: build one first with `trtforge compile m\.onnx",
    ),
    "compile: --calib-cache in a missing directory": (
        _tiny(
            "compile",
            "m.onnx",
            "-o",
            "o.engine",
            "--precision",
            "int8",
            "--calib-data",
            "m.onnx",
            "--calib-cache",
            "nodir/c.cache",
        ),
        r"cannot write --calib-cache file 'nodir/c\.cache': directory 'nodir' does not exist",
    ),
    "calibrate: --calib-cache in a missing directory": (
        _tiny("calibrate", "m.onnx", "--data", "m.onnx", "-o", "q.onnx", "--calib-cache", "nodir/c.cache"),
        r"cannot write --calib-cache file 'nodir/c\.cache'",
    ),
    # before: an empty --passes ran no pass and wrote the graph unfused (optimize: a copy), exit 0
    "optimize --passes ''": (
        _tiny("optimize", "m.onnx", "-o", "o.onnx", "--passes", ""),
        r"--passes '' names no pass; expected a comma-separated list of passes among attention, cleanup, .*"
        r"default: the full pipeline, cleanup,layernorm,.* run --passes cleanup",
    ),
    "compile --passes ' , '": (
        _tiny("compile", "m.onnx", "-o", "o.engine", "--passes", " , "),
        r"--passes ' , ' names no pass; .*--no-passes skips fusion",
    ),
    "-o names a device with --force": (
        _tiny("compile", "m.onnx", "-o", "/dev/null", "--force"),
        "exists and is not a regular file",
    ),
}


def _snapshot(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated current directory (importable, no bytecode written) with its own TMPDIR."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return work


def assert_exits_2_cleanly(
    setup: Setup, message: str, workdir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Run the CLI on what `setup` prepares: exit 2, one error line matching `message`, no traceback,
    the work directory unchanged and no work directory of ours left in the temp dir."""
    argv = setup(workdir)
    before = _snapshot(workdir)
    rc = main(argv)
    out, err = capfd.readouterr()
    text = out + err
    assert rc == 2, text
    assert "Traceback" not in text and "internal error" not in text, text
    errors = [line for line in text.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1, text
    assert re.search(message, text, re.S), text
    assert _snapshot(workdir) == before
    assert not list((workdir.parent / "tmp").glob("trtforge*"))  # our work directories (torch keeps caches)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_exits_2_cleanly(case: str, workdir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert_exits_2_cleanly(*CASES[case], workdir, capfd)


@pytest.fixture
def full_disk(tmp_path: Path):
    """A 16 KiB tmpfs (root only; skipped elsewhere)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)], capture_output=True
        ).returncode
    ):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.trt_build
def test_full_disk_is_a_user_error_naming_the_output(tmp_path, full_disk, capfd) -> None:
    model = tiny_onnx(tmp_path / "m.onnx")
    (full_disk / "filler").write_bytes(b"x" * 8192)
    rc = main(["compile", str(model), "-o", str(full_disk / "m.engine"), "-q", "--no-passes"])
    text = "".join(capfd.readouterr())
    assert rc == 2, text
    assert "Traceback" not in text and f"cannot write '{full_disk / 'm.engine'}'" in text, text
    assert "No space left on device" in text
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]


@pytest.mark.trt_build
def test_legal_long_name_and_non_utf8_name_compile(tmp_path) -> None:
    """A 243-character output name and a non-UTF-8 one are legal: they compile, under an ASCII locale."""
    model = tiny_onnx(tmp_path / "m.onnx")
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    for name in ("a" * 236 + ".engine", f"{NON_UTF8}.engine"):
        out = tmp_path / name
        proc = subprocess.run(
            [sys.executable, "-m", "trtforge.cli.main", "compile", str(model), "-o", str(out), "--no-passes"],
            capture_output=True,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        from trtforge.core.manifest import read_manifest, verify_engine_file

        verify_engine_file(out, read_manifest(out))
