"""`trtforge compile` / `inspect` from the command line: success output, and every bad input -> exit 2,
a message naming the problem, and no output file left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.models import tiny_onnx
from trtforge.cli.main import main


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


def _leftovers(directory: Path) -> list[str]:
    return sorted(
        p.name for p in directory.iterdir() if p.suffix in (".engine", ".json", ".tmp") or ".tmp" in p.name
    )


@pytest.mark.trt_build
def test_compile_onnx_then_inspect(tmp_path, capsys) -> None:
    model = tiny_onnx(tmp_path / "m.onnx")
    rc, out = _run(
        ["compile", str(model), "-o", str(tmp_path / "m.engine"), "--shape", "x:1x4:2x4:16x4"], capsys
    )
    assert rc == 0, out
    assert "build" in out and "m.engine" in out and "1x4:2x4:16x4" in out
    rc, out = _run(["inspect", str(tmp_path / "m.engine")], capsys)
    assert rc == 0 and "sha256" in out and "tensorrt_rtx" in out
    rc, out = _run(["inspect", str(tmp_path / "m.engine"), "--json"], capsys)
    assert rc == 0 and json.loads(out)["inputs"][0]["name"] == "x"
    # Existing output without --force: refused, original untouched.
    before = (tmp_path / "m.engine").read_bytes()
    rc, out = _run(["compile", str(model), "-o", str(tmp_path / "m.engine")], capsys)
    assert rc == 2 and "already exists" in out and "--force" in out
    assert (tmp_path / "m.engine").read_bytes() == before
    rc, out = _run(["compile", str(model), "-o", str(tmp_path / "m.engine"), "--force", "-q"], capsys)
    assert rc == 0


@pytest.mark.parametrize("name", ["out.onnx", "out.ONNX", "out.json"])
def test_an_engine_named_as_an_onnx_model_or_a_manifest_is_refused(tmp_path, capsys, name) -> None:
    """Before: `compile m.onnx -o out.onnx` wrote an engine named as an ONNX model, which inspect and
    report then read as one (a protobuf error about an engine). Refused before any work, nothing written."""
    model = tiny_onnx(tmp_path / "m.onnx")
    rc, out = _run(["compile", str(model), "-o", str(tmp_path / name)], capsys)
    assert rc == 2 and f"output engine '{tmp_path / name}' is named as" in out and "--save-onnx" in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    (tmp_path / name).write_text("kept")  # an existing file, with --force: refused after the input checks
    rc, out = _run(["compile", str(model), "-o", str(tmp_path / name), "--force"], capsys)
    assert rc == 2 and "is named as" in out and (tmp_path / name).read_text() == "kept", out


def test_inspect_onnx(tmp_path, capsys) -> None:
    rc, out = _run(["inspect", str(tiny_onnx(tmp_path / "m.onnx")), "--json"], capsys)
    summary = json.loads(out)
    assert rc == 0 and summary["ops"] == {"MatMul": 1, "Add": 1, "Relu": 1}
    # (the shape was the table's text "[batch, 4]"; now the list an engine's has, the names beside it)
    assert summary["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": [-1, 4], "symbols": ["batch", None]}
    ]
    rc, out = _run(["inspect", str(tmp_path / "m.onnx")], capsys)
    assert rc == 0 and "[batch, 4]" in out  # the table still names the axis


def test_inspect_of_an_onnx_model_named_otherwise(tmp_path, capsys) -> None:
    """Before: `inspect model.onnx.bak` (or model.pb) read the file as an engine and said it "has no
    manifest"; with no manifest beside it, a file that parses as an ONNX model is summarized as one, and
    anything else is still refused as an engine without its manifest."""
    onnx_bytes = tiny_onnx(tmp_path / "m.onnx").read_bytes()
    (tmp_path / "m.onnx.bak").write_bytes(onnx_bytes)
    rc, out = _run(["inspect", str(tmp_path / "m.onnx.bak"), "--json"], capsys)
    assert rc == 0 and json.loads(out)["ops"] == {"MatMul": 1, "Add": 1, "Relu": 1}, out
    (tmp_path / "x.engine").write_bytes(bytes(range(256)) * 8)
    rc, out = _run(["inspect", str(tmp_path / "x.engine")], capsys)
    assert rc == 2 and "has no manifest" in out, out


def test_inspect_counts_the_ops_inside_if_and_loop_bodies(tmp_path, capsys) -> None:
    """Before: the op histogram listed the top-level graph only: a model whose work sits in If branches
    and a Loop body (nested in one branch) showed an If and nothing of what it runs. Now the bodies' ops
    are counted apart, in subgraph_ops / subgraph_nodes and the table's "in subgraphs" column, and the
    top-level counts stay those of the graph itself."""
    import onnx
    from onnx import TensorProto, helper

    def vi(name, elem=TensorProto.FLOAT, shape=(2,)):
        return helper.make_tensor_value_info(name, elem, list(shape))

    loop_body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Relu", ["v_in"], ["v_out"]),
        ],
        "loop_body",
        [vi("i", TensorProto.INT64, ()), vi("cond_in", TensorProto.BOOL, ()), vi("v_in")],
        [vi("cond_out", TensorProto.BOOL, ()), vi("v_out")],
    )
    then_branch = helper.make_graph(
        [helper.make_node("Loop", ["trip", "", "x"], ["looped"], body=loop_body)], "then", [], [vi("looped")]
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["negx"]), helper.make_node("Relu", ["negx"], ["relu_neg"])],
        "else",
        [],
        [vi("relu_neg")],
    )
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["trip"], value=helper.make_tensor("t", TensorProto.INT64, [], [1])
            ),
            helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch),
        ],
        "g",
        [vi("c", TensorProto.BOOL, ()), vi("x")],
        [vi("y")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "cf.onnx"))
    rc, out = _run(["inspect", str(tmp_path / "cf.onnx"), "--json"], capsys)
    summary = json.loads(out)
    assert rc == 0 and summary["ops"] == {"Constant": 1, "If": 1} and summary["nodes"] == 2, out
    assert summary["subgraph_ops"] == {"Loop": 1, "Identity": 1, "Relu": 2, "Neg": 1}, out
    assert summary["subgraph_nodes"] == 5
    rc, out = _run(["inspect", str(tmp_path / "cf.onnx")], capsys)
    assert rc == 0 and "in subgraphs" in out and "5 nodes (If/Loop/Scan bodies)" in out, out
    relu = next(line for line in out.splitlines() if line.split()[:1] == ["Relu"])
    assert [cell for cell in relu.split()[1:] if cell != "│"] == ["0", "2"], out


@pytest.mark.trt_build
def test_inspect_json_of_an_onnx_model_and_of_its_engine_share_their_keys(tmp_path, capsys) -> None:
    """Before: `inspect --json` printed an engine's manifest as it is and an ONNX model's own summary, with
    no key saying which, shapes as a list in one and as text in the other, opset(s) and precision in
    different places. Now both lead with kind, path, opset, precision, inputs and outputs."""
    model = tiny_onnx(tmp_path / "m.onnx")
    rc, out = _run(
        ["compile", str(model), "-o", str(tmp_path / "m.engine"), "--precision", "fp16", "-q"], capsys
    )
    assert rc == 0, out
    rc, out = _run(["inspect", str(model), "--json"], capsys)
    onnx_summary = json.loads(out)
    rc2, out = _run(["inspect", str(tmp_path / "m.engine"), "--json"], capsys)
    engine_summary = json.loads(out)
    assert rc == rc2 == 0
    common = ["kind", "path", "opset", "precision", "inputs", "outputs"]
    assert list(onnx_summary)[: len(common)] == list(engine_summary)[: len(common)] == common
    assert (onnx_summary["kind"], engine_summary["kind"]) == ("onnx", "engine")
    assert engine_summary["path"] == str(tmp_path / "m.engine") and onnx_summary["path"] == str(model)
    assert onnx_summary["opset"] == engine_summary["opset"] == 17
    assert onnx_summary["precision"] is None and engine_summary["precision"]["mode"] == "fp16"
    for kind in ("inputs", "outputs"):
        for a, b in zip(onnx_summary[kind], engine_summary[kind], strict=True):
            assert set(a) == set(b) == {"name", "dtype", "shape", "symbols"}
            # (the engine's axis names were all null: the build record kept none of the graph's)
            assert (a["name"], a["dtype"], a["shape"], a["symbols"]) == (
                b["name"],
                b["dtype"],
                b["shape"],
                b["symbols"],
            )
    assert engine_summary["inputs"][0]["symbols"] == ["batch", None]
    # the manifest's own keys stay (what scripts read from `inspect model.engine --json`)
    assert engine_summary["engine_sha256"] and engine_summary["backend"]["name"]
    # the manifest itself (model.engine.json) as FILE: the same object
    rc, out = _run(["inspect", str(tmp_path / "m.engine.json"), "--json"], capsys)
    assert rc == 0 and json.loads(out) == engine_summary


@pytest.mark.trt_build
def test_an_upper_case_onnx_suffix_is_an_onnx_model_everywhere(tmp_path, capsys) -> None:
    """m.ONNX (as some tools save it): inspect summarizes it, report runs it, compile builds it. Before,
    inspect and report called it 'a model, not an engine: build one first with trtforge compile m.ONNX',
    and compile then refused it as an unsupported model file."""
    model = tiny_onnx(tmp_path / "m.ONNX")
    rc, out = _run(["inspect", str(model), "--json"], capsys)
    assert rc == 0 and json.loads(out)["ops"] == {"MatMul": 1, "Add": 1, "Relu": 1}, out
    rc, out = _run(
        ["report", str(model), "-o", str(tmp_path / "rep"), "--targets", "ort,ort-fused", "--no-progress"],
        capsys,
    )
    assert rc == 0 and (tmp_path / "rep" / "report.json").is_file(), out
    rc, out = _run(["compile", str(model), "-o", str(tmp_path / "m.engine"), "-q"], capsys)
    assert rc == 0 and (tmp_path / "m.engine").is_file(), out


def test_inspect_detects_modified_engine(tmp_path, capsys) -> None:
    pytest.importorskip("tensorrt_rtx")
    model = tiny_onnx(tmp_path / "m.onnx")
    assert main(["compile", str(model), "-o", str(tmp_path / "m.engine"), "-q"]) == 0
    data = bytearray((tmp_path / "m.engine").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "m.engine").write_bytes(bytes(data))
    capsys.readouterr()
    rc, out = _run(["inspect", str(tmp_path / "m.engine")], capsys)
    assert rc == 2 and "does not match its manifest" in out


@pytest.mark.trt_build
def test_inspect_shows_every_distinct_profile_and_the_generation_section(
    tmp_path, capsys, monkeypatch
) -> None:
    """A step engine's decode profile (profile 1) was not shown: inspect printed profile 0 only. Each
    distinct profile gets a column, named by its generation phase; `streams` copies are shown once."""
    monkeypatch.setenv("COLUMNS", "200")
    model = tiny_onnx(tmp_path / "m.onnx")
    engine = tmp_path / "m.engine"
    assert main(["compile", str(model), "-o", str(engine), "--streams", "2", "-q"]) == 0
    capsys.readouterr()
    rc, out = _run(["inspect", str(engine)], capsys)
    assert rc == 0 and out.count("(min:opt:max)") == 1 and "1x4:8x4:32x4" in out, out
    # a copy of the pair is shown as the file inspected (was the name it was built under only)
    for suffix in ("", ".json"):
        (tmp_path / f"copy.engine{suffix}").write_bytes((tmp_path / f"m.engine{suffix}").read_bytes())
    rc, out = _run(["inspect", str(tmp_path / "copy.engine")], capsys)
    assert rc == 0 and f"{tmp_path / 'copy.engine'} (built as m.engine)" in out, out
    # the same engine described as a two-phase step engine (one stream): both ranges, by phase
    doc = json.loads((tmp_path / "m.engine.json").read_text())
    doc["streams"] = 1
    doc["profiles"] = [
        {"x": {"min": [1, 4], "opt": [8, 4], "max": [32, 4]}},
        {"x": {"min": [1, 4], "opt": [1, 4], "max": [2, 4]}},
    ]
    doc["generation"] = {
        "model_type": "llama",
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 1,
        "head_dim": 64,
        "max_batch": 2,
        "max_seq": 128,
        "cache": {"layout": "slot", "dtype": "float16"},
        "profiles": {"prefill": 0, "decode": 1},
    }
    (tmp_path / "m.engine.json").write_text(json.dumps(doc))
    rc, out = _run(["inspect", str(engine)], capsys)
    assert rc == 0, out
    assert "prefill (min:opt:max)" in out and "decode (min:opt:max)" in out, out
    assert "1x4:8x4:32x4" in out and "1x4:1x4:2x4" in out, out
    # and what the step engine is, as compile --generate said it (inspect showed nothing of it)
    line = "generation: llama 2 layers, 4 heads / 1 KV heads x 64, cache slot float16 [B<=2, 1, 128, 64]"
    assert f"{line}, profiles prefill=0 decode=1" in out, out


def _factory_module(tmp_path: Path) -> None:
    (tmp_path / "bad_factories.py").write_text(
        "def explode():\n    raise FileNotFoundError('checkpoint.pt is missing')\n"
    )


BAD_CASES = {
    "missing model file": (lambda d: [str(d / "nope.onnx")], "nope.onnx' does not exist"),
    "corrupt onnx bytes": (lambda d: [str(d / "corrupt.onnx")], "corrupt.onnx' is not a readable ONNX model"),
    "factory raises": (
        lambda d: ["bad_factories:explode"],
        "raised FileNotFoundError: checkpoint.pt is missing",
    ),
    "shape names unknown input": (
        lambda d: [str(d / "m.onnx"), "--shape", "tokens:1x4:2x4:4x4"],
        "unknown input(s) ['tokens']; the model's inputs are ['x']",
    ),
    "shape MIN > OPT": (lambda d: [str(d / "m.onnx"), "--shape", "x:8x4:2x4:16x4"], "MIN <= OPT <= MAX"),
    "unwritable output dir": (lambda d: [str(d / "m.onnx"), "-o", "/proc/m.engine"], "not writable"),
    "output dir missing": (lambda d: [str(d / "m.onnx"), "-o", str(d / "no/dir/m.engine")], "does not exist"),
    "bad opt level": (lambda d: [str(d / "m.onnx"), "--opt-level", "9"], "9 is not in the range"),
    "int8 without data": (lambda d: [str(d / "m.onnx"), "--precision", "int8"], "needs calibration data"),
    "calib data without int8": (
        lambda d: [str(d / "m.onnx"), "--calib-data", "x.npz"],
        "--calib-data is only used with --precision int8",
    ),
    "plugin attention on a backend without plugins": (
        lambda d: [str(d / "m.onnx"), "--attention", "plugin"],
        "--attention native",
    ),
    "no-passes with attention": (
        lambda d: [str(d / "m.onnx"), "--no-passes", "--attention", "native"],
        "--no-passes cannot be combined",
    ),
    "version-compatible on TensorRT-RTX": (
        lambda d: [str(d / "m.onnx"), "--version-compatible"],
        "TensorRT-RTX engines are tied to the RTX release",
    ),
    "unknown pass": (lambda d: [str(d / "m.onnx"), "--passes", "cleanup,fuse_everything"], "fuse_everything"),
    "export option for an onnx source": (
        lambda d: [str(d / "m.onnx"), "--dynamic", "batch", "--output-name", "y"],
        "--dynamic, --output-name only apply when exporting a torch module",
    ),
    "a step-engine option without --generate": (
        lambda d: [str(d / "m.onnx"), "--max-seq", "128"],
        "--max-seq only applies with --generate",  # (was "--max-seq only apply")
    ),
    "step-engine options without --generate": (
        lambda d: [str(d / "m.onnx"), "--max-seq", "128", "--max-batch", "2"],
        "--max-seq, --max-batch only apply with --generate",
    ),
    "fp16 option in fp32": (
        lambda d: [str(d / "m.onnx"), "--keep-fp32", "Relu"],
        "--keep-fp32 only applies to FP16/BF16 graphs",
    ),
    "int8 option without int8": (
        lambda d: [str(d / "m.onnx"), "--precision", "fp16", "--calib-method", "max"],
        "--calib-method is only used with --precision int8",
    ),
    "native attention in fp32": (
        lambda d: [str(d / "m.onnx"), "--attention", "native"],
        "--attention native needs an FP16/BF16 graph",
    ),
    "no-passes with verify": (
        lambda d: [str(d / "m.onnx"), "--no-passes", "--no-verify"],
        "--no-passes cannot be combined with --no-verify",
    ),
    "too many streams": (
        lambda d: [str(d / "m.onnx"), "--streams", "10000"],
        "10000 is not in the range 1<=x<=32",
    ),
    "huge shape dim": (lambda d: [str(d / "m.onnx"), "--shape", "x:1x4:2x4:1000000000x4"], "above the limit"),
    "overflowing shape dim": (
        lambda d: [str(d / "m.onnx"), "--shape", "x:1x4:2x4:99999999999999999999999999x4"],
        "above the limit of 1048576",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_exit_2_no_output(case: str, tmp_path, capsys, monkeypatch) -> None:
    tiny_onnx(tmp_path / "m.onnx")
    (tmp_path / "corrupt.onnx").write_bytes(b"\x0a\xff\xff\xff\xff\x0fnot an onnx model at all")
    _factory_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    make_args, expected = BAD_CASES[case]
    args = make_args(tmp_path)
    if "-o" not in args:
        args += ["-o", str(tmp_path / "out.engine")]
    rc, out = _run(["compile", *args], capsys)
    assert rc == 2, out
    assert expected in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "out.engine").exists() and not (tmp_path / "out.engine.json").exists()
    assert _leftovers(tmp_path) == []


@pytest.mark.trt_build
def test_compile_with_report(tmp_path, capsys) -> None:
    model = tiny_onnx(tmp_path / "m.onnx")
    argv = ["compile", str(model), "-o", str(tmp_path / "m.engine"), "--report", str(tmp_path / "rep"), "-q"]
    rc, out = _run(argv, capsys)
    assert rc == 0, out
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert (tmp_path / "rep" / "report.html").stat().st_size > 0
    assert {t["name"] for t in report["targets"]} >= {"ort", "ort-fused", "ort-fp16"}


@pytest.mark.trt_build
def test_compile_fp16_with_precision_data(tmp_path, capsys) -> None:
    import numpy as np

    model = tiny_onnx(tmp_path / "m.onnx")
    np.savez(tmp_path / "samples.npz", x=np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32))
    argv = [
        "compile",
        str(model),
        "-o",
        str(tmp_path / "m.engine"),
        "--precision",
        "fp16",
        "--precision-data",
        str(tmp_path / "samples.npz"),
    ]
    rc, out = _run(argv, capsys)
    assert rc == 0, out
    manifest = json.loads((tmp_path / "m.engine.json").read_text())
    assert manifest["precision"]["mode"] == "fp16"
    assert manifest["records"]["fp16"]["data_source"] == "user data"
    np.savez(tmp_path / "bad.npz", y=np.zeros((2, 4), np.float32))
    argv[-1] = str(tmp_path / "bad.npz")
    rc, out = _run([*argv, "--force"], capsys)
    assert rc == 2 and "bad.npz" in out, out


@pytest.mark.trt_build
def test_compiling_an_onnx_model_does_not_import_torch(tmp_path) -> None:
    """A plain ONNX model's compile needs no torch (its import cost ~2 s a run): only --generate and the
    module:factory / .pt2 inputs may load it."""
    import subprocess
    import sys
    import textwrap

    model = tiny_onnx(tmp_path / "m.onnx")
    code = textwrap.dedent(
        f"""
        import sys
        from trtforge.cli.main import main
        rc = main(["compile", {str(model)!r}, "-o", {str(tmp_path / "m.engine")!r}])
        assert rc == 0, rc
        print("torch" in sys.modules)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False", "compiling an ONNX model imported torch"


