"""Loading a Hugging Face causal LM for trtforge: an nn.Module, a save_pretrained directory or
'pkg.module:factory', with every failure of the user's files reported as a UserError.

Shared by the step-graph compile (``llm.compile``) and the serving front door (``llm.service``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtforge._usercode import load_factory
from trtforge.errors import UserError
from trtforge.llm.models.base import UNSUPPORTED_HINTS, check_config_sizes
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

        try:
            config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
        except Exception as e:  # the directory's config.json is the user's (huggingface_hub's strict
            # validation errors, a ZeroDivisionError from 0 heads in transformers' own checks, ...)
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
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # its missing-weights report: ours below says it once
        try:
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, dtype=torch.float32, output_loading_info=True
            )
        except Exception as e:  # missing, corrupt (safetensors' own error type) or mismatched weight files
            _refuse_unknown_activation(path, config, e)
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
        return model.eval()
    if path.suffix.lower() in (".onnx", ".pt2", ".engine") or path.exists():
        raise UserError(
            f"expected a Hugging Face causal LM (an nn.Module, a save_pretrained directory or "
            f"module:factory); '{path}' is a file. Step graphs (.onnx) are written by "
            f"`trtforge compile MODEL --generate --save-onnx`."
        )
    model, _ = load_factory(str(source))
    return model


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


def refuse_empty_path(source: Any, what: str = "the model") -> None:
    """UserError for an empty path: Path('') is '.', which the checks below would report as the current
    directory, a path the caller never gave."""
    if isinstance(source, (str, bytes, os.PathLike)) and not os.fspath(source):
        raise UserError(
            f"{what} is an empty path (''); expected a Hugging Face causal LM: a save_pretrained directory "
            "or module:factory."
        )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:300]}" if text else type(e).__name__
