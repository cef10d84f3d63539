"""Hostile inputs to the encoder commands (compile, optimize, calibrate, inspect, report, export-triton):
each exits 2 with one clear message naming what is wrong, no traceback, and nothing left behind. Same
harness as test_bad_inputs (its `workdir` fixture and snapshot rule)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.cli.test_bad_inputs import (
    Setup,
    _factory,
    _graph_onnx,
    _relu,
    _tiny,
    _vi,
    assert_exits_2_cleanly,
    workdir,  # noqa: F401 - a fixture
)
from tests.models import tiny_onnx, tiny_onnx_external

CORES = len(os.sched_getaffinity(0))


def _report_npz(content: bytes) -> Setup:
    """report on the tiny model with --data c.npz holding `content` (not a readable .npz)."""

    def setup(d: Path) -> list[str]:
        tiny_onnx(d / "m.onnx")
        (d / "c.npz").write_bytes(content)
        return ["report", "m.onnx", "-o", "rep", "--targets", "ort", "--data", "c.npz", "--no-progress"]

    return setup


def _npy_bytes() -> bytes:
    """A .npy file's bytes: one [4, 4] float32 array, what numpy.save writes (whatever the file's name)."""
    import io

    buf = io.BytesIO()
    np.save(buf, np.ones((4, 4), np.float32))
    return buf.getvalue()


def _npy_named_npz(d: Path) -> list[str]:
    """calibrate the tiny model on c.npz holding a .npy file. Before: np.load returned the array itself and
    `with` on it raised TypeError ("internal error", exit 1)."""
    tiny_onnx(d / "m.onnx")
    (d / "c.npz").write_bytes(_npy_bytes())
    return ["calibrate", "m.onnx", "--data", "c.npz", "-o", "q.onnx"]


def _data_directory(*argv: str) -> Setup:
    """calibrate the tiny model on directory dd of x.npy and a.npz, with `argv` and --force. Before: only a
    --data file was an input outputs must not overwrite, so -o dd/x.npy replaced a data file with the
    quantized model (exit 0), and the next run on dd failed on it."""

    def setup(d: Path) -> list[str]:
        tiny_onnx(d / "m.onnx")
        (d / "dd").mkdir()
        np.save(d / "dd" / "x.npy", np.ones((4, 4), np.float32))
        np.savez(d / "dd" / "a.npz", x=np.ones((4, 4), np.float32))
        return ["calibrate", "m.onnx", "--data", "dd", *argv, "--force"]

    return setup


def _compile_into_data_directory(d: Path) -> list[str]:
    """compile --precision int8 of the tiny model calibrated on directory dd, -o dd/x.npy (--force).
    Before: only a --calib-data file was an input, so the engine replaced dd's data file x.npy."""
    tiny_onnx(d / "m.onnx")
    (d / "dd").mkdir()
    np.save(d / "dd" / "x.npy", np.ones((4, 4), np.float32))
    return ["compile", "m.onnx", "--precision", "int8", "--calib-data", "dd", "-o", "dd/x.npy", "--force"]


def _data_module_as_output(d: Path) -> list[str]:
    """calibrate the wide model on module:function data with -o the module's own file. Before: a data
    function's module was no input outputs must not overwrite, so --force replaced the user's code with
    the quantized model."""
    (d / "calib_data.py").write_text(
        "import numpy as np\n\ndef data():\n    return [{'x': np.ones((4, 4), np.float32)}]\n"
    )
    return [*_calibrate(1.0)(d)[:2], "--data", "calib_data:data", "-o", "calib_data.py", "--force", "-q"]


