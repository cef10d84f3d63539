"""Calibration datasets: every source, batching/limits/shuffle, and clear errors before heavy work."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.calibration import models
from trtforge.calibration.data import input_specs_from_model, load_dataset
from trtforge.core.tensor_spec import TensorSpec
from trtforge.errors import UserError

SPECS = [
    ("input_ids", np.dtype(np.int64), ("batch", "seq")),
    ("x", np.dtype(np.float32), (-1, 4)),
]


def _arrays(n: int = 10) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(0, 100, (n, 6)), "x": rng.standard_normal((n, 4)).astype(np.float32)}


def test_input_specs_from_model_reads_names_dtypes_dynamic_dims():
    specs = input_specs_from_model(models.mlp())
    assert specs == [TensorSpec("x", "float32", (-1, -1, 32), ("b", "s", None))]


def test_npz_batches_limit_and_shuffle(tmp_path):
    arr = _arrays(10)
    np.savez(tmp_path / "d.npz", **arr)
    ds = load_dataset(tmp_path / "d.npz", SPECS, batch_size=4, max_samples=9)
    batches = list(ds)
    assert [len(b["x"]) for b in batches] == [4, 4, 1]
    assert ds.num_samples == 9 and len(ds) == 3
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]), arr["x"][:9])
    shuffled = np.concatenate(
        [b["input_ids"] for b in load_dataset(tmp_path / "d.npz", SPECS, shuffle_seed=1)]
    )
    assert not np.array_equal(shuffled, arr["input_ids"])
    assert sorted(map(tuple, shuffled)) == sorted(map(tuple, arr["input_ids"]))


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "compressed"])
def test_an_npz_is_read_only_for_the_samples_used(tmp_path, monkeypatch, save):
    """Before: every array of a .npz was read whole (and checked) before --samples applied: 64 samples of
    a 20 GB file read 20 GB. Now a stored member is memory-mapped and a compressed one decompressed only
    as far as the last sample used; a NaN in a sample never used is never read."""
    from trtforge.calibration import sources

    monkeypatch.setattr(sources, "ZIP_READ_BYTES", 40)  # (compressed: 2 rows of x at a time)
    arr = _arrays(50)
    save(tmp_path / "d.npz", **arr)
    ds = load_dataset(tmp_path / "d.npz", SPECS, batch_size=4, max_samples=6, shuffle_seed=2)
    picked = np.random.default_rng(2).permutation(50)[:6]
    for name in ("x", "input_ids"):
        np.testing.assert_array_equal(np.concatenate([b[name] for b in ds]), arr[name][picked])
    arr["x"][40, 0] = np.nan
    save(tmp_path / "d.npz", **arr)
    ds = load_dataset(tmp_path / "d.npz", SPECS, batch_size=4, max_samples=6)
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in ds]), arr["x"][:6])
    if save is np.savez:
        assert all(isinstance(c["x"].base, np.memmap) or isinstance(c["x"], np.memmap) for c in ds._chunks)
    with pytest.raises(UserError, match=r"d\.npz': input 'x' contains 1 NaN/inf value\(s\) \(first at index"):
        load_dataset(tmp_path / "d.npz", SPECS)  # every sample used: every sample read and checked


@pytest.mark.parametrize("samples", [None, 4], ids=["all-samples", "4-samples"])
@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "compressed"])
def test_a_flipped_byte_inside_an_npz_member_is_refused_naming_the_file_and_member(tmp_path, save, samples):
    """Before: a stored member was memory-mapped and a compressed one read only as far as the samples
    used, so zipfile never compared the member's CRC-32 (it does so at the member's end): a byte flipped
    on disk gave other samples, and other scales, without a word. Now every member used is read to its
    end once, and its CRC checked."""
    import zipfile

    x = np.random.default_rng(0).standard_normal((100_000, 4)).astype(np.float32)
    path = tmp_path / "d.npz"
    save(path, x=x)
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("x.npy")
    raw = bytearray(path.read_bytes())
    data_at = info.header_offset + 30 + len(info.filename) + len(info.extra)
    raw[data_at + 20_000] ^= 0x40  # (past zipfile's read-ahead of the first rows)
    path.write_bytes(bytes(raw))
    with pytest.raises(UserError, match=r"d\.npz': member 'x\.npy' is corrupted: its bytes do not match"):
        load_dataset(path, [("x", np.dtype(np.float32), (-1, 4))], max_samples=samples)


def test_a_directory_is_opened_only_as_far_as_the_samples_used(tmp_path):
    """Unshuffled, the files after those holding --samples samples are not opened (before: every file was
    read whole first); shuffled, every file is opened (shapes only) and the samples picked are read."""
    a, b = _arrays(5), _arrays(7)
    np.savez(tmp_path / "a.npz", **a)
    np.savez_compressed(tmp_path / "b.npz", **b)
    ds = load_dataset(tmp_path, SPECS, batch_size=16, max_samples=9, shuffle_seed=4)
    both = {k: np.concatenate([a[k], b[k]]) for k in a}
    picked = np.random.default_rng(4).permutation(12)[:9]
    got = sorted(map(tuple, np.concatenate([batch["x"] for batch in ds])))
    assert got == sorted(map(tuple, both["x"][picked]))
    (tmp_path / "c.npz").write_bytes(b"PK\x03\x04 not a zip")
    ds = load_dataset(tmp_path, SPECS, batch_size=16, max_samples=12)
    np.testing.assert_array_equal(np.concatenate([batch["x"] for batch in ds]), both["x"])
    with pytest.raises(UserError, match=r"c\.npz' is not a readable \.npz file"):
        load_dataset(tmp_path, SPECS, max_samples=13)


def test_directory_of_npz_and_npy_with_different_shapes_never_mixes_a_batch(tmp_path):
    a = _arrays(3)
    b = {"input_ids": np.ones((2, 9), np.int32), "x": np.ones((2, 4), np.float32)}  # int32 -> cast to int64
    np.savez(tmp_path / "a.npz", **a)
    np.savez(tmp_path / "b.npz", **b)
    np.save(tmp_path / "input_ids.npy", np.zeros((1, 5), np.int64))
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
    ds = load_dataset(tmp_path, SPECS, batch_size=8)
    shapes = sorted(batch["input_ids"].shape for batch in ds)
    assert shapes == [(1, 5), (2, 9), (3, 6)]
    assert all(batch["input_ids"].dtype == np.int64 for batch in ds)


def test_npy_files_of_a_one_input_model_with_other_shapes_batch_apart_or_are_named(tmp_path):
    """A one-input model takes every .npy of a directory. Before: the files were concatenated, so a file
    of another sequence length or rank was numpy's ValueError ('all the input array dimensions ...'), an
    internal error (exit 1)."""
    specs = [("input_ids", np.dtype(np.int64), ("batch", "seq"))]
    np.save(tmp_path / "a.npy", np.ones((3, 6), np.int64))
    np.save(tmp_path / "b.npy", np.ones((2, 9), np.int64))
    ds = load_dataset(tmp_path, specs, batch_size=8)
    assert sorted(b["input_ids"].shape for b in ds) == [(2, 9), (3, 6)] and ds.num_samples == 5
    np.save(tmp_path / "c.npy", np.ones((4,), np.int64))
    with pytest.raises(UserError, match=r"'.*c\.npy': input 'input_ids' has rank 1"):
        load_dataset(tmp_path, specs)


def test_iterable_of_dicts_torch_dataloader_and_single_samples():
    torch = pytest.importorskip("torch")
    arr = _arrays(6)
    loader = torch.utils.data.DataLoader(
        [{k: torch.as_tensor(v[i]) for k, v in arr.items()} for i in range(6)], batch_size=4
    )
    ds = load_dataset(loader, SPECS, batch_size=2)
    assert ds.num_samples == 6 and [len(b["x"]) for b in ds] == [2, 2, 2]
    singles = [{k: v[i] for k, v in arr.items()} for i in range(3)]
    assert load_dataset(iter(singles), SPECS).num_samples == 3


def test_module_function_source(tmp_path, monkeypatch):
    (tmp_path / "calibdata_mod.py").write_text(
        "import numpy as np\n"
        "def batches():\n"
        "    for _ in range(3):\n"
        "        yield {'input_ids': np.zeros((2, 5), np.int64), 'x': np.zeros((2, 4), np.float32)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ds = load_dataset("calibdata_mod:batches", SPECS, max_samples=4)
    assert ds.num_samples == 4
    sys.modules.pop("calibdata_mod", None)


def test_a_stream_is_shuffled_whole_and_a_shuffled_count_of_it_is_refused(tmp_path, monkeypatch):
    """Before: --shuffle-seed with --samples N read a generator's first N samples (or more: as many as its
    items held) and only reordered those, unlike a file, where it picks a random N of all of them."""
    arr = _arrays(6)
    singles = [{k: v[i] for k, v in arr.items()} for i in range(6)]
    whole = load_dataset(iter(singles), SPECS, shuffle_seed=3)  # no count: read to its end, all shuffled
    ids = np.concatenate([b["input_ids"] for b in whole])
    assert not np.array_equal(ids, arr["input_ids"])
    assert sorted(map(tuple, ids)) == sorted(map(tuple, arr["input_ids"]))
    with pytest.raises(UserError, match=r"\(--samples 4\) picks a random 4 of all the samples, but calib"):
        load_dataset(iter(singles), SPECS, max_samples=4, shuffle_seed=3)
    (tmp_path / "calibstream_mod.py").write_text(
        "import numpy as np\n"
        "def endless():\n"
        "    while True:\n"
        "        yield {'input_ids': np.zeros((2, 5), np.int64), 'x': np.zeros((2, 4), np.float32)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=r"'calibstream_mod:endless' \(a module:function\) is read only"):
        load_dataset("calibstream_mod:endless", SPECS, max_samples=4, shuffle_seed=0, what="--data")
    sys.modules.pop("calibstream_mod", None)


def test_text_with_demo_tokenizer_pads_per_batch(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "s.txt").write_text(
        "Short one.\n\nA considerably longer sentence with many more words in it.\nHi.\n"
    )
    specs = [
        (n, np.dtype(np.int64), ("batch", "seq")) for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    ds = load_dataset(tmp_path / "s.txt", specs, batch_size=2, tokenizer="demo")
    b1, b2 = list(ds)
    assert ds.num_samples == 3
    assert b1["input_ids"].shape[1] > b2["input_ids"].shape[1]  # padded to each batch's longest
    assert b2["attention_mask"].all() and set(b1) == {"input_ids", "attention_mask", "token_type_ids"}


def test_text_for_a_fixed_sequence_length_is_padded_and_truncated_to_it(tmp_path):
    """A model exported with seq fixed to 12 takes exactly 12 tokens (before: padded to the batch's
    longest, then refused as 'size 7 on axis 1; the model requires 12')."""
    pytest.importorskip("transformers")
    (tmp_path / "s.txt").write_text("Hi.\n" + "a much longer sentence " * 20 + "\n")
    specs = [(n, np.dtype(np.int64), ("batch", 12)) for n in ("input_ids", "attention_mask")]
    (batch,) = list(load_dataset(tmp_path / "s.txt", specs, batch_size=2, tokenizer="demo"))
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, 12)
    assert batch["attention_mask"][0].sum() < 12 and batch["attention_mask"][1].all()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda a: a.update(ids=a.pop("input_ids")), "input names do not match"),
        (lambda a: a.update(x=a["x"].astype(np.int64)), "dtype int64; the model expects float32"),
        (lambda a: a.update(input_ids=a["input_ids"][:, :, None]), "rank 3"),
        (lambda a: a.update(x=np.ones((10, 5), np.float32)), "size 5 on axis 1; the model requires 4"),
        (lambda a: a["x"].__setitem__((3, 1), np.nan), "NaN/inf"),
        (lambda a: a.update({k: v[:0] for k, v in a.items()}), "empty"),
    ],
    ids=["names", "dtype", "rank", "static-dim", "nan", "empty"],
)
def test_bad_npz_is_rejected_naming_the_file_and_input(tmp_path, mutate, message):
    arr = _arrays(10)
    mutate(arr)
    np.savez(tmp_path / "bad.npz", **arr)
    with pytest.raises(UserError, match=message) as e:
        load_dataset(tmp_path / "bad.npz", SPECS)
    assert "bad.npz" in str(e.value)


def test_text_without_tokenizer_and_missing_path_are_user_errors(tmp_path):
    (tmp_path / "s.txt").write_text("One sentence here.\n")
    with pytest.raises(UserError, match="needs a tokenizer"):
        load_dataset(tmp_path / "s.txt", SPECS)
    with pytest.raises(UserError, match="does not exist"):
        load_dataset(tmp_path / "nope.npz", SPECS)


def test_split_holds_out_the_last_samples(tmp_path):
    np.savez(tmp_path / "d.npz", **_arrays(10))
    calib, held = load_dataset(tmp_path / "d.npz", SPECS, batch_size=3).split(4)
    assert (calib.num_samples, held.num_samples) == (6, 4)
    all_x = np.concatenate([b["x"] for b in calib] + [b["x"] for b in held])
    np.testing.assert_array_equal(all_x, _arrays(10)["x"])


def test_static_batch_model_gets_full_batches_only(tmp_path):
    specs = [("x", np.dtype(np.float32), (4, 3))]
    np.savez(tmp_path / "d.npz", x=np.zeros((10, 3), np.float32))
    ds = load_dataset(tmp_path / "d.npz", specs, batch_size=8)
    assert [b["x"].shape for b in ds] == [(4, 3), (4, 3)] and len(ds) == 2
    with pytest.raises(UserError, match="static batch size 4"):
        load_dataset(tmp_path / "d.npz", specs, max_samples=3)


def test_a_static_batch_no_shape_of_the_samples_can_fill_is_refused_at_load(tmp_path):
    """Samples of different shapes never share a batch, so with a static batch of 4 and 3 samples of each
    of 3 shapes no batch forms. Before: all 9 were dropped, and calibration ran to blame 'no value at all
    ... a zero-length axis'."""
    specs = [("x", np.dtype(np.float32), (4, "seq"))]
    for i, seq in enumerate((3, 5, 7)):
        np.savez(tmp_path / f"{i}.npz", x=np.ones((3, seq), np.float32))
    with pytest.raises(
        UserError,
        match=r"static batch size 4, and calibration data .* has no 4 samples of one shape to fill a batch "
        r"\(samples of different shapes never share one\): its 9 samples come in 3 shapes, at most 3 of each",
    ):
        load_dataset(tmp_path, specs)