def test_the_int8_stage_line_counts_quantized_convolutions() -> None:
    """Before: a convolution net's INT8 stage read "0/0 MatMuls INT8" though its Convs were quantized."""
    import io

    from rich.console import Console

    from trtforge.cli._render import stage_summary_table

    def line(**rec: object) -> str:
        out = io.StringIO()
        table = stage_summary_table({"int8": {"method": "entropy", "samples": 16, "fallback": [], **rec}})
        Console(file=out, width=200).print(table)
        return out.getvalue()

    conv = line(matmuls_quantized=0, matmuls_total=0, quantized_by_op={"Conv": 2})
    assert "2 Conv INT8 (entropy, 16 samples)" in conv and "MatMuls" not in conv
    bert = line(matmuls_quantized=6, matmuls_total=8, quantized_by_op={"MatMul": 6, "Gemm": 1})
    assert "6/8 MatMuls, 1 Gemm INT8" in bert


@pytest.mark.trt_build
def test_compile_says_when_attention_was_built_decomposed(tmp_path, capsys) -> None:
    """Before: TensorRT-RTX printed "Internal Error: MyelinCheckException ... Attention operation was not
    supported by a dedicated kernel" on stderr, compile retried decomposed and exited 0, and its output
    never said what happened (the reason lived only in the manifest)."""
    from tests.compiler.test_build_attention import _attention_onnx, _shapes

    model = _attention_onnx(tmp_path / "a.onnx", head_size=8)
    argv = ["compile", str(model), "-o", str(tmp_path / "a.engine"), "--no-passes"]
    rc, out = _run([*argv, *(f for s in _shapes(8) for f in ("--shape", s))], capsys)
    assert rc == 0, out
    flat = " ".join(out.split())
    assert "attention attn built decomposed" in flat and "no fused attention kernel" in flat