def _wide_onnx(d: Path) -> Path:
    """x[B,4] -> MatMul(W[4,32]) -> h -> MatMul(W2[32,32]) -> y: mm2 is wide enough to quantize."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 32)).astype(np.float32), "W")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "W2")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
            helper.make_node("MatMul", ["h", "W2"], ["y"], name="mm2"),
        ],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])],
        [w, w2],
    )
    path = d / "wide.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _calibrate(value: float, *extra: str) -> Setup:
    """calibrate the wide model on 4 samples of `value` (3e38: finite, but h = x @ W overflows to inf)."""

    def setup(d: Path) -> list[str]:
        _wide_onnx(d)
        np.savez(d / "c.npz", x=np.full((4, 4), value, np.float32))
        return [
            "calibrate",
            "wide.onnx",
            "--data",
            "c.npz",
            "-o",
            "q.onnx",
            "--quiet",
            "--no-smoothquant",
            *extra,
        ]

    return setup


def _unknown_dtype_onnx(command: str, where: str) -> Setup:
    """The tiny model with element type 999 (no ONNX type) on its initializer W or its input x."""

    def setup(d: Path) -> list[str]:
        import onnx

        model = onnx.load(str(tiny_onnx(d / "m.onnx")))
        if where == "initializer":
            model.graph.initializer[0].data_type = 999
        else:
            model.graph.input[0].type.tensor_type.elem_type = 999
        onnx.save(model, str(d / "m.onnx"))
        return [
            command,
            "m.onnx",
            *{"inspect": [], "optimize": ["-o", "o.onnx"]}.get(command, ["-o", "o.engine"]),
        ]

    return setup


def _calib_cache(hex_scale: str) -> Setup:
    """calibrate the wide model reading a cache that gives its activation h the float `hex_scale`."""

    def setup(d: Path) -> list[str]:
        (d / "c.cache").write_text(f"TRT-8601-EntropyCalibration2\nh: {hex_scale}\n")
        return [*_calibrate(1.0)(d), "--calib-cache", "c.cache"]

    return setup


def _calib_cache_pipe(d: Path) -> list[str]:
    """calibrate the wide model with --calib-cache naming a pipe. Before: it exists, so it was read, and
    the read waited for a writer forever (a device such as /dev/zero was read until memory ran out)."""
    os.mkfifo(d / "c.cache")
    return [*_calibrate(1.0)(d), "--calib-cache", "c.cache", "--no-smoothquant"]


def _calib_cache_long_name(d: Path) -> list[str]:
    """calibrate the wide model reading a cache that also names a tensor of 10,000 characters the model
    does not have. Before: the message quoted the name whole."""
    (d / "c.cache").write_text(f"TRT-8601-EntropyCalibration2\nh: 3c010204\n{'n' * 10_000}: 3c010204\n")
    return [*_calibrate(1.0)(d), "--calib-cache", "c.cache", "--no-smoothquant"]


def _engine(d: Path, name: str = "m.engine") -> Path:
    """A consistent stand-in engine + manifest pair at d/name (x[B,64] -> y, s; batch 1..32)."""
    from trtforge._fileio import sha256_bytes
    from trtforge.core.manifest import publish_engine
    from trtforge.runtime.standin import standin_manifest

    data = b"engine bytes" * 20
    m = standin_manifest()
    m.engine_file, m.engine_bytes, m.engine_sha256 = name, len(data), sha256_bytes(data)
    d.mkdir(parents=True, exist_ok=True)
    publish_engine(d / name, data, m)
    return d / name


def _manifest(content: bytes) -> Setup:
    """inspect a stand-in engine whose manifest is replaced by `content`."""

    def setup(d: Path) -> list[str]:
        _engine(d)
        (d / "m.engine.json").write_bytes(content)
        return ["inspect", "m.engine"]

    return setup


def _engine_a_pipe(*argv: str) -> Setup:
    """`argv` after a stand-in engine's file is replaced by a named pipe (its manifest left beside it)."""

    def setup(d: Path) -> list[str]:
        import os

        _engine(d).unlink()
        os.mkfifo(d / "m.engine")
        return list(argv)

    return setup


def _build_record(build: object) -> Setup:
    """inspect --json of a stand-in engine whose manifest's records.build is `build` (the manifest is
    otherwise consistent: records are free-form; only --json reads the axis names there)."""

    def setup(d: Path) -> list[str]:
        import json

        _engine(d)
        path = d / "m.engine.json"
        manifest = json.loads(path.read_text())
        manifest["records"] = {"build": build}
        path.write_text(json.dumps(manifest))
        return ["inspect", "m.engine", "--json"]

    return setup


def _engine_removed(*argv: str) -> Setup:
    """`argv` after a stand-in engine's file is removed, its manifest left (inspect said the path given
    "does not exist", as if nothing were there)."""

    def setup(d: Path) -> list[str]:
        _engine(d).unlink()
        return list(argv)

    return setup


def _triton(*argv: str, engine: str = "m.engine") -> Setup:
    """export-triton of a stand-in engine at `engine` (relative to the work directory) with `argv`."""

    def setup(d: Path) -> list[str]:
        path = Path(engine)
        _engine(d / path.parent, path.name)
        return ["export-triton", engine, *argv]

    return setup


def _triton_manifest(edit: str, *argv: str) -> Setup:
    """export-triton -o repo `argv` of a stand-in engine whose manifest text has `edit` ("old=>new") made."""

    def setup(d: Path) -> list[str]:
        old, new = edit.split("=>")
        _engine(d)
        path = d / "m.engine.json"
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))
        return ["export-triton", "m.engine", "-o", "repo", *argv]

    return setup


def _triton_twice(first: list[str], second: list[str], output: str = "repo") -> Setup:
    """export-triton of a stand-in engine into repo with `first`, then (the command tested) into `output`
    with `second`."""

    def setup(d: Path) -> list[str]:
        from trtforge.cli.main import main

        _engine(d)
        assert main(["export-triton", "m.engine", "-o", "repo", *first]) == 0
        return ["export-triton", "m.engine", "-o", output, *second]

    return setup


def _ids_mask_onnx(d: Path) -> Path:
    """input_ids[batch,seq] -> Gather(E[16,32]) -> MatMul(W[32,32]), times attention_mask[batch,seq]."""
    from tests.reports._tiny import token_model_onnx

    return token_model_onnx(d / "ids_mask.onnx", vocab=16, width=32, matmul=True)


def _ids_mask_lengths(ids: int, mask: int, mask_value: int = 1) -> Setup:
    """calibrate the ids+mask model on ids of `ids` tokens and masks of `mask` tokens, all `mask_value`."""

    def setup(d: Path) -> list[str]:
        _ids_mask_onnx(d)
        np.savez(
            d / "c.npz",
            input_ids=np.ones((4, ids), np.int64),
            attention_mask=np.full((4, mask), mask_value, np.int64),
        )
        return ["calibrate", "ids_mask.onnx", "--data", "c.npz", "-o", "q.onnx", "--quiet"]

    return setup


def _int8_outside_profile(d: Path) -> list[str]:
    """compile --precision int8 of the ids+mask model for sequences of 1..16 tokens on samples of 32."""
    _ids_mask_lengths(32, 32)(d)
    shapes = ["--shape", "input_ids:1x1:2x8:4x16", "--shape", "attention_mask:1x1:2x8:4x16"]
    int8 = ["--precision", "int8", "--calib-data", "c.npz"]
    return ["compile", "ids_mask.onnx", "-o", "o.engine", *int8, *shapes]