def test_float_data_for_a_bfloat16_input_is_cast_and_a_scalar_input_is_refused(tmp_path):
    """Before: float32 data for a bfloat16 input was refused as 'not floating data' (ml_dtypes' kind is
    'V'), and a rank-0 model input crashed with an IndexError."""
    import ml_dtypes

    np.savez(tmp_path / "x.npz", x=np.linspace(-1, 1, 8 * 4, dtype=np.float32).reshape(8, 4))
    bf16 = [("x", np.dtype(ml_dtypes.bfloat16), ("batch", 4))]
    (batch,) = list(load_dataset(tmp_path / "x.npz", bf16, batch_size=8))
    assert batch["x"].dtype == np.dtype(ml_dtypes.bfloat16) and batch["x"].shape == (8, 4)
    np.savez(tmp_path / "s.npz", x=np.float32(1.0))
    with pytest.raises(UserError, match=r"'x' is a scalar \(rank 0\), so calibration data"):
        load_dataset(tmp_path / "s.npz", [("x", np.dtype(np.float32), ())])


@pytest.mark.parametrize("seed", [-1, 2.5, "3", True])
def test_a_shuffle_seed_that_is_not_a_natural_number_is_refused(tmp_path, seed):
    """Before: numpy's ValueError('expected non-negative integer') as an internal error."""
    np.savez(tmp_path / "d.npz", **_arrays())
    with pytest.raises(UserError, match=r"shuffle seed \(--shuffle-seed\) must be an integer >= 0"):
        load_dataset(tmp_path / "d.npz", SPECS, shuffle_seed=seed)


