"""Loading a Hugging Face causal LM for trtforge: an nn.Module, a save_pretrained directory or
'pkg.module:factory', with every failure of the user's files reported as a UserError.

Shared by the step-graph compile (``llm.compile``) and the serving front door (``llm.service``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtforge._fileio import os_error
from trtforge._usercode import load_factory
from trtforge.errors import TrtforgeWarning, UserError
from trtforge.llm.models.base import UNSUPPORTED_HINTS, _stored_key, check_config_sizes, token_ids
from trtforge.llm.models.families import SUPPORTED


@contextlib.contextmanager
def transformers_bars(enabled: bool) -> Iterator[None]:
    """transformers' own progress bars ("Loading weights") on or off while the block runs."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was and not enabled:
            hf_logging.enable_progress_bar()


def load_causal_lm(source: Any) -> Any:
    """An nn.Module as is; 'pkg.module:factory' (returns (model, example_inputs)); a save_pretrained dir."""
    import torch

    if isinstance(source, torch.nn.Module):
        if not hasattr(source, "config"):  # (else an AttributeError deep inside the adapter)
            raise UserError(
                f"expected a Hugging Face causal LM (a transformers model with its .config), got a "
                f"{type(source).__name__} without one."
            )
        refuse_nan_weights(source, f"the {type(source).__name__} given")
        return source
    if isinstance(source, bytes):  # a path as os functions take it (compile and runtime.load read it so)
        source = os.fsdecode(source)
    if not isinstance(source, (str, os.PathLike)):
        raise UserError(
            f"expected a Hugging Face causal LM (an nn.Module, a save_pretrained directory or "
            f"module:factory), got {type(source).__name__}."
        )
    refuse_empty_path(source)
    path = Path(source)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(
                f"'{path}' is a directory without config.json; expected a save_pretrained directory."
            )
        import transformers

        try:  # (never the directory's own code: transformers would ask on stdin whether to run it)
            config = transformers.AutoConfig.from_pretrained(
                str(path), local_files_only=True, trust_remote_code=False
            )
        except Exception as e:  # the directory's config.json is the user's (huggingface_hub's strict
            # validation errors, a ZeroDivisionError from 0 heads in transformers' own checks, ...)
            _refuse_custom_code(path, e)
            raise UserError(
                f"'{path}/config.json' is not a Hugging Face config transformers can read ({_first_line(e)})."
            ) from e
        if config.model_type not in SUPPORTED:
            hint = UNSUPPORTED_HINTS.get(config.model_type)
            raise UserError(
                f"'{path}' holds a '{config.model_type}' model; supported causal LMs: {', '.join(SUPPORTED)}."
                + (f" {hint}" if hint else "")
            )
        check_config_sizes(config)  # (else a negative size reads as a weight file's fault)
        _refuse_unknown_quantization(path, config)
        _check_generation_config(path)
        pickled = check_pickled_weights(path)  # (before transformers unpickles them)
        # (before transformers builds the model, maybe for minutes)
        _refuse_config_beyond_weights(path, config, pickled)
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # its missing-weights report: ours below says it once
        try:
            # (mismatched sizes are loaded as random values and listed in `info`, refused below by name:
            # transformers' own error points at a report that set_verbosity_error leaves unprinted)
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                str(path),
                local_files_only=True,
                trust_remote_code=False,  # (a supported model_type's auto_map: transformers' own class)
                dtype=torch.float32,
                output_loading_info=True,
                ignore_mismatched_sizes=True,
            )
        except Exception as e:  # missing, corrupt (safetensors' own error type) or mismatched weight files
            _refuse_unknown_activation(path, config, e)
            _refuse_pad_outside_vocabulary(path, config, e)
            raise UserError(
                f"cannot load the weights in '{path}' ({_first_line(e)}); expected the files "
                "save_pretrained wrote (model.safetensors or pytorch_model.bin) matching config.json."
            ) from e
        finally:
            transformers.logging.set_verbosity(verbosity)
        missing = sorted(info.get("missing_keys") or [])
        if missing:  # transformers would start them from random values: not the user's model
            raise UserError(
                f"the weights in '{path}' lack {len(missing)} parameter(s) config.json asks for (e.g. "
                f"{missing[:3]}); transformers would initialize them randomly. Expected the files "
                "save_pretrained wrote for this config.json."
            )
        _refuse_mismatched(path, info.get("mismatched_keys") or [])
        _refuse_unused_layer_weights(path, config, model, info.get("unexpected_keys") or [])
        _refuse_integer_weights(path, config, model, pickled)
        # (transformers validates none of generation_config.json's ids; checked here, where the file is known)
        _report_stop_ids_outside_vocabulary(path, config, getattr(model, "generation_config", None))
        refuse_nan_weights(model, f"'{path}'")
        return model.eval()
    if path.suffix.lower() in (".onnx", ".pt2", ".engine") or path.exists():
        raise UserError(
            f"expected a Hugging Face causal LM (an nn.Module, a save_pretrained directory or "
            f"module:factory); '{path}' is a file. Step graphs (.onnx) are written by "
            f"`trtforge compile MODEL --generate --save-onnx`."
        )
    model, _ = load_factory(str(source))
    refuse_nan_weights(model, f"the model of '{source}'")
    return model


