"""Export an engine to a Triton Inference Server model repository (tensorrt-facts.md §7).

Writes `REPO/NAME/config.pbtxt` and `REPO/NAME/VERSION/model.plan` (VERSION 1 by default) from the
engine's manifest, parsed first with tritonclient's model_config protobuf and checked against the
manifest, into a directory staged beside the model's (`_fileio.staged_directory`) that then takes its
place. Into an existing model directory (without `force`) it adds only the version directory, staged the
same way, and only when the model's config.pbtxt is the one this engine needs: Triton serves all the
versions of a model with one config. A decoder step engine (a manifest with a generation section) is
refused: a Triton model of one step cannot generate (`trtforge serve` serves it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtforge._fileio import (
    check_name_length,
    directory_lock,
    os_error,
    recover_staged_directory,
    show_path,
    staged_directory,
    sweep_staged_directories,
    write_synced,
)
from trtforge.core.manifest import (
    Manifest,
    TensorSpec,
    manifest_path_for,
    read_engine,
    recorded_symbols,
)
from trtforge.errors import UserError, is_int

TRITON_DTYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}
MAX_INT32 = 2**31 - 1  # Triton's max_batch_size, preferred_batch_size and instance count are int32
MAX_INT64 = 2**63 - 1  # Triton's dims
MAX_UINT64 = 2**64 - 1  # Triton's max_queue_delay_microseconds is a uint64
MAX_VERSION = 2**63 - 1  # Triton reads a version directory's name as an int64
# an ONNX axis name that says batch: batch, batch_size, Batch, N, B, bs, bsz (any case)
BATCH_NAME = re.compile(r"(?i).*batch.*|n|b|bs|bsz")
PIP_HINT = 'pip install "tritonclient[grpc]"   (or: pip install "trtforge[triton]")'


@dataclass
class TritonOptions:
    """What to write. `max_batch=None` takes the largest batch every profile allows, or 0 (no batching) where
    axis 0 is not the batch of every input and output (:func:`_batch_limit`)."""

    name: str | None = None
    max_batch: int | None = None
    instances: int = 1
    dynamic_batching: bool | None = None
    preferred_batch_sizes: list[int] = field(default_factory=list)
    max_queue_delay_us: int = 0
    force: bool = False
    validate: bool = True
    version: int = 1


@dataclass
class TritonExport:
    """Where the model landed and the config it got."""

    model_dir: Path
    config_path: Path
    plan_path: Path
    config_text: str
    max_batch_size: int
    validated: bool
    version: int = 1
    added_version: bool = False  # True: a version added to an existing model (its config.pbtxt kept)
    note: str = ""  # why max_batch_size is 0 when the engine's axis 0 is not (taken for) a batch


def _batch_limit(m: Manifest, where: str) -> tuple[int, str, str]:
    """The largest batch Triton may send (0 when the engine cannot batch along axis 0) with why, and a doubt:
    why axis 0, though it could be the batch, is not taken for one unless --max-batch says so. Triton splits
    and joins every input and output along axis 0 with one size."""
    tensors = [("input", t) for t in m.inputs] + [("output", t) for t in m.outputs]
    for kind, t in tensors:
        if not t.shape or t.shape[0] != -1:
            dynamic = [a for a, d in enumerate(t.shape) if d == -1]
            size = "absent (a scalar)" if not t.shape else f"static ({t.shape[0]})"
            moved = f" (its dynamic axis is axis {dynamic[0]})" if dynamic else ""
            return 0, f"axis 0 of {kind} '{t.name}' is {size}, not a batch axis{moved}", ""
    if not m.profiles:
        return 0, "the engine has no optimization profiles", ""
    mins = {r.min[0] for p in m.profiles for r in p.values()}
    if mins != {1}:
        return 0, f"the profiles' minimum batch is {sorted(mins)}, Triton needs batch 1 to be valid", ""
    why, doubt = _named_axes(m, where)
    return (0 if why else min(r.max[0] for p in m.profiles for r in p.values())), why, doubt


def _named_axes(m: Manifest, where: str) -> tuple[str, str]:
    """What the ONNX axis names that compile recorded (none in an engine built before it did) say against
    axis 0 being the batch: why it cannot be (its name stands at another axis too, or a batch-named axis
    stands past axis 0), or a doubt (an input's axis 0 named unlike a batch, or the inputs' differently)."""
    names = {kind: recorded_symbols(m.records, f"{kind}s", where) for kind in ("input", "output")}
    tensors = [("input", t) for t in m.inputs] + [("output", t) for t in m.outputs]
    later: dict[str, str] = {}  # an axis name -> the first tensor axis past 0 that has it
    for kind, t in tensors:
        for axis, sym in enumerate(names[kind].get(t.name, [])[1:], 1):
            if sym:
                later.setdefault(sym, f"axis {axis} of {kind} '{t.name}'")
    firsts = [(kind, t.name, (names[kind].get(t.name) or [None])[0]) for kind, t in tensors]
    for kind, name, sym in firsts:
        if sym in later:
            return f"axis 0 of {kind} '{name}' is '{sym}', which is {later[sym]}, not a batch axis", ""
    moved = next((f"{at} (named '{sym}')" for sym, at in later.items() if "batch" in sym.lower()), None)
    if moved:
        return f"the batch is {moved}, not axis 0", ""
    named = [(name, sym) for kind, name, sym in firsts if kind == "input" and sym]
    odd = [(name, sym) for name, sym in named if not BATCH_NAME.fullmatch(sym)]
    if odd:
        return "", f"axis 0 of input '{odd[0][0]}' is named '{odd[0][1]}' in the model, not a batch"
    if len({sym for _, sym in named}) > 1:
        listed = ", ".join(f"'{sym}' ({name})" for name, sym in named)
        return "", f"axis 0 of the inputs has different names in the model: {listed}"
    return "", ""


def _dims(spec: TensorSpec, batched: bool) -> list[int]:
    """The config's `dims` of a tensor: its shape past the batch dimension. A tensor that is only the batch
    dimension ([-1]) gets [1], with an empty `reshape` (Triton refuses empty dims)."""
    dims = spec.shape[1:] if batched else spec.shape
    return dims or [1]


def _check_servable(kind: str, t: TensorSpec, batched: bool) -> None:
    """UserError for a tensor Triton's model configuration cannot describe (it checks dims are >= 1 or -1
    and refuses scalars in a model that does not batch)."""
    if not t.name:  # (Triton refuses it at load: "must specify 'name'")
        raise UserError(
            f"an {kind} of the engine's manifest has an empty name, and Triton's config.pbtxt needs a name "
            "for every input and output (it refuses the model at load otherwise); the manifest is "
            "corrupted: rebuild the engine with `trtforge compile`."
        )
    if not _utf8(t.name):  # (a manifest edited by hand: JSON may spell a lone surrogate, \udc80)
        raise UserError(
            f"{kind} {t.name!r} of the engine's manifest is not valid UTF-8 text, which Triton's "
            "config.pbtxt needs for every tensor name; the manifest is corrupted: rebuild the engine with "
            "`trtforge compile`."
        )
    if "\x00" in t.name:  # (TensorRT's names are C strings: Triton's backend would look up 'y' for 'y\0z')
        raise UserError(
            f"{kind} {t.name!r} of the engine's manifest holds a NUL character, which no TensorRT tensor "
            "name can (Triton would look the tensor up by the name cut there); the manifest is corrupted: "
            "rebuild the engine with `trtforge compile`."
        )
    if t.dtype not in TRITON_DTYPES:
        raise UserError(
            f"{kind} '{t.name}' has dtype {t.dtype}, which Triton's TensorRT backend cannot serve "
            f"(it serves {', '.join(sorted(TRITON_DTYPES))}). Rebuild the engine with that tensor in "
            "one of these types."
        )
    if not t.shape and not batched:
        raise UserError(
            f"{kind} '{t.name}' is a scalar (shape []), and Triton serves no scalar tensor in a model "
            "that does not batch (max_batch_size 0). Give it a dimension (shape [1]) in the model."
        )
    bad = [d for d in (t.shape[1:] if batched else t.shape) if d < 1 and d != -1]
    if bad:
        raise UserError(
            f"{kind} '{t.name}' has shape {list(t.shape)}: Triton accepts dimensions >= 1 or -1 (variable) "
            "only, so a model with an empty (zero-size) dimension cannot be described in config.pbtxt."
        )
    if any(d > MAX_INT64 for d in t.shape):  # (a manifest edited by hand: TensorRT's dims are int64)
        raise UserError(
            f"{kind} '{t.name}' has shape {list(t.shape)} in the engine's manifest, a dimension past the "
            f"signed 64-bit integers ({MAX_INT64}) that TensorRT and Triton's dims hold; the manifest is "
            "corrupted: rebuild the engine with `trtforge compile`."
        )


def _tensor_block(kind: str, specs: list[TensorSpec], batched: bool) -> str:
    items = []
    for t in specs:
        _check_servable(kind, t, batched)
        dims = ", ".join(str(d) for d in _dims(t, batched))
        # a tensor of only the batch dimension: dims [1], reshaped to [] (Triton's documented form)
        reshape = "\n    reshape: { shape: [ ] }" if batched and len(t.shape) == 1 else ""
        items.append(
            f"  {{\n    name: {pbtxt_string(t.name)}\n    data_type: {TRITON_DTYPES[t.dtype]}\n"
            f"    dims: [ {dims} ]{reshape}\n  }}"
        )
    return f"{kind} [\n" + ",\n".join(items) + "\n]\n"


def pbtxt_string(text: str) -> str:
    """`text` as a protobuf text-format string literal: quotes, backslashes and control characters escaped
    (a tensor named 'a"b' must not end the literal early)."""
    escaped = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    body = "".join(
        escaped.get(ch) or (f"\\{ord(ch):03o}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch) for ch in text
    )
    return f'"{body}"'


def render_config(
    m: Manifest, name: str, opts: TritonOptions, where: str = "the engine's manifest"
) -> tuple[str, int, str]:
    """config.pbtxt text for the engine described by `m` (its manifest at `where`), the max_batch_size
    used, and a note saying why it is 0 when the engine's axis 0 is not (taken for) a batch."""
    limit, why, doubt = _batch_limit(m, where)
    if opts.max_batch is not None and (not is_int(opts.max_batch) or opts.max_batch < 0):
        raise UserError(
            f"--max-batch {opts.max_batch!r}: expected a whole number >= 0 (0 turns batching off)."
        )
    not_int = [b for b in opts.preferred_batch_sizes if not is_int(b)]
    if not_int:
        raise UserError(f"--preferred-batch-size {not_int!r}: expected whole numbers (batch sizes).")
    note = ""
    if opts.max_batch is None:
        max_batch = 0 if doubt else min(limit, MAX_INT32)  # (a profile may allow more than Triton reads)
        if doubt:
            why = f"{doubt}; pass --max-batch N if axis 0 is the batch of every input and output"
        if not max_batch:
            note = f"max_batch_size 0, so Triton does not batch requests: {why}."
    elif opts.max_batch > MAX_INT32:
        raise UserError(
            f"--max-batch {opts.max_batch} is out of range: Triton reads max_batch_size as a signed 32-bit "
            f"integer, at most {MAX_INT32}."
        )
    elif opts.max_batch and not limit:
        raise UserError(
            f"--max-batch {opts.max_batch}: Triton cannot batch this engine, since it splits and joins "
            f"requests along axis 0 of every input and output, and {why}. Pass --max-batch 0 (the default "
            "here: no batching), or rebuild the engine with the batch as axis 0 of every input and output."
        )
    elif opts.max_batch > limit:
        raise UserError(
            f"--max-batch {opts.max_batch} exceeds what the engine's optimization profiles allow: "
            f"at most {limit}. Rebuild with a larger batch range in --shape, or lower --max-batch."
        )
    else:
        max_batch = opts.max_batch
    batched = max_batch > 0
    dynamic = opts.dynamic_batching if opts.dynamic_batching is not None else max_batch > 1
    if dynamic and not batched:
        why = why if opts.max_batch is None else "--max-batch 0 turns batching off"
        raise UserError(f"--dynamic-batching needs a batching engine; this one cannot batch: {why}.")
    if not 0 <= opts.max_queue_delay_us <= MAX_UINT64:
        raise UserError(
            f"--max-queue-delay-us {opts.max_queue_delay_us} is out of range: Triton reads it as an unsigned "
            f"64-bit count of microseconds, 0..{MAX_UINT64}."
        )
    batcher = [
        f
        for f, given in (
            ("--preferred-batch-size", opts.preferred_batch_sizes),
            ("--max-queue-delay-us", opts.max_queue_delay_us),
        )
        if given
    ]
    if batcher and not dynamic:
        if opts.dynamic_batching is False:
            off = "--no-dynamic-batching turns it off"
        elif not batched:
            off = "the model does not batch (max_batch_size 0), so there is no batcher"
        else:
            off = f"it is off by default at max batch size {max_batch}; pass --dynamic-batching to turn it on"
        verb = "configure" if len(batcher) > 1 else "configures"
        raise UserError(f"{' and '.join(batcher)} {verb} Triton's dynamic batcher, but {off}.")
    bad_pref = [b for b in opts.preferred_batch_sizes if not 1 <= b <= max_batch]
    if bad_pref:
        raise UserError(f"--preferred-batch-size {bad_pref} outside 1..{max_batch} (the max batch size).")
    if not is_int(opts.instances) or not 1 <= opts.instances <= MAX_INT32:
        raise UserError(
            f"--instances {opts.instances!r} is out of range: expected a whole number from 1 to {MAX_INT32} "
            "(Triton reads an instance group's count as a signed 32-bit integer)."
        )
    dynamic_shapes = any(-1 in t.shape for t in m.inputs)
    per_copy = len(m.profiles) // max(m.streams, 1) if m.profiles else 0
    if dynamic_shapes and opts.instances > max(m.streams, 1):
        raise UserError(
            f"--instances {opts.instances}: concurrent execution contexts of a dynamic-shape engine need "
            f"distinct optimization profiles, and this engine has {m.streams} copy(ies). Rebuild with "
            f"`trtforge compile --streams {opts.instances}`."
        )
    lines = [
        f"name: {pbtxt_string(name)}",
        'platform: "tensorrt_plan"',
        f"max_batch_size: {max_batch}",
        _tensor_block("input", m.inputs, batched),
        _tensor_block("output", m.outputs, batched),
    ]
    if dynamic_shapes:  # one group per instance, each with its copy's profiles (at most --streams of them)
        groups = []
        for i in range(opts.instances):
            profiles = ", ".join(f'"{p}"' for p in range(i * per_copy, (i + 1) * per_copy))
            groups.append(f"  {{\n    count: 1\n    kind: KIND_GPU\n    profile: [ {profiles} ]\n  }}")
    else:  # (a group per instance made --instances 10**9 a gigabyte-long loop and config)
        groups = [f"  {{\n    count: {opts.instances}\n    kind: KIND_GPU\n  }}"]
    lines.append("instance_group [\n" + ",\n".join(groups) + "\n]\n")
    if dynamic:
        body = ""
        if opts.preferred_batch_sizes:
            body += f"\n  preferred_batch_size: [ {', '.join(map(str, opts.preferred_batch_sizes))} ]"
        body += f"\n  max_queue_delay_microseconds: {opts.max_queue_delay_us}"
        lines.append(f"dynamic_batching {{{body}\n}}\n")
    return "\n".join(lines), max_batch, note