def test_an_empty_path_is_refused_not_read_as_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "d.npz", **_arrays())  # the current directory holds valid data: still refused
    with pytest.raises(UserError, match=r"--data is an empty path"):
        load_dataset("", SPECS, what="--data")


@pytest.mark.parametrize("head", [b"\x08\x07\x12\x00onnx model", b"ftrt\x00\x00\x01", b"\xff\xfe\xfa binary"])
def test_a_binary_file_is_not_taken_for_text(tmp_path, head):
    """Before: a model or engine given as data was 'a text file' needing a tokenizer."""
    (tmp_path / "m.onnx").write_bytes(head * 50)
    with pytest.raises(UserError, match=r"'.*m\.onnx' is a binary file, not data: expected a \.npz"):
        load_dataset(tmp_path / "m.onnx", SPECS, tokenizer="demo")


@pytest.mark.parametrize("name", ["calib.bin", "s.txt"])
@pytest.mark.parametrize("tokenizer", [None, "demo"])
def test_an_empty_file_is_said_to_be_empty(tmp_path, name, tokenizer):
    """Before: an empty file (a download that failed) was 'a text file: tokenizing it needs a tokenizer',
    and with one, 'no non-empty lines'."""
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(UserError, match=rf"'.*{name}' is empty \(0 bytes\), not data: expected a \.npz"):
        load_dataset(tmp_path / name, SPECS, tokenizer=tokenizer)