def _refuse_custom_code(path: Path, error: Exception) -> None:
    """UserError naming config.json's auto_map where transformers could not read the config without the
    directory's own Python code (a model_type it does not implement): trtforge never runs a checkpoint's
    code. Before, transformers asked on stdin whether to run it (from a terminal, "y" ran it)."""
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):  # (the config's own fault: the caller's message names it)
        return
    auto_map = raw.get("auto_map") if isinstance(raw, dict) else None
    if auto_map:
        raise UserError(
            f"'{path}/config.json' names its own Python code (auto_map: {json.dumps(auto_map)[:200]}) for "
            f"model_type {raw.get('model_type')!r}, which transformers does not implement; trtforge never "
            f"runs a checkpoint's code (transformers' trust_remote_code). Supported causal LMs: "
            f"{', '.join(SUPPORTED)}."
        ) from error


def _refuse_mismatched(path: Path, mismatched: Any) -> None:
    """UserError naming the first weight whose shape in the files differs from the one config.json makes
    (transformers would start it from random values)."""
    rows = sorted((str(row[0]), tuple(row[1]), tuple(row[2])) for row in mismatched)
    if rows:
        name, stored, expected = rows[0]
        more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
        raise UserError(
            f"the weights in '{path}' do not match its config.json: tensor '{name}' is stored with shape "
            f"{list(stored)}, config.json makes it {list(expected)}{more}. Expected the files "
            "save_pretrained wrote for this config.json."
        )


#: a weight name's layer index, as every supported family spells it (model.layers.3., transformer.h.3.,
#: transformer.blocks.3., model.decoder.layers.3.); the text before it tells a vision tower's apart
_LAYER_INDEX = re.compile(r"^(.*?(?:^|\.)(?:layers|h|blocks))\.(\d+)\.")


def _refuse_unused_layer_weights(path: Path, config: Any, model: Any, unexpected: Any) -> None:
    """UserError naming the stored weights of the decoder layers that transformers left unused (its
    ``unexpected_keys``, after its own list of keys to ignore, such as a multi-token-prediction layer):
    a layer past num_hidden_layers, or a bias config.json turns off (attention_bias false with biased
    projections). transformers drops them with a warning that set_verbosity_error silences, and the
    model compiled would be another than the checkpoint's."""
    prefixes = {m.group(1) for m in map(_LAYER_INDEX.match, model.state_dict()) if m}
    unused = sorted(
        str(name) for name in unexpected if (m := _LAYER_INDEX.match(str(name))) and m.group(1) in prefixes
    )
    if unused:
        layers = f"{_stored_key(config, 'num_hidden_layers')}={getattr(config, 'num_hidden_layers', None)}"
        more = f" (and {len(unused) - 3} more)" if len(unused) > 3 else ""
        raise UserError(
            f"the weights in '{path}' hold tensors its config.json has no place for: {unused[:3]}{more}; "
            f"transformers would drop them and build another model than the checkpoint's. Check "
            f"{layers} and the bias settings (attention_bias, mlp_bias) in "
            f"'{path}/config.json' against the weights: expected config.json as save_pretrained wrote it."
        )


