"""trtforge: compile PyTorch models into TensorRT engines and run them, proving every step.

Importing this package is cheap: torch, onnx and TensorRT load only when a stage needs them.
The front door: ``compile`` dispatches to the encoder compiler or, with ``generate=True``, to
``trtforge.llm.compile``; it may import every package, lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["TrtforgeError", "UserError", "__version__", "compile"]

from trtforge.core.version import __version__
from trtforge.errors import TrtforgeError, UserError, check_call, checked_call

if TYPE_CHECKING:
    from trtforge.compiler.pipeline import CompileResult


@checked_call
def compile(model: Any, example_inputs: Any = None, output: Any = None, **options: Any) -> CompileResult:  # noqa: A001
    """Compile a model (nn.Module, .onnx, .pt2 or 'module:factory') into a TensorRT engine.

    Thin lazy wrapper over :func:`trtforge.compiler.pipeline.compile_model`; see it for options.
    `generate=True` compiles a Hugging Face causal LM into a KV-cache step engine instead
    (:func:`trtforge.llm.compile.compile.compile_generate`; example_inputs are not needed).
    """
    generate = options.pop("generate", False)
    if not isinstance(generate, bool):
        raise UserError(f"generate must be True or False, got {type(generate).__name__} {generate!r}.")
    if generate:
        if example_inputs is not None:
            raise UserError(
                "generate=True compiles a causal LM into a step engine, whose inputs (token ids, "
                "positions, lengths, KV cache) trtforge makes itself: pass no example_inputs "
                "(output=... by keyword)."
            )
        from trtforge.llm.compile.compile import compile_generate

        check_call(compile_generate, (model, output), options, "trtforge.compile(generate=True)")
        return compile_generate(model, output, **options)
    from trtforge.compiler.pipeline import compile_model

    given = {"example_inputs": example_inputs, "output": output, **options}
    check_call(compile_model, (model,), given, "trtforge.compile", also=("generate",))
    return compile_model(model, example_inputs=example_inputs, output=output, **options)