def test_utf8_text_cut_inside_a_character_at_the_read_boundary_is_still_text(tmp_path):
    from trtforge.calibration.sources import _is_binary

    path = tmp_path / "s.txt"
    path.write_text("a" * 8191 + "é\n", encoding="utf-8")  # 'é' straddles the 8 KiB head
    assert not _is_binary(path)


def test_ragged_lists_and_bfloat16_tensors_from_an_iterable(tmp_path):
    """Before: a sample of ragged nested lists was numpy's ValueError ('inhomogeneous shape') and a
    torch bfloat16 tensor torch's TypeError ('unsupported ScalarType BFloat16'), both internal errors."""
    torch = pytest.importorskip("torch")
    specs = [("x", np.dtype(np.float32), ("batch", 4))]
    with pytest.raises(UserError, match=r"item 1: input 'x' is not one array \(numpy: .*inhomogeneous"):
        load_dataset([{"x": [[1.0, 2, 3, 4]]}, {"x": [[1.0, 2, 3, 4], [1.0, 2]]}], specs)
    with pytest.raises(UserError, match=r"calibration arrays: input 'x' is not one array"):
        load_dataset({"x": [[1.0, 2, 3, 4], [1.0]]}, specs)
    x = torch.linspace(-1, 1, 8).reshape(2, 4).to(torch.bfloat16)
    (batch,) = list(load_dataset([{"x": x}], specs))
    np.testing.assert_array_equal(batch["x"], x.float().numpy())