def _refuse_config_beyond_weights(path: Path, config: Any, pickled: dict[Path, dict[str, Any]]) -> None:
    """UserError naming the config.json key that makes a model far larger than the directory's weights,
    read from the safetensors headers only (never the data), or the `pickled` .bin files' meta tensors
    (:func:`check_pickled_weights`), before transformers builds the model: a layer
    count above the layers the weight names hold (num_hidden_layers 100000 with weights for 2), or sizes
    (hidden_size 10**6) whose model needs more parameters than the files hold bits. Before, transformers
    built the whole model (gigabytes, minutes) and only then reported missing or mismatched weights.
    The bound is loose on purpose: one bit a parameter (any quantized checkpoint holds more), an embedding
    counted once (tied), h*h/2 a layer (the query and output projections hold more). Safetensors files whose
    headers cannot be read are left to transformers."""
    from safetensors import SafetensorError, safe_open

    shapes = {name: list(t.shape) for tensors in pickled.values() for name, t in tensors.items()}
    files = list(pickled) or _safetensors_files(path)  # (a damaged index: its UserError)
    try:
        if not files or not all(f.is_file() for f in files):
            return
        for file in (f for f in files if f not in pickled):
            with safe_open(str(file), framework="pt") as f:
                names = f.keys()  # (a safe_open handle is not iterable)
                shapes.update({name: list(f.get_slice(name).get_shape()) for name in names})
        stored_bytes = sum(f.stat().st_size for f in files)
    except (
        SafetensorError,
        OSError,
    ):  # (a damaged or unreadable file: transformers' load reports it by name)
        return
    raw = json.loads((path / "config.json").read_text())

    def named(attr: str) -> str:
        key = _stored_key(config, attr)
        unset = "" if key in raw else f" (not in config.json: transformers' default for {config.model_type})"
        return f"{key}={getattr(config, attr)}{unset}"

    layers = getattr(config, "num_hidden_layers", None)
    indices: dict[str, set[int]] = {}
    for name in shapes:
        m = _LAYER_INDEX.match(name)
        if m:
            indices.setdefault(m.group(1), set()).add(int(m.group(2)))
    if isinstance(layers, int) and indices:
        prefix, held = max(indices.items(), key=lambda kv: len(kv[1]))
        if layers > len(held):
            raise UserError(
                f"'{path}/config.json': {named('num_hidden_layers')}, but the weights in '{path}' hold "
                f"{len(held)} layer(s) ({prefix}.{min(held)} to {prefix}.{max(held)}); transformers would "
                f"build all {layers} layers, {layers - len(held)} of them from random values. Expected "
                "config.json as save_pretrained wrote it with these weights."
            )
    hidden, vocab = getattr(config, "hidden_size", None), getattr(config, "vocab_size", None)
    if not all(isinstance(v, int) and v > 0 for v in (hidden, vocab, layers)):
        return
    least = vocab * hidden + layers * hidden * hidden // 2
    if least > 8 * stored_bytes:
        values = sum(math.prod(shape) for shape in shapes.values())
        raise UserError(
            f"'{path}/config.json' makes a model far larger than its weights: {named('hidden_size')}, "
            f"{named('vocab_size')} and {named('num_hidden_layers')} make at least {least:,} parameters, but "
            f"the weight files in '{path}' hold {values:,} values ({stored_bytes / 1e6:.1f} MB); "
            "transformers would build the whole model before noticing. Expected config.json as "
            "save_pretrained wrote it with these weights."
        )