def validate_config(text: str, m: Manifest, max_batch: int) -> Any:
    """Parse with tritonclient's ModelConfig protobuf and check names, types, dims against the manifest."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2 as mc
    except ImportError as e:
        raise UserError(
            f"validating config.pbtxt needs tritonclient: {PIP_HINT}; or pass --no-validate."
        ) from e
    cfg = text_format.Parse(text, mc.ModelConfig())
    problems = []
    if cfg.platform != "tensorrt_plan":
        problems.append(f"platform {cfg.platform!r}")
    if cfg.max_batch_size != max_batch:
        problems.append(f"max_batch_size {cfg.max_batch_size} != {max_batch}")
    for kind, got, want in (("input", cfg.input, m.inputs), ("output", cfg.output, m.outputs)):
        if [t.name for t in got] != [t.name for t in want]:
            problems.append(f"{kind} names {[t.name for t in got]} != {[t.name for t in want]}")
            continue
        for g, w in zip(got, want):
            if mc.DataType.Name(g.data_type) != TRITON_DTYPES[w.dtype]:
                problems.append(f"{kind} {w.name} type {mc.DataType.Name(g.data_type)}")
            if list(g.dims) != _dims(w, max_batch > 0):
                problems.append(f"{kind} {w.name} dims {list(g.dims)} != {_dims(w, max_batch > 0)}")
            model_shape = list(g.reshape.shape) if g.HasField("reshape") else list(g.dims)
            if max_batch > 0:
                model_shape = [-1, *model_shape]
            if model_shape != list(w.shape):
                problems.append(f"{kind} {w.name} is {model_shape} to the engine, which has {list(w.shape)}")
    n_profiles = len(m.profiles)
    for grp in cfg.instance_group:
        bad = [p for p in grp.profile if not p.isdigit() or int(p) >= n_profiles]
        if bad:
            problems.append(f"instance_group profiles {bad} not in the engine's {n_profiles} profiles")
    if problems:
        raise AssertionError("generated config.pbtxt disagrees with the manifest: " + "; ".join(problems))
    return cfg


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a non-UTF-8 file name, decoded with surrogates
        return False
    return True


def _refuse_replacing_inputs(target: Path, inputs: list[Path]) -> None:
    """UserError when the model directory `target` is, or holds, one of the files being exported: with
    --force it would be replaced (deleted) while it is still the source."""
    where = os.path.realpath(target)
    for f in inputs:
        if os.path.commonpath([where, os.path.realpath(f)]) == where:
            raise UserError(
                f"the model directory '{show_path(target)}' is or holds '{show_path(f)}', a file being "
                "exported; writing the model there would delete it. Export to another repository or --name."
            )


def _step_engine_refusal(engine: Path, generation: dict[str, Any]) -> str:
    """Why a decoder step engine gets no Triton model, and what serves it instead: `trtforge serve` and
    `trtforge generate` run a paged step engine; a slot one is served from its model."""
    cache = generation.get("cache")
    if isinstance(cache, dict) and cache.get("layout") == "paged":
        instead = (
            f"Serve it with `trtforge serve {show_path(engine)} --tokenizer DIR` (an OpenAI-compatible "
            "server), or run it with `trtforge generate`."
        )
    else:
        instead = (
            "Serve the Hugging Face model directory with `trtforge serve DIR` (an OpenAI-compatible "
            "server), or build a step engine that serve and generate run: `trtforge compile DIR --generate "
            "--cache-layout paged`."
        )
    return (
        f"engine '{show_path(engine)}' is a decoder step engine (`trtforge compile --generate`: its manifest "
        "has a generation section): one step of a KV-cache decoder, whose cache, positions and block "
        "tables the caller carries from step to step and whose logits it samples. Triton's TensorRT "
        "backend runs each request as one independent step and does neither, so a Triton model of it "
        f"cannot serve generation. {instead}"
    )


def export_triton(
    engine: str | os.PathLike[str], repo: str | os.PathLike[str], opts: TritonOptions
) -> TritonExport:
    """Write the model directory for `engine` into `repo` (created if missing); all or nothing."""
    engine = Path(engine)
    manifest, data = read_engine(engine)
    if manifest.generation is not None:  # a decoder step engine (compile --generate), as inspect tells it
        raise UserError(_step_engine_refusal(engine, manifest.generation))
    plugins = [p for p in manifest.plugins if p.get("namespace", "trtforge") == "trtforge"]
    if plugins:
        raise UserError(
            f"engine '{engine}' needs trtforge's Python attention plugin ({plugins[0].get('name')}), which "
            "only runs inside a Python process with trtforge loaded; Triton's TensorRT backend cannot load "
            "Python plugins. Rebuild with `--attention native` (TensorRT's own fused attention) to serve it "
            "with Triton."
        )
    # the stem, as --help says: 'bert.fp16.engine' and 'bert.int8.engine' are two models, not both 'bert'
    name = opts.name if opts.name is not None else engine.stem
    if (
        not name.strip()
        or name != name.strip()
        or "/" in name
        or ".." in name  # (Triton refuses a model name holding '..' as a path traversal, on load requests)
        or name.startswith(".")
        or not name.isprintable()
        or not _utf8(name)
    ):
        given = (
            "--name"
            if opts.name is not None
            else "the model name (the engine file's name; choose one with --name)"
        )
        raise UserError(
            f"{given} {name!r} is not a valid model directory name: expected printable UTF-8 text without "
            "'/' or '..', not starting with '.' nor starting or ending with a space (Triton names the model "
            "by its directory, refuses '..' in a model name, and clients must spell it exactly)."
        )
    version = opts.version
    if not is_int(version) or not 1 <= version <= MAX_VERSION:
        raise UserError(
            f"--version {version!r} is not a model version Triton serves: expected a whole number from 1 "
            f"to {MAX_VERSION} (Triton ignores version directories that are not numbers or start with '0', "
            "and reads the version as a signed 64-bit integer)."
        )
    repo = Path(repo)
    if repo.exists() and not repo.is_dir():
        raise UserError(f"repository '{show_path(repo)}' exists and is not a directory.")
    if os.path.lexists(repo / "config.pbtxt"):  # (-o repo/bert: the model went to repo/bert/bert, unseen)
        raise UserError(
            f"-o '{show_path(repo)}' is a model directory (it holds config.pbtxt), not a model repository: "
            f"Triton would not find a model written inside it. Give the repository that holds it, "
            f"-o '{show_path(repo.parent)}', with --name {repo.name}, or another directory."
        )
    target = repo / name
    check_name_length(target, "--name" if opts.name is not None else "the model directory")
    recover_staged_directory(target)  # an export killed mid-swap left the model aside: it goes back first
    _refuse_replacing_inputs(target, [engine, manifest_path_for(engine)])
    text, max_batch, note = render_config(
        manifest, name, opts, f"manifest '{show_path(manifest_path_for(engine))}'"
    )
    adding = os.path.lexists(target) and not opts.force
    if adding:
        _check_version_addable(target, version, text)
    validated = False
    if opts.validate:
        validate_config(text, manifest, max_batch)
        validated = True
    plan = target / str(version) / "model.plan"
    if adding:
        _add_version(target, version, text, data)
    else:
        _write_model(repo, target, version, text, data, replace=opts.force)
    return TritonExport(
        target,
        target / "config.pbtxt",
        plan,
        text,
        max_batch,
        validated,
        version,
        added_version=adding,
        note=note,
    )


def _exists(target: Path) -> UserError:
    return UserError(
        f"model directory '{show_path(target)}' already exists (another export made it meanwhile); pass "
        "--force to replace it."
    )


def _check_version_addable(target: Path, version: int, text: str) -> None:
    """UserError unless `target`, an existing model directory, can take version `version` with its
    config.pbtxt as it is: the version is new and the config the same (Triton serves every version of a
    model with one config.pbtxt, so an engine with other inputs, outputs or batching is another model)."""
    where = show_path(target)
    if not target.is_dir():
        raise UserError(f"model directory '{where}' already exists and is not a directory; pass --force.")
    vdir = target / str(version)
    recover_staged_directory(vdir)
    sweep_staged_directories(target)  # (a killed export of another version left its staging in the model)
    if os.path.lexists(vdir):
        raise UserError(
            f"model directory '{where}' already exists; pass --force to replace it (with all its versions), "
            f"or --version N to add this engine as version N beside its version {version}."
        )
    try:
        current = (target / "config.pbtxt").read_bytes()
    except FileNotFoundError:
        current = None
    except OSError as e:
        raise os_error(e, target / "config.pbtxt", "read") from e
    if current != text.encode("utf-8"):
        differs = "has no config.pbtxt" if current is None else "has a config.pbtxt unlike this engine's"
        raise UserError(
            f"model directory '{where}' already exists and {differs}; Triton serves every version of a "
            f"model with the one config.pbtxt, so version {version} of this engine cannot be added beside "
            "the others. Pass --force to replace the model directory and all its versions, or export "
            "under another --name."
        )


def _add_version(target: Path, version: int, text: str, data: bytes) -> None:
    """Write `target`/`version`/model.plan into the existing model directory, all or nothing; its
    config.pbtxt is checked again, and the version made, under the repository's lock (the one an export
    replacing the model directory takes), so the version lands beside the config it was checked with."""
    with directory_lock([target.parent]):
        _check_version_addable(target, version, text)
        try:
            with staged_directory(target / str(version), replace=False) as staging:
                write_synced(staging / "model.plan", data)
        except FileExistsError as e:
            raise UserError(
                f"version {version} of model directory '{show_path(target)}' was made meanwhile by another "
                "export; pass --version N for a new version, or --force to replace the model directory."
            ) from e


def _write_model(repo: Path, target: Path, version: int, text: str, data: bytes, *, replace: bool) -> None:
    """Write the model directory `target` whole (replacing an existing one only when `replace`); the
    repository directories it creates are removed again when it fails."""
    made = [d for d in (repo, *repo.parents) if not d.exists()]
    try:
        repo.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a repository path that cannot be created (read-only, /proc, no permission)
        raise os_error(e, repo, "create the model repository") from e
    try:
        with staged_directory(target, replace=replace) as staging:  # (a SIGKILL's leftovers: next export)
            (staging / str(version)).mkdir()
            write_synced(staging / str(version) / "model.plan", data)
            write_synced(staging / "config.pbtxt", text.encode("utf-8"))
    except BaseException as e:
        for d in made:  # (innermost first; one another export wrote into meanwhile is not empty: kept)
            try:
                d.rmdir()
            except OSError:
                break
        if isinstance(e, FileExistsError):
            raise _exists(target) from e
        raise