def test_values_the_models_dtype_cannot_hold_are_refused_not_cast_to_inf_or_wrapped(tmp_path):
    """Before: float64 1e300 for a float32 input passed the NaN/inf check and became inf in the cast (an
    activation 'with no finite value' was then blamed on the model), float32 1e5 for a float16 input too,
    and int64 ids past int32 wrapped around to other ids silently."""
    np.savez(tmp_path / "big.npz", x=np.full((2, 4), 1e300))
    with pytest.raises(UserError, match=r"'x' holds values as large as 1e\+300, beyond the range"):
        load_dataset(tmp_path / "big.npz", [("x", np.dtype(np.float32), ("batch", 4))])
    np.savez(tmp_path / "half.npz", x=np.full((2, 4), 1e5, np.float32))
    with pytest.raises(UserError, match=r"beyond the range of the model's float16"):
        load_dataset(tmp_path / "half.npz", [("x", np.dtype(np.float16), ("batch", 4))])
    np.savez(tmp_path / "ids.npz", input_ids=np.array([[1, 2**32 + 1]], np.int64))
    with pytest.raises(UserError, match=r"holds 4294967297, outside the range of the model's int32"):
        load_dataset(tmp_path / "ids.npz", [("input_ids", np.dtype(np.int32), ("batch", "seq"))])
    np.savez(tmp_path / "ok.npz", input_ids=np.array([[1, 2]], np.int64), x=np.ones((1, 4)))
    specs = [("input_ids", np.dtype(np.int32), ("batch", "seq")), ("x", np.dtype(np.float16), ("batch", 4))]
    (batch,) = list(load_dataset(tmp_path / "ok.npz", specs))
    assert batch["input_ids"].dtype == np.int32 and batch["x"].dtype == np.float16


def test_a_text_file_with_a_byte_order_mark_and_crlf_lines_gives_the_sentences_alone(tmp_path):
    """Notepad's UTF-8 starts with a BOM and ends lines with CRLF. Before: the BOM stayed on the first
    sentence, and a byte-level BPE tokenizer (GPT-2's, Llama's) made it 3 tokens of calibration data."""
    seen: list[list[str]] = []

    def tok(batch, **_):
        seen.append(list(batch))
        return {"input_ids": np.ones((len(batch), 3), np.int64)}

    (tmp_path / "s.txt").write_bytes("\ufefffirst line\r\nsecond line\r\n".encode())
    specs = [("input_ids", np.dtype(np.int64), ("batch", "seq"))]
    list(load_dataset(tmp_path / "s.txt", specs, tokenizer=tok, batch_size=2))
    assert seen[-1] == ["first line", "second line"]