@pytest.mark.trt_build
def test_a_build_that_recovers_leaves_stderr_clean(tmp_path, capfd) -> None:
    """Before: TensorRT-RTX wrote "Internal Error: MyelinCheckException ... Attention operation was not
    supported by a dedicated kernel" (and two blank lines) to descriptor 2 itself, past the ILogger, though
    compile went on to build the attention decomposed and said so; its INFO and VERBOSE messages, the
    logger's, print nothing either."""
    from tests.compiler.test_build_attention import _attention_onnx, _shapes

    model = _attention_onnx(tmp_path / "a.onnx", head_size=8)
    argv = ["compile", str(model), "-o", str(tmp_path / "a.engine"), "--no-passes", "-q"]
    assert main([*argv, *(f for s in _shapes(8) for f in ("--shape", s))]) == 0
    err = capfd.readouterr().err
    assert err == "", err
    manifest = json.loads((tmp_path / "a.engine.json").read_text())
    assert manifest["records"]["build"]["attention_decomposed"] == ["attn"]


@pytest.mark.trt_build
def test_a_step_engine_build_leaves_stderr_clean(tmp_path, capfd) -> None:
    """TensorRT's parser warns "Make sure input input_ids has Int64 binding." for each INT64 input, on every
    step engine: shown as warnings, they made a normal build's stderr four lines of noise; and -q printed
    transformers' "Loading weights" bar reading a save_pretrained directory."""
    from tests.llm.tiny_models import tiny_model

    tiny_model("llama").save_pretrained(tmp_path / "hf")
    capfd.readouterr()
    argv = ["compile", str(tmp_path / "hf"), "--generate", "-o", str(tmp_path / "g.engine")]
    assert main([*argv, "--max-seq", "32", "--max-batch", "2", "--exporter", "legacy", "-q"]) == 0
    err = capfd.readouterr().err
    assert err == "", err


@pytest.mark.trt_build
def test_an_ignored_timing_cache_is_said_not_only_recorded(tmp_path, capsys) -> None:
    """The README's backend table says TensorRT-RTX ignores --timing-cache "(warned)". Before: the
    warning went only into the manifest's build record; the command printed nothing of it."""
    model = tiny_onnx(tmp_path / "m.onnx")
    cache = tmp_path / "t.cache"
    argv = ["compile", str(model), "-o", str(tmp_path / "m.engine"), "--timing-cache", str(cache)]
    rc, out = _run(argv, capsys)
    assert rc == 0, out
    assert "warning: --timing-cache ignored" in " ".join(out.split())
    assert not cache.exists()