def _refuse_unknown_quantization(path: Path, config: Any) -> None:
    """UserError naming config.json's quantization_config.quant_method where transformers knows no such
    method: it skips the quantization with a warning and loads the packed integers as float weights (and
    :func:`_refuse_integer_weights` trusts a quantization_config), so the model ran as garbage (exit 0)."""
    from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING

    quant = getattr(config, "quantization_config", None)
    if not isinstance(quant, dict):  # (None, or a config object transformers made: a method it knows)
        return
    method = quant.get("quant_method")
    if quant.get("load_in_8bit") or quant.get("load_in_4bit") or method is None:
        return  # (bitsandbytes, or transformers' own error for a config without a method)
    if not isinstance(method, str) or method not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        raise UserError(
            f"'{path}/config.json': quantization_config.quant_method={method!r} is no quantization method "
            f"transformers knows ({', '.join(sorted(AUTO_QUANTIZATION_CONFIG_MAPPING))}); it would load "
            "the quantized weights as float weights and run them as nonsense. Expected an unquantized "
            "checkpoint (BF16, F16 or F32 weights), or one quantized by a method transformers loads."
        )


#: safetensors dtype names of integer and boolean tensors: no float parameter is stored so
_NOT_FLOAT = frozenset({"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})


def _refuse_integer_weights(path: Path, config: Any, model: Any, pickled: dict[Path, dict[str, Any]]) -> None:
    """UserError naming a float parameter stored as integers in the directory's weight files (its
    safetensors files, or the `pickled` state dicts of its .bin files): transformers casts them to floats
    without a word (a checkpoint broken in writing, or a quantized one whose config.json lost its
    quantization_config), so the model would run on nonsense weights."""
    if getattr(config, "quantization_config", None) is not None:
        return
    from safetensors import safe_open

    floats = {name for name, t in model.state_dict().items() if t.is_floating_point()}
    stored: list[tuple[Path, str, str, bool]] = []
    for file in _safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            names = f.keys()  # (a safe_open handle is not iterable)
            for name in names:
                dtype = f.get_slice(name).get_dtype()
                stored.append((file, name, dtype, dtype not in _NOT_FLOAT))
    for file, tensors in pickled.items():
        stored += [(file, n, str(t.dtype), t.is_floating_point()) for n, t in tensors.items()]
    for file, name, dtype, is_float in stored:
        if name in floats and not is_float:
            raise UserError(
                f"'{file}' stores tensor '{name}' as {dtype}, an integer type; the model's parameter "
                "is floating-point (BF16, F16 or F32 as save_pretrained writes it). Expected the "
                "files save_pretrained wrote for this config.json."
            )


def _safetensors_files(path: Path) -> list[Path]:
    """The safetensors files transformers loads from `path`: the shards its index names, or the one file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return _index_shards(index, "safetensors")
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


#: what reading a damaged weight index raises (:func:`_index_shards`): not JSON or not UTF-8 (ValueError), no
#: weight_map (KeyError), a weight_map that is no object (AttributeError), unhashable shard names (TypeError),
#: a file it may not read (OSError)
_DAMAGED_INDEX: tuple[type[Exception], ...] = (OSError, ValueError, KeyError, AttributeError, TypeError)

#: torch's weights-only unpickler is unsafe before 2.6 (CVE-2025-32434); transformers refuses .bin files there
_SAFE_TORCH_LOAD = (2, 6)


def _bin_files(path: Path) -> list[Path]:
    """The pickled weight files (.bin) transformers loads from `path` where it holds no safetensors file:
    the shards its index names, or the one file."""
    if _safetensors_files(path):  # (transformers prefers them; a .bin beside them is never read)
        return []
    index = path / "pytorch_model.bin.index.json"
    if index.is_file():
        return _index_shards(index, ".bin")
    single = path / "pytorch_model.bin"
    return [single] if single.exists() else []


def _index_shards(index: Path, kind: str) -> list[Path]:
    """The `kind` shard files (safetensors or .bin) the weight index `index` names; UserError naming the
    index where it is not the JSON object save_pretrained writes. Read before transformers reads it (the
    checks before its load), so a damaged index was an internal error (a KeyError, a JSONDecodeError)."""
    expected = (
        f"expected a JSON object whose weight_map maps each tensor name to its {kind} shard's file name"
    )
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except _DAMAGED_INDEX as e:
        raise UserError(
            f"'{index}' is not the index save_pretrained writes ({_first_line(e)}); {expected}."
        ) from e
    if not all(isinstance(name, str) for name in shards):
        raise UserError(f"'{index}' names a shard by a value that is not a string; {expected}.")
    return [index.parent / name for name in sorted(shards)]


def check_pickled_weights(path: Path) -> dict[Path, dict[str, Any]]:
    """Each .bin weight file of the save_pretrained directory `path` (:func:`_bin_files`) read by torch's
    weights-only unpickler onto the meta device (names, shapes and dtypes; no data), which runs no code a
    pickle asks for; UserError naming the file that holds anything but a state dict of tensors (a pickle
    that would run code, a truncated or damaged file, a list), or where torch's weights-only unpickler is
    unsafe (torch < 2.6). Before, transformers' own load said why in a message naming the directory, cut
    mid-sentence after torch's advice to load the file with weights_only=False."""
    import pickle
    import zipfile

    import torch
    from torch.torch_version import TorchVersion

    out: dict[Path, dict[str, Any]] = {}
    for file in _bin_files(path):
        if TorchVersion(torch.__version__) < _SAFE_TORCH_LOAD:
            raise UserError(
                f"'{file}' is a pickled (.bin) checkpoint, and torch {torch.__version__}'s weights-only "
                "unpickler can be made to run code (CVE-2025-32434): install torch >= 2.6, or convert the "
                "checkpoint to safetensors where it is trusted (save_pretrained writes model.safetensors)."
            )
        try:
            tensors = torch.load(
                str(file), map_location="meta", weights_only=True, mmap=zipfile.is_zipfile(file)
            )
        except pickle.UnpicklingError as e:
            raise UserError(
                f"'{file}' is not a plain checkpoint: its pickle asks for what torch's weights-only "
                f"unpickler refuses ({_unpickler_reason(e)}); trtforge never runs a pickle's code. Expected "
                "the state dict of tensors save_pretrained writes, or its model.safetensors."
            ) from e
        except OSError as e:  # (a directory, a file it may not read)
            raise os_error(e, file, "read") from e
        except Exception as e:  # torch's own errors for a truncated or damaged file (RuntimeError, EOFError)
            raise UserError(
                f"cannot read the weights in '{file}' ({_first_line(e)}); the file is truncated or damaged. "
                "Expected the state dict of tensors save_pretrained writes (pytorch_model.bin)."
            ) from e
        if not isinstance(tensors, dict):
            raise UserError(
                f"'{file}' holds a {type(tensors).__name__}, not a state dict (tensor name -> tensor); "
                "expected the file save_pretrained writes (pytorch_model.bin)."
            )
        for name, value in tensors.items():
            if not isinstance(name, str) or not isinstance(value, torch.Tensor):
                raise UserError(
                    f"'{file}' holds {name!r}: {type(value).__name__} in its state dict; expected tensors "
                    "by name, as save_pretrained writes them (pytorch_model.bin)."
                )
        out[file] = tensors
    return out


def _unpickler_reason(e: BaseException) -> str:
    """The line of torch's weights-only refusal that says what the pickle asked for ("Trying to load
    unsupported GLOBAL posix.system ..."), without its advice to load the file with weights_only=False."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    skip = ("Weights only load failed", "Please file an issue", "Check the documentation")
    reason = next((line for line in lines if not line.startswith(skip)), type(e).__name__)
    return reason[:300]


def refuse_nan_weights(model: Any, where: str) -> None:
    """UserError naming the first floating-point parameter of `model` (from `where`) holding NaN: every
    output would be NaN (greedy decoding then emits token 0 over and over), and the step export fails its
    faithfulness check with an error that names no weight. (Infinity is let be: an attention sink of -inf
    is a model's way to have none.)"""
    import torch

    for name, param in model.named_parameters():
        if not param.is_floating_point() or param.device.type == "meta":
            continue
        if bool(torch.isnan(param).any()):
            raise UserError(
                f"a weight of {where} is not a number: parameter '{name}' holds NaN. Expected trained (or "
                "freshly initialized) weights; a checkpoint with NaN was saved after training diverged, or "
                "was damaged."
            )


#: the keys a family's config names its activation by (transformers looks each value up in its ACT2FN)
_ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function")


def _refuse_unknown_activation(path: Path, config: Any, error: Exception) -> None:
    """UserError naming the config.json key whose activation transformers does not know, where building the
    model failed on that name (its ACT2FN's KeyError): the config's fault, not the weight files'."""
    if not isinstance(error, KeyError) or not error.args:
        return
    for key in _ACTIVATION_KEYS:
        if getattr(config, key, None) == error.args[0]:
            raise UserError(
                f"'{path}/config.json': {key}={error.args[0]!r} is no activation transformers knows; "
                "transformers cannot build the model."
            ) from error


def _check_generation_config(path: Path) -> None:
    """UserError naming the directory's generation_config.json where transformers cannot read it (not JSON,
    not an object): its from_pretrained takes that for no file at all and goes on with defaults, so the stop
    ids the file lists (Llama 3's end-of-turn among them) were dropped without a word."""
    import transformers

    file = path / "generation_config.json"
    if not file.exists():
        return
    try:
        transformers.GenerationConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # (OSError for a file that is not JSON, AttributeError for a list, ...)
        raise UserError(
            f"'{file}' is not a generation config transformers can read ({_first_line(e)}); expected the "
            "JSON object save_pretrained writes (its stop ids, eos_token_id, end generation), or no file."
        ) from e


def _report_stop_ids_outside_vocabulary(path: Path, config: Any, generation: Any) -> None:
    """UserError naming generation_config.json's eos_token_id where it is not a token id (transformers
    validates none of that file's ids), and a warning naming the ids that lie outside the vocabulary:
    they can never be generated, so generation does not stop at them (nor does transformers' generate:
    the tokens stay its), where before they were dropped without a word. (transformers warns of
    config.json's own out-of-vocabulary ids; a stop id is no reason to refuse a model transformers runs.)"""
    value = getattr(generation, "eos_token_id", None)
    vocab = getattr(config, "vocab_size", None)
    if not (path / "generation_config.json").is_file() or not isinstance(vocab, int):
        return
    file = f"'{path}/generation_config.json'"
    kept = token_ids(value, vocab, f"{file}: eos_token_id")
    outside = [
        i for i in (value if isinstance(value, (list, tuple)) else [value]) if i is not None and i not in kept
    ]
    if outside:
        warnings.warn(
            f"{file}: eos_token_id {outside} lie(s) outside the vocabulary of vocab_size={vocab} ids "
            f"(config.json); no token can stop generation there (nor in transformers' generate). "
            f"Expected ids below {vocab}.",
            TrtforgeWarning,
            stacklevel=2,
        )


def _refuse_pad_outside_vocabulary(path: Path, config: Any, error: Exception) -> None:
    """UserError naming pad_token_id where building the model failed on it: transformers passes it to
    nn.Embedding as padding_idx, whose AssertionError (a pad_token_id past vocab_size) read as the weight
    files' fault."""
    pad, vocab = getattr(config, "pad_token_id", None), getattr(config, "vocab_size", None)
    numbers = isinstance(pad, int) and isinstance(vocab, int)
    if isinstance(error, AssertionError) and numbers and not -vocab <= pad < vocab:
        raise UserError(
            f"'{path}/config.json': pad_token_id={pad} lies outside the vocabulary of vocab_size={vocab} "
            f"ids; transformers cannot build the embedding. Expected a token id below {vocab}, or null."
        ) from error


def refuse_empty_path(source: Any, what: str = "the model") -> None:
    """UserError for an empty path: Path('') is '.', which the checks below would report as the current
    directory, a path the caller never gave."""
    if isinstance(source, (str, bytes, os.PathLike)) and not os.fspath(source):
        raise UserError(
            f"{what} is an empty path (''); expected a Hugging Face causal LM: a save_pretrained directory "
            "or module:factory."
        )


def _first_line(e: BaseException) -> str:
    """`e`'s type and first line; a first line that ends in ':' (huggingface_hub's validation errors:
    "Validation error for field 'x':", the reason below it) goes on with the next."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    text = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return f"{type(e).__name__}: {text[:300]}"