def test_sentences_from_a_pipe_are_read_whole(tmp_path):
    """`--data <(head -n 1000 s.txt)` is a pipe. Before: the binary check read its first 8 KiB and the
    sentences were what followed, so those lines were silently lost (1704 of 2000 samples calibrated)."""
    import os
    import threading

    lines = [f"sentence number {i} is here" for i in range(2000)]
    fifo = tmp_path / "s.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as f:
            f.write("\n".join(lines) + "\n")

    writer = threading.Thread(target=write)
    writer.start()
    seen: list[str] = []

    def tok(batch, **_):
        seen.extend(batch)
        return {"input_ids": np.ones((len(batch), 3), np.int64)}

    specs = [("input_ids", np.dtype(np.int64), ("batch", "seq"))]
    ds = load_dataset(fifo, specs, tokenizer=tok, batch_size=500)
    writer.join()
    assert ds.num_samples == 2000
    seen.clear()
    list(ds)
    assert seen == lines


def test_npz_and_npy_files_are_known_by_their_content_or_an_upper_case_suffix(tmp_path):
    """Before: CALIB.NPZ, or numpy.savez output renamed calib.bin, was 'a binary file, not data: expected
    a .npz'."""
    arr = _arrays(5)
    np.savez(tmp_path / "a.npz", **arr)
    (tmp_path / "a.npz").rename(tmp_path / "CALIB.NPZ")
    np.savez(tmp_path / "b.npz", **arr)
    (tmp_path / "b.npz").rename(tmp_path / "calib.bin")
    for name in ("CALIB.NPZ", "calib.bin"):
        assert load_dataset(tmp_path / name, SPECS).num_samples == 5
    np.save(tmp_path / "x.npy", arr["x"])
    (tmp_path / "x.npy").rename(tmp_path / "x.data")
    specs = [("x", np.dtype(np.float32), (-1, 4))]
    (batch,) = list(load_dataset(tmp_path / "x.data", specs))
    np.testing.assert_array_equal(batch["x"], arr["x"])


def _header_only_npy(shape: tuple[int, ...]) -> bytes:
    """A float32 .npy header declaring `shape`, followed by 64 bytes of data: what a hostile or truncated
    file holds."""
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + b"\0" * 64


@pytest.mark.parametrize("compression", ["stored", "deflated"])
def test_a_header_declaring_more_data_than_the_file_holds_is_refused_before_allocating(tmp_path, compression):
    """Before: a compressed member declaring 10**12 samples was believed until its samples were indexed or
    allocated (numpy's MemoryError, an internal error), and a stored one was numpy.memmap's 'mmap length
    is greater than file size'."""
    import zipfile

    mode = zipfile.ZIP_DEFLATED if compression == "deflated" else zipfile.ZIP_STORED
    with zipfile.ZipFile(tmp_path / "c.npz", "w", compression=mode) as z:
        z.writestr("x.npy", _header_only_npy((10**12, 4)))
    (tmp_path / "c.npy").write_bytes(_header_only_npy((10**12, 4)))
    specs = [("x", np.dtype(np.float32), (-1, 4))]
    for name, what in (("c.npz", "member 'x.npy'"), ("c.npy", "its header")):
        for samples in (None, 4):
            with pytest.raises(
                UserError,
                match=rf"'.*{name}'.*{what} declares a float32 array of shape "
                r"\[1000000000000, 4\] \(16,000,000,000,000 bytes\) but holds 64 bytes",
            ):
                load_dataset(tmp_path / name, specs, max_samples=samples)


def test_samples_of_no_bytes_declared_by_the_trillion_are_not_indexed_whole(tmp_path):
    """A [10**12, 0] array holds no bytes, so its size is no bound on its sample count: the samples used
    are indexed, not all that the header declares (before: np.arange(10**12), numpy's MemoryError)."""
    import zipfile

    buf = _header_only_npy((10**12, 0))[:-64]
    with zipfile.ZipFile(tmp_path / "c.npz", "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", buf)
    specs = [("x", np.dtype(np.float32), ("b", "n"))]
    assert load_dataset(tmp_path / "c.npz", specs, max_samples=4).num_samples == 4
    with pytest.raises(UserError, match=r"holds 1,000,000,000,000 samples, too many to index .* --samples N"):
        load_dataset(tmp_path / "c.npz", specs)