def _precision_data(mask_value: int) -> Setup:
    """optimize --precision fp16 of the ids+mask model with --precision-data masks all `mask_value`."""

    def setup(d: Path) -> list[str]:
        _ids_mask_lengths(8, 8, mask_value)(d)
        fp16 = ["--precision", "fp16", "--precision-data", "c.npz"]
        return ["optimize", "ids_mask.onnx", "-o", "o.onnx", *fp16]

    return setup


def _windows(side: int) -> Setup:
    """calibrate x[batch, n] -> Reshape [batch, -1, 16] -> MatMul(W[16,32]) on samples of `side` values: a
    size the Reshape cannot split into rows of 16 fails in ORT's kernel (its `Fail`, not InvalidArgument)."""

    def setup(d: Path) -> list[str]:
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        w = numpy_helper.from_array(np.ones((16, 32), np.float32), "W")
        shape = numpy_helper.from_array(np.array([0, -1, 16], np.int64), "shape")
        graph = helper.make_graph(
            [
                helper.make_node("Reshape", ["x", "shape"], ["r"]),
                helper.make_node("MatMul", ["r", "W"], ["y"]),
            ],
            "windows",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "rows", 32])],
            [w, shape],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(d / "win.onnx"))
        np.savez(d / "c.npz", x=np.ones((4, side), np.float32))
        return ["calibrate", "win.onnx", "--data", "c.npz", "-o", "q.onnx", "--quiet", "--no-smoothquant"]

    return setup


def _truncated_external_data(*argv: str) -> Setup:
    """`argv` on the tiny model saved with external data (m.data), the data file cut to 20 bytes."""

    def setup(d: Path) -> list[str]:
        tiny_onnx_external(d)
        (d / "m.data").write_bytes((d / "m.data").read_bytes()[:20])
        return list(argv)

    return setup


def _short_external_length(*argv: str) -> Setup:
    """`argv` on the tiny model saved with external data (m.data) whose entry for W says `length` 8 (its
    [4, 3] float32 takes 48 bytes), with calibration data c.npz. Before: onnx read the 8 bytes and
    calibrate crashed reshaping them ("internal error", exit 1); inspect and compile passed it."""

    def setup(d: Path) -> list[str]:
        import onnx

        tiny_onnx_external(d)
        m = onnx.load(str(d / "m.onnx"), load_external_data=False)
        w = next(t for t in m.graph.initializer if t.name == "W")
        next(e for e in w.external_data if e.key == "length").value = "8"
        onnx.save(m, str(d / "m.onnx"))
        np.savez(d / "c.npz", x=np.ones((4, 4), np.float32))
        return list(argv)

    return setup


SHORT_LENGTH = (
    r"ONNX model 'm\.onnx': tensor 'W' is \[4, 3\] float32 \(48 bytes\), but its external data entry "
    r"gives it 8 bytes of 'm\.data': the model and its data file do not belong together"
)


def _edited_tiny(edit, *argv: str) -> Setup:
    """`argv` on the tiny model (x[B,4] -> MatMul 'matmul' -> Add 'bias' -> Relu 'relu' -> y) after `edit`
    changed its proto in place, with calibration data c.npz."""

    def setup(d: Path) -> list[str]:
        import onnx

        m = onnx.load(str(tiny_onnx(d / "src.onnx")))
        (d / "src.onnx").unlink()
        edit(m)
        onnx.save(m, str(d / "m.onnx"))
        np.savez(d / "c.npz", x=np.ones((4, 4), np.float32))
        return list(argv)

    return setup


def _clashing_value_info(m) -> None:
    from onnx import TensorProto, helper

    m.graph.value_info.append(helper.make_tensor_value_info("h", TensorProto.INT64, ["batch", 3]))


def _one_node_name(m) -> None:
    for n in m.graph.node:
        n.name = "same"


def _sparse_weight(m) -> None:
    from onnx import helper, numpy_helper

    w = next(t for t in m.graph.initializer if t.name == "W")
    m.graph.initializer.remove(w)
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "W")
    indices = numpy_helper.from_array(np.array([0, 5], np.int64))
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4, 3]))


CALIBRATE_TINY = ("calibrate", "m.onnx", "--data", "c.npz", "-o", "q.onnx")
SPARSE = (
    r"ONNX model 'm\.onnx' holds 1 sparse initializer\(s\) \['W'\]; trtforge's passes, calibration and "
    r"TensorRT's parser read dense initializers only"
)


TRUNCATED = (
    r"ONNX model 'm\.onnx': its external data file 'm\.data' holds 20 bytes, but tensor '\w+' is stored "
    r"at bytes \d+\.\.\d+ of it: the file is truncated"
)


def _half_model(*argv: str) -> Setup:
    """`argv` on an FP16 model (float16 input and MatMul weights) with float16 calibration data c.npz.
    Before: calibrate crashed in ONNX Runtime on SmoothQuant's FP32 Mul ("internal error", exit 1), and
    with --no-smoothquant wrote a graph ONNX Runtime refuses to load (float16 into an opset-17
    QuantizeLinear) and exited 0."""

    def setup(d: Path) -> list[str]:
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(0)
        w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float16), "W")
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
            "half",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 32])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", 32])],
            [w],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(d / "half.onnx"))
        np.savez(d / "c.npz", x=rng.standard_normal((8, 32)).astype(np.float16))
        return list(argv)

    return setup