@pytest.mark.parametrize("layout", ["c.npz", "c.npy", "dir/a.npz", "dir/x.npy"])
def test_a_pipe_named_like_an_array_file_is_refused_not_waited_on(tmp_path, layout):
    """Before: the reader opened the pipe and waited for a writer forever (a .npz or .npy is read by
    seeking, so a pipe could never have served). The load runs in a thread so that, were it to block, the
    test fails instead of hanging; the pipe is then opened for writing to release it."""
    import os
    import threading

    path = tmp_path / layout
    path.parent.mkdir(exist_ok=True)
    os.mkfifo(path)
    specs = [("x", np.dtype(np.float32), (-1, 4))]
    errors: list[BaseException] = []

    def load() -> None:
        try:
            load_dataset(tmp_path / layout.split("/")[0], specs)
        except BaseException as e:  # (handed to the test's thread)
            errors.append(e)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(10)
    blocked = t.is_alive()
    if blocked:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # (a reader is waiting: this cannot fail)
        t.join(10)
    assert not blocked, "the reader waited on the pipe"
    assert isinstance(errors[0], UserError)
    assert f"calibration array file '{path}' is not a regular file (a pipe or device?)" in str(errors[0])


def _zip_bytes(compression: int) -> bytes:
    """A .npz of x [8, 4] float32 whose member is written with zip `compression`."""
    import io
    import zipfile

    npy, out = io.BytesIO(), io.BytesIO()
    np.save(npy, np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    with zipfile.ZipFile(out, "w", compression=compression) as z:
        z.writestr("x.npy", npy.getvalue())
    return out.getvalue()


def _encrypted(raw: bytearray) -> None:
    raw[6] |= 1  # (the encryption flag, in the local and the central header)
    raw[raw.rfind(b"PK\x01\x02") + 8] |= 1


def _method_99(raw: bytearray) -> None:
    raw[8:10] = (99).to_bytes(2, "little")  # (WinZip's AES: a method zipfile does not read)
    at = raw.rfind(b"PK\x01\x02") + 10
    raw[at : at + 2] = (99).to_bytes(2, "little")


def _corrupt_lzma(raw: bytearray) -> None:
    for i in range(60, 140):
        raw[i] ^= 0x5A


@pytest.mark.parametrize(
    ("compression", "spoil", "message"),
    [
        (0, _encrypted, r"ValueError: member 'x\.npy' is encrypted"),
        (
            0,
            _method_99,
            r"ValueError: member 'x\.npy' is compressed with zip method 99, which Python's zipfile "
            r"cannot read",
        ),
        (14, _corrupt_lzma, r"LZMAError: Corrupt input data"),
        (
            0,
            lambda raw: raw.__setitem__(slice(None), raw.replace(b"x.npy", b"x.pkl")),
            "ValueError: a zip archive of no "
            r"\.npy arrays \(1 other member\(s\): x\.pkl\)",
        ),
    ],
    ids=["encrypted", "zip-method-99", "corrupt-lzma", "no-npy-member"],
)
def test_a_zip_numpy_cannot_read_is_named_not_an_internal_error(tmp_path, compression, spoil, message):
    """Before: zipfile's RuntimeError (encrypted), NotImplementedError (method 99) and LZMAError were
    internal errors (exit 1), and a zip of no .npy member (torch.save's, named .npz) said the data had the
    input names []."""
    raw = bytearray(_zip_bytes(compression))
    spoil(raw)
    (tmp_path / "c.npz").write_bytes(bytes(raw))
    specs = [("x", np.dtype(np.float32), (-1, 4))]
    with pytest.raises(UserError, match=rf"'.*c\.npz' is not a readable \.npz file \({message}"):
        load_dataset(tmp_path / "c.npz", specs)


def test_keys_of_mixed_types_or_huge_size_are_named_in_a_bounded_message():
    """A data function's dict may mix key types, and its keys may be huge or many. Before: sorting the names
    for the message raised TypeError ('<' not supported between 'str' and 'int', an internal error), and a
    key of a million characters or 100,000 keys were quoted whole."""
    specs = [("x", np.dtype(np.float32), (-1, 4))]
    x = np.ones((2, 4), np.float32)
    with pytest.raises(UserError, match=r"the data has \['x', 1\] \(unknown \[1\]\)\."):
        load_dataset([{1: x, "x": x}], specs)
    for item in ({"k" * 1_000_000: x}, {f"k{i}": x for i in range(100_000)}):
        with pytest.raises(UserError, match=r"the data has \['k.*…") as e:
            load_dataset([item], specs)
        assert len(str(e.value)) < 1_000