HALF = r"INT8 calibration needs an FP32 model.*input 'x' is float16; MatMul 'mm' weight 'W' is float16"


CASES: dict[str, tuple[Setup, str]] = {
    "calibrate: an FP16 model": (
        _half_model("calibrate", "half.onnx", "--data", "c.npz", "-o", "q.onnx"),
        HALF,
    ),
    "calibrate --no-smoothquant: an FP16 model": (
        _half_model("calibrate", "half.onnx", "--data", "c.npz", "-o", "q.onnx", "--no-smoothquant"),
        HALF,
    ),
    "compile --precision int8: an FP16 model": (
        _half_model("compile", "half.onnx", "-o", "h.engine", "--precision", "int8", "--calib-data", "c.npz"),
        HALF,
    ),
    "compile: external data file truncated": (
        _truncated_external_data("compile", "m.onnx", "-o", "m.engine"),
        TRUNCATED,
    ),
    "optimize: external data file truncated": (
        _truncated_external_data("optimize", "m.onnx", "-o", "o.onnx"),
        TRUNCATED,
    ),
    "calibrate: external data file truncated": (
        _truncated_external_data("calibrate", "m.onnx", "--data", "m.onnx", "-o", "q.onnx"),
        TRUNCATED,
    ),
    "calibrate: external data entry shorter than its tensor": (
        _short_external_length("calibrate", "m.onnx", "--data", "c.npz", "-o", "q.onnx"),
        SHORT_LENGTH,
    ),
    "inspect: external data entry shorter than its tensor": (
        _short_external_length("inspect", "m.onnx"),
        SHORT_LENGTH,
    ),
    "calibrate: a value_info type clashing with its node (ONNX Runtime refuses the model)": (
        _edited_tiny(_clashing_value_info, *CALIBRATE_TINY),
        r"ONNX model 'm\.onnx': ONNX Runtime cannot load it: .*Type \(tensor\(int64\)\) of output arg \(h\) "
        r"of node \(matmul\) does not match expected type \(tensor\(float\)\)\. Calibration runs the graph",
    ),
    "calibrate: two nodes of one name": (
        _edited_tiny(_one_node_name, *CALIBRATE_TINY),
        r"ONNX model 'm\.onnx': ONNX Runtime cannot load it: .*two nodes with same node name \(same\)",
    ),
    "calibrate: a sparse initializer": (_edited_tiny(_sparse_weight, *CALIBRATE_TINY), SPARSE),
    "inspect: a sparse initializer": (_edited_tiny(_sparse_weight, "inspect", "m.onnx"), SPARSE),
    "calibrate -o a file of the --data directory (--force)": (
        _data_directory("-o", "dd/x.npy"),
        r"-o 'dd/x\.npy' is the file 'x\.npy' of the --data directory 'dd' itself; writing it would destroy",
    ),
    "calibrate --report a file of the --data directory (--force)": (
        _data_directory("-o", "q.onnx", "--report", "dd/a.npz"),
        r"--report 'dd/a\.npz' is the file 'a\.npz' of the --data directory 'dd' itself",
    ),
    # (before: taken and ignored, exit 0)
    "calibrate --tokenizer with array data": (
        _data_directory("-o", "q.onnx", "--tokenizer", "demo"),
        r"--tokenizer tokenizes a text file of sentences given as --data, and --data 'dd' is not one "
        r"\(arrays or a module:function, read as they are\): nothing would read it\. Drop --tokenizer\.",
    ),
    "compile -o a file of the --calib-data directory (--force)": (
        _compile_into_data_directory,
        r"-o \(engine\) 'dd/x\.npy' is the file 'x\.npy' of the --calib-data directory 'dd' itself",
    ),
    "calibrate -o the module file of a --data module:function (--force)": (
        _data_module_as_output,
        r"-o 'calib_data\.py' is the module file of the --data function 'calib_data:data' itself; writing "
        r"it would destroy an input",
    ),
    "calibrate: a .npy file named .npz": (
        _npy_named_npz,
        r"'c\.npz' is a \.npy file \(one unnamed array \[4, 4\] float32\), not a \.npz; a \.npz names each "
        r"array after its model input",
    ),
    "report: a .npy file named .npz": (_report_npz(_npy_bytes()), r"--data 'c\.npz' is a \.npy file"),
    "report: external data file truncated": (
        _truncated_external_data("report", "m.onnx", "-o", "rep", "--targets", "ort", "--no-progress"),
        TRUNCATED,
    ),
    "inspect: external data file truncated": (
        _truncated_external_data("inspect", "m.onnx"),
        TRUNCATED,
    ),
    "calibrate: attention_mask one token longer than input_ids (both [batch, seq])": (
        _ids_mask_lengths(8, 9),
        r"'c\.npz': input 'attention_mask' has size 9 on axis 1 \('seq'\) but input 'input_ids' has 8 there",
    ),
    "calibrate: an attention_mask of 2s (token_type_ids passed as the mask)": (
        _ids_mask_lengths(8, 8, mask_value=2),
        r"calibration data c\.npz: input 'attention_mask' holds 2; an attention mask holds 1 for real tokens "
        r"and 0 for padding only",
    ),
    "optimize --precision-data: an attention_mask of 2s": (
        _precision_data(mask_value=2),
        r"precision sample data \(batch 0\): input 'attention_mask' holds 2; an attention mask holds 1",
    ),
    "calibrate: samples a Reshape in the model cannot take (ORT Fail)": (
        _windows(20),
        r"ONNX Runtime rejected a batch of calibration data c\.npz: .*cannot be reshaped.* \(at Reshape node "
        r"'\w*'\)\. Check that the data fits",
    ),
    "compile: a model whose forward returns None": (
        _factory(
            "def make():\n    class Nothing(Lin):\n        def forward(self, x):\n            return None\n"
            "    return Nothing(), (torch.zeros(2, 4),)\n"
        ),
        r"the model returns no tensor \(its forward returned None\)",
    ),
    "compile: a model whose forward returns an empty tuple": (
        _factory(
            "def make():\n    class Nothing(Lin):\n        def forward(self, x):\n            return ()\n"
            "    return Nothing(), (torch.zeros(2, 4),)\n"
        ),
        r"the model returns no tensor \(its forward returned a tuple holding no tensor\)",
    ),
    "compile --output-name twice the same": (
        lambda d: [
            *_factory(
                "def make():\n    class Two(Lin):\n        def forward(self, x):\n"
                "            return self.lin(x), self.lin(x) * 2\n    return Two(), (torch.zeros(2, 4),)\n"
            )(d),
            "--output-name",
            "a",
            "--output-name",
            "a",
        ],
        r"--output-name \(output_names\) \['a', 'a'\] has \['a'\] more than once",
    ),
    "compile --output-name ''": (
        lambda d: [
            *_factory("def make():\n    return Lin(), (torch.zeros(2, 4),)\n")(d),
            "--output-name",
            "",
        ],
        r"--output-name \(output_names\) \[''\] has an empty name",
    ),
    "compile --output-name an input's name": (
        lambda d: [
            *_factory("def make():\n    return Lin(), (torch.zeros(2, 4),)\n")(d),
            "--output-name",
            "x",
        ],
        r"has \['x'\], which the model's inputs are also named",
    ),
    "compile: factory with a str example input": (
        _factory("def make():\n    return Lin(), ('abc',)\n"),
        r"example input\(s\) 'x' \(str\) are not torch\.Tensors",
    ),
    "compile: factory with a NumPy example input": (
        _factory("import numpy as np\ndef make():\n    return Lin(), [np.zeros((2, 4), np.float32)]\n"),
        r"example input\(s\) 'x' \(ndarray\) are not torch\.Tensors; .* torch\.from_numpy",
    ),
    "compile: an input without an element type": (
        _graph_onnx(
            "untyped", _relu(), lambda: [_vi("x", "UNDEFINED", [2, 4])], lambda: [_vi("y", "FLOAT", [2, 4])]
        ),
        r"'untyped\.onnx': graph input 'x' declares no element type \(elem_type 0, UNDEFINED\)",
    ),
    "optimize: an output without an element type": (
        _graph_onnx(
            "untyped_out",
            _relu(),
            lambda: [_vi("x", "FLOAT", [2, 4])],
            lambda: [_vi("y", "UNDEFINED", [2, 4])],
            command="optimize",
        ),
        r"'untyped_out\.onnx': graph output 'y' declares no element type",
    ),
    "calibrate: data that overflows to inf inside the model": (
        _calibrate(3e38),
        r"calibration data c\.npz gave activation 'h' \(input of node\(s\) \['mm2'\]\) no finite value: all "
        r"128 were NaN/inf",
    ),
    "calibrate: an attention_mask of 0s only (every position padding)": (
        _ids_mask_lengths(8, 8, mask_value=0),
        r"calibration data c\.npz gave activation 'emb' \(input of node\(s\) \['\w+'\]\) no value at all, "
        r"so its INT8 range is unknown: statistics cover real tokens only and no sample has one",
    ),
    "calibrate --all-tokens: sequences of 0 tokens": (
        lambda d: [*_ids_mask_lengths(0, 0)(d), "--all-tokens"],
        r"gave activation 'emb' .* no value at all, so its INT8 range is unknown: its samples hold no value "
        r"of it \(a zero-length axis",
    ),
    # before: calibrated on sequences the engine never runs (exit 0)
    "compile --precision int8: calibration samples longer than the --shape profile": (
        _int8_outside_profile,
        r"--calib-data c\.npz: input 'input_ids' has size 32 on axis 1, outside the engine's profile 1\.\.16 "
        r"there \(--shape input_ids:1x1:2x8:4x16\)",
    ),
    "calibrate --percentile with another --method": (
        _calibrate(1.0, "--method", "max", "--percentile", "99.9"),
        r"--percentile only applies to --method percentile \(got --method max\)",
    ),
    "calibrate --real-tokens on a model without an attention mask": (
        _calibrate(1.0, "--real-tokens"),
        r"--real-tokens \(only_real_tokens=True\) needs a rank-2 'attention_mask' model input",
    ),
    "optimize --verify-shape with --no-verify": (
        _tiny("optimize", "m.onnx", "-o", "o.onnx", "--no-verify", "--verify-shape", "x:2x4"),
        r"--verify-shape feeds verification .* but --no-verify turns verification off",
    ),
    "optimize --verify-shape with an empty dynamic axis": (
        _tiny("optimize", "m.onnx", "-o", "o.onnx", "--verify-shape", "x:0x4"),
        r"--verify-shape x: dim 0 of 0x4 is 0; an empty input runs no computation",
    ),
    "compile --report equal to -o": (
        _tiny("compile", "m.onnx", "-o", "out", "--report", "out"),
        r"--report and -o \(engine\) name the same file 'out'",
    ),
    "compile --report equal to --save-onnx": (
        _tiny("compile", "m.onnx", "-o", "o.engine", "--save-onnx", "rep", "--report", "./rep"),
        r"--report and --save-onnx name the same file",
    ),
    "compile --report an existing file": (
        _tiny("compile", "m.onnx", "-o", "o.engine", "--report", "m.onnx/"),
        r"report directory 'm\.onnx' exists and is not a directory",
    ),
    "calibrate --op-types naming no op type": (
        _calibrate(1.0, "--op-types", " , "),
        r"--op-types \(op_types\) names no op type, so nothing would be quantized; give one or more of "
        r"MatMul,Gemm,Conv",
    ),
    "inspect: an initializer of an unknown element type": (
        _unknown_dtype_onnx("inspect", "initializer"),
        r"ONNX model 'm\.onnx': initializer 'W' has element type 999, which the installed onnx .* does "
        r"not know",
    ),
    "optimize: an initializer of an unknown element type": (
        _unknown_dtype_onnx("optimize", "initializer"),
        r"initializer 'W' has element type 999",
    ),
    "compile: an input of an unknown element type": (
        _unknown_dtype_onnx("compile", "input"),
        r"graph input 'x' has element type 999",
    ),
    "calibrate --calib-cache with a NaN scale": (
        _calib_cache("7fc00000"),
        r"calibration cache 'c\.cache' line 2 gives tensor 'h' the scale nan; a quantization scale is a "
        r"finite number above 0",
    ),
    "calibrate --calib-cache with a zero scale": (_calib_cache("00000000"), r"tensor 'h' the scale 0\.0;"),
    "calibrate --calib-cache with a negative scale": (
        _calib_cache("bf800000"),
        r"tensor 'h' the scale -1\.0;",
    ),
    "calibrate --calib-cache a pipe": (
        _calib_cache_pipe,
        r"calibration cache 'c\.cache' is not a regular file \(a pipe or device\?\); expected a file\.",
    ),
    "calibrate --calib-cache naming a tensor of 10,000 characters": (
        _calib_cache_long_name,
        r"holds scales for 1 of its 2 tensors that this model does not have \(e\.g\. \['n{20,}…' "
        r"\(10,000 characters\)\]\); it was written for another model",
    ),
    "report: --data .npz that is not a zip": (
        _report_npz(b"PK\x03\x04 not a zip archive"),
        r"--data 'c\.npz' is not a readable \.npz file \(BadZipFile",
    ),
    "report: empty --data .npz": (
        _report_npz(b""),
        r"--data 'c\.npz' is not a readable \.npz file \(EOFError",
    ),
    "report --threads beyond the CPU cores": (
        _tiny(
            "report", "m.onnx", "-o", "rep", "--targets", "ort", "--no-progress", "--threads", str(CORES + 1)
        ),
        rf"--threads {CORES + 1} is outside 1\.\.{CORES}: this process runs on {CORES} CPU core",
    ),
    "inspect: manifest nested deeper than the JSON parser recurses": (
        _manifest(b"[" * 100_000 + b"]" * 100_000),
        r"manifest 'm\.engine\.json' is not valid JSON: maximum recursion depth exceeded",
    ),
    "inspect: a manifest whose engine is gone": (
        _engine_removed("inspect", "m.engine"),
        r"engine file 'm\.engine' does not exist; only its manifest 'm\.engine\.json' is here",
    ),
    "inspect: the manifest of an engine that is gone": (
        _engine_removed("inspect", "m.engine.json"),
        r"engine file 'm\.engine' does not exist; only its manifest 'm\.engine\.json' is here",
    ),
    # (it said the engine "does not exist; only its manifest is here")
    "inspect: the engine file is a pipe": (
        _engine_a_pipe("inspect", "m.engine.json"),
        r"engine file 'm\.engine' is not a regular file \(a pipe or device\?\); expected a file",
    ),
    # (each ended in a traceback, exit 1: 'int' object has no attribute 'get', is not iterable, unhashable)
    "inspect --json: records.build not an object": (
        _build_record(5),
        r"manifest 'm\.engine\.json': malformed manifest: records\.build must be a JSON object, found int",
    ),
    "inspect --json: records.build.inputs not a list": (
        _build_record({"inputs": 5}),
        r"malformed manifest: records\.build\.inputs must be a JSON list, found int",
    ),
    "inspect --json: records.build.outputs entry with a list for a name": (
        _build_record({"outputs": [{"name": ["y"], "symbols": None}]}),
        r"malformed manifest: records\.build\.outputs\[0\] must be an object with a string name",
    ),
    "inspect --json: records.build.inputs symbols not a list": (
        _build_record({"inputs": [{"name": "x", "symbols": 5}]}),
        r"records\.build\.inputs\[0\] must be .* symbols a list of strings or nulls .*, found "
        r"\{\"name\": \"x\", \"symbols\": 5\}",
    ),
    "report --calib-data without an INT8 target": (
        _tiny("report", "m.onnx", "-o", "rep", "--targets", "ort,ort-fp16", "--calib-data", "m.onnx"),
        r"--calib-data feeds only the INT8 targets \(ort-int8, trt-int8\), and none of this report's "
        r"targets \(ort, ort-fp16\) is one",
    ),
    "report --calibration-data (the older spelling) without an INT8 target": (
        _tiny("report", "m.onnx", "-o", "rep", "--targets", "ort,ort-fp16", "--calibration-data", "m.onnx"),
        r"--calib-data feeds only the INT8 targets",
    ),
    "export-triton: --max-queue-delay-us beyond uint64": (
        _triton("-o", "repo", "--max-queue-delay-us", "9" * 30),
        r"--max-queue-delay-us 9{30} is out of range: .* 0\.\.18446744073709551615",
    ),
    "export-triton --force into the model directory that holds the engine": (
        _triton("-o", "repo", "--force", engine="repo/m/m.engine"),
        r"the model directory 'repo/m' is or holds 'repo/m/m\.engine', a file being exported",
    ),
    "export-triton --force with --name the engine itself": (
        _triton("-o", ".", "--name", "m.engine", "--force", "--no-validate"),
        r"the model directory 'm\.engine' is or holds 'm\.engine'",
    ),
    "export-triton --preferred-batch-size with --no-dynamic-batching": (
        _triton("-o", "repo", "--no-dynamic-batching", "--preferred-batch-size", "4", "--no-validate"),
        r"--preferred-batch-size configures Triton's dynamic batcher, but --no-dynamic-batching turns it off",
    ),
    "export-triton --max-queue-delay-us at max batch 1": (
        _triton("-o", "repo", "--max-batch", "1", "--max-queue-delay-us", "100", "--no-validate"),
        r"--max-queue-delay-us configures .* off by default at max batch size 1; pass --dynamic-batching",
    ),
    "export-triton --dynamic-batching with --max-batch 0": (
        _triton("-o", "repo", "--max-batch", "0", "--dynamic-batching", "--no-validate"),
        r"this one cannot batch: --max-batch 0 turns batching off\.",
    ),
    "export-triton --name ''": (
        _triton("-o", "repo", "--name", "", "--no-validate"),
        r"--name '' is not a valid model directory name",
    ),
    "export-triton --name of spaces only": (
        _triton("-o", "repo", "--name", "   ", "--no-validate"),
        r"--name '   ' is not a valid model directory name",
    ),
    "export-triton --name with a trailing space": (
        _triton("-o", "repo", "--name", "bert ", "--no-validate"),
        r"--name 'bert ' is not a valid model directory name: .* ending with a space",
    ),
    # (before: protobuf's ParseError, an internal error; with --no-validate UnicodeEncodeError)
    "export-triton: a manifest's tensor name not UTF-8 (a lone surrogate)": (
        _triton_manifest('"name": "y"=>"name": "y\\udc80"', "--no-validate"),
        r"output 'y\\udc80' of the engine's manifest is not valid UTF-8 text, which Triton's config\.pbtxt "
        r"needs for every tensor name",
    ),
    # (before: written as `name: ""` and said to be validated; Triton refuses it at load)
    "export-triton: a manifest's tensor name empty": (
        _triton_manifest('"name": "y"=>"name": ""'),
        r"an output of the engine's manifest has an empty name, and Triton's config\.pbtxt needs a name",
    ),
    # (before: written as max_batch_size 2147483648, out of Triton's int32: protobuf's ParseError, an
    # internal error; with --no-validate a config Triton refuses)
    "export-triton --max-batch past int32": (
        _triton_manifest(
            '"max": [\n          32,=>"max": [\n          4294967296,', "--max-batch", "2147483648"
        ),
        r"--max-batch 2147483648 is out of range: Triton reads max_batch_size as a signed 32-bit integer, "
        r"at most 2147483647",
    ),
    # (before: protobuf's ParseError 'Value out of range', an internal error)
    "export-triton: a manifest's dimension past int64": (
        _triton_manifest("        -1\n      ]=>        -1,\n        " + "9" * 20 + "\n      ]"),
        r"output 's' has shape \[-1, 9{20}\] in the engine's manifest, a dimension past the signed 64-bit",
    ),
    "export-triton --instances past int32": (
        _triton("-o", "repo", "--instances", str(2**31)),
        r"--instances 2147483648 is out of range: expected a whole number from 1 to 2147483647",
    ),
    # (before: written as "y\000z" and said to be validated)
    "export-triton: a manifest's tensor name with a NUL": (
        _triton_manifest('"name": "y"=>"name": "y\\u0000z"'),
        r"output 'y\\x00z' of the engine's manifest holds a NUL character, which no TensorRT tensor name can",
    ),
    "export-triton: an FP8 output names the dtypes Triton serves": (
        _triton_manifest('"dtype": "float32"=>"dtype": "float8_e4m3fn"'),
        r"input 'x' has dtype float8_e4m3fn, which Triton's TensorRT backend cannot serve \(it serves "
        r"bfloat16, bool, float16, float32, int32, int64, int8, uint8\)",
    ),
    "export-triton --version 0 (Triton ignores a version directory '0')": (
        _triton("-o", "repo", "--version", "0"),
        r"Invalid value for '--version': 0 is not in the range x>=1",
    ),
    "export-triton --version -1": (
        _triton("-o", "repo", "--version", "-1"),
        r"Invalid value for '--version': -1 is not in the range x>=1",
    ),
    "export-triton --version 1.5": (
        _triton("-o", "repo", "--version", "1.5"),
        r"Invalid value for '--version': '1\.5' is not a valid integer",
    ),
    "export-triton --version past int64": (
        _triton("-o", "repo", "--version", "9" * 20),
        r"--version 9{20} is not a model version Triton serves: expected a whole number from 1 to "
        r"9223372036854775807",
    ),
    "export-triton --version of a version the model has": (
        _triton_twice(["--version", "3"], ["--version", "3"]),
        r"model directory 'repo/m' already exists; pass --force to replace it \(with all its versions\), "
        r"or --version N to add this engine as version N beside its version 3",
    ),
    "export-triton --version N of an engine needing another config.pbtxt": (
        _triton_twice([], ["--version", "2", "--max-batch", "4"]),
        r"model directory 'repo/m' already exists and has a config\.pbtxt unlike this engine's; Triton "
        r"serves every version of a model with the one config\.pbtxt",
    ),
    # (before: written; Triton's ValidateModelName refuses '..' anywhere in a name it is asked to load)
    "export-triton --name with '..' inside": (
        _triton("-o", "repo", "--name", "bert..v2", "--no-validate"),
        r"--name 'bert\.\.v2' is not a valid model directory name: expected printable UTF-8 text without "
        r"'/' or '\.\.'",
    ),
    "export-triton: the default name (the engine's stem) with '..' inside": (
        _triton("-o", "repo", engine="m..int8.engine"),
        r"the model name \(the engine file's name; choose one with --name\) 'm\.\.int8' is not a valid",
    ),
    # (before: written to repo/m/m, a directory Triton never looks in, and the model repo/m left as it was)
    "export-triton -o a model directory, not the repository": (
        _triton_twice([], ["--name", "v2"], output="repo/m"),
        r"-o 'repo/m' is a model directory \(it holds config\.pbtxt\), not a model repository: Triton would "
        r"not find a model written inside it\. Give the repository that holds it, -o 'repo', with --name m",
    ),
    "export-triton --name over the filesystem limit": (
        _triton("-o", "repo", "--name", "n" * 300, "--no-validate"),
        r"--name 'repo/n{300}': the file name is 300 bytes long; this filesystem allows 255",
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_encoder_hostile_input_exits_2_cleanly(
    case: str,
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    assert_exits_2_cleanly(*CASES[case], workdir, capfd)


def test_an_endless_calibration_generator_is_refused(
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: a data function that never ends (`while True: yield ...`) ran until memory ran out. Here
    the limit is lowered to 50 and the generator yields 2000 samples, so the old code finished instead."""
    from trtforge.calibration import sources

    monkeypatch.setattr(sources, "UNBOUNDED_SAMPLE_LIMIT", 50, raising=False)

    def setup(d: Path) -> list[str]:
        (d / "endless_data.py").write_text(
            "import numpy as np\n\ndef data():\n    for _ in range(2000):\n"
            "        yield {'x': np.ones((1, 4), np.float32)}\n"
        )
        return [*_calibrate(1.0)(d)[:2], "--data", "endless_data:data", "-o", "q.onnx", "--quiet"]

    message = r"data function 'endless_data:data' yielded more than 50 samples and has not ended"
    assert_exits_2_cleanly(setup, message, workdir, capfd)


def test_onnx_runtime_refusing_calibration_data_prints_only_the_error(
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Before: ONNX Runtime also logged its own coloured `[E:onnxruntime:...]` line for the refused batch,
    so the error came twice, once as raw kernel output, and the reason began with ORT's source file and
    C++ signature."""
    from trtforge.cli.main import main

    assert main(_windows(20)(workdir)) == 2
    out, err = capfd.readouterr()
    assert "[E:onnxruntime" not in out + err and "onnxruntime_src" not in out + err, out + err
    assert (out + err).strip().startswith("error: ONNX Runtime rejected a batch"), out + err


def test_an_endless_calibration_generator_is_refused_short_of_a_huge_sample_count(
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: --samples 10**18 lifted the endless-generator limit, so `while True: yield ...` ran until
    memory ran out. Here the limit is lowered to 50 and the generator yields 2000 samples, so the old code
    finished instead."""
    from trtforge.calibration import sources

    monkeypatch.setattr(sources, "UNBOUNDED_SAMPLE_LIMIT", 50, raising=False)

    def setup(d: Path) -> list[str]:
        (d / "endless_data.py").write_text(
            "import numpy as np\n\ndef data():\n    for _ in range(2000):\n"
            "        yield {'x': np.ones((1, 4), np.float32)}\n"
        )
        argv = [*_calibrate(1.0)(d)[:2], "--data", "endless_data:data", "-o", "q.onnx", "--quiet"]
        return [*argv, "--samples", str(10**18)]

    message = (
        r"data function 'endless_data:data' yielded more than 50 samples, short of the 10{18} asked for, and "
        r"has not ended .* N at most 50 \(calibrate --samples N"
    )
    assert_exits_2_cleanly(setup, message, workdir, capfd)


def test_an_endless_calibration_generator_of_empty_items_is_refused(
    workdir: Path,  # noqa: F811
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: items of 0 samples (a generator slicing past the end of its data) counted for nothing, so
    one that never ended ran until memory ran out, --samples or not. Here the limit is lowered to 50 and
    the generator yields 2000 empty items before its samples, so the old code finished instead."""
    from trtforge.calibration import sources

    monkeypatch.setattr(sources, "UNBOUNDED_SAMPLE_LIMIT", 50, raising=False)

    def setup(d: Path) -> list[str]:
        (d / "past_the_end.py").write_text(
            "import numpy as np\n\ndef data():\n    for _ in range(2000):\n"
            "        yield {'x': np.ones((0, 4), np.float32)}\n"
            "    yield {'x': np.ones((8, 4), np.float32)}\n"
        )
        argv = [*_calibrate(1.0)(d)[:2], "--data", "past_the_end:data", "-o", "q.onnx", "--quiet"]
        return [*argv, "--samples", "8"]

    message = (
        r"data function 'past_the_end:data' yielded more than 50 items holding no sample \(arrays whose "
        r"first, sample axis has size 0\) and has not ended nor given 8 samples"
    )
    assert_exits_2_cleanly(setup, message, workdir, capfd)
