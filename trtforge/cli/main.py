"""`trtforge` command group. Each command lives in its own module and is imported only when invoked,
so `trtforge --help` stays fast and works without TensorRT."""

from __future__ import annotations

import copy
import importlib
import os
import sys
from typing import Any

import click

from trtforge import __version__

# command name -> "module:attribute" of a click.Command. Add new commands here.
COMMANDS: dict[str, str] = {
    "calibrate": "trtforge.cli.calibrate_cmd:calibrate_cmd",
    "compile": "trtforge.cli.compile_cmd:compile_cmd",
    "inspect": "trtforge.cli.inspect_cmd:inspect_cmd",
    "report": "trtforge.cli.report_cmd:report_cmd",
    "optimize": "trtforge.cli.optimize_cmd:optimize_cmd",
    "export-triton": "trtforge.cli.export_triton_cmd:export_triton_cmd",
    "generate": "trtforge.cli.generate_cmd:generate_cmd",
    "serve": "trtforge.cli.serve_cmd:serve_cmd",
}
SHORT_HELP: dict[str, str] = {
    "calibrate": "INT8-calibrate an ONNX model on a dataset: Q/DQ nodes TensorRT fuses.",
    "compile": "Compile a model (.onnx, .pt2, module:factory) into a TensorRT engine.",
    "inspect": "Summarize an ONNX model or an engine (its manifest).",
    "report": "Accuracy and latency of torch / ONNX Runtime / TensorRT variants, as HTML, Markdown, JSON.",
    "optimize": "Fuse LayerNorm, GELU, QKV and attention in an ONNX model, verified pass by pass.",
    "export-triton": "Write an engine into a Triton Inference Server model repository.",
    "generate": "Continue prompts with a step graph (ONNX Runtime), a step engine (TensorRT) or a HF model "
    "(torch), streaming tokens.",
    "serve": "Serve a model over OpenAI's HTTP API (completions, chat, streaming, /metrics).",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use; help lists them without importing."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        return _shorten_number_errors(_refuse_empty_paths(getattr(importlib.import_module(module), attr)))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SHORT_HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _refuse_empty_paths(command: click.Command) -> click.Command:
    """Every click.Path parameter of `command` refuses '' (which would otherwise mean the current
    directory, or a file named '.'), with click's usual exit code 2."""
    for param in command.params:
        if isinstance(param.type, click.Path) and not getattr(param, "_trtforge_no_empty", False):
            inner = param.callback

            def check(ctx: click.Context, p: click.Parameter, value: Any, inner: Any = inner) -> Any:
                values = value if isinstance(value, (tuple, list)) else (value,)
                if any(v is not None and str(v) == "" for v in values):
                    raise click.BadParameter("the path is empty; expected a file or directory name.")
                return inner(ctx, p, value) if inner is not None else value

            param.callback = check
            param._trtforge_no_empty = True  # type: ignore[attr-defined]
        elif _is_model_argument(param) and not getattr(param, "_trtforge_no_empty", False):
            param.callback = _refuse_empty_model(command.name or "", param.callback)
            param._trtforge_no_empty = True  # type: ignore[attr-defined]
    return command


def _shorten_number_errors(command: click.Command) -> click.Command:
    """Every number option of `command` refuses a long value (``--port`` of 5,000 digits) quoting its
    start and size, as :func:`trtforge.errors.shown` does, where click quoted it whole (or, past Python's
    4,300-digit int-to-str limit, failed to parse it and quoted that). Exit code 2, as click's own."""
    for param in command.params:
        kind = param.type
        numbers = (click.types.IntParamType, click.types.FloatParamType)  # (their ranges subclass them)
        if isinstance(kind, numbers) and not getattr(kind, "_trtforge_short", False):
            kind = copy.copy(kind)  # (click.INT is shared by every command: the copy is this option's)
            kind.convert = _short_convert(kind, kind.convert)  # type: ignore[method-assign]
            kind._trtforge_short = True  # type: ignore[attr-defined]
            param.type = kind
    return command


def _short_convert(kind: click.ParamType, inner: Any) -> Any:
    """`inner` (a number type's convert), raising click.BadParameter that quotes a long value shortened."""
    from trtforge.errors import SHOWN_CHARS, shown

    def convert(value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str) or len(value) <= SHOWN_CHARS:
            return inner(value, param, ctx)
        try:
            return inner(value, param, ctx)
        except click.BadParameter:
            pass
        number = "an integer" if isinstance(kind, click.types.IntParamType) else "a number"
        describe = getattr(kind, "_describe_range", None)
        expected = f"{number} in the range {describe()}" if describe is not None else number
        raise click.BadParameter(f"{shown(value)}: expected {expected}.", ctx, param) from None

    return convert


def _is_model_argument(param: click.Parameter) -> bool:
    """Whether `param` is a command's MODEL argument given as plain text (a file, a directory or
    module:factory; a click.Path argument is refused above)."""
    return isinstance(param, click.Argument) and param.name == "model" and param.type is click.STRING


def _refuse_empty_model(command: str, inner: Any) -> Any:
    """A callback refusing an empty MODEL by name: the loaders read '' as Path('') == '.', the current
    directory, and said "'.' is a directory", a path the user never gave."""
    from trtforge.errors import UserError

    def check(ctx: click.Context, p: click.Parameter, value: Any) -> Any:
        if value is not None and str(value) == "":
            raise UserError(
                "MODEL is empty (''); expected a model file, a directory or package.module:factory (see "
                f"`trtforge {command} -h`)."
            )
        return inner(ctx, p, value) if inner is not None else value

    return check


EPILOG = """\b
Examples:
  trtforge compile model.onnx -o model.engine --precision fp16
  trtforge compile mypkg.models:make_bert -o bert.engine --dynamic batch,seq \\
      --shape input_ids:1x16:8x128:32x512 --precision int8 --calib-data calib.npz
  trtforge optimize model.onnx -o fused.onnx
  trtforge report model.onnx -o report/
  trtforge inspect bert.engine
Run `trtforge COMMAND -h` for each command's options and examples.
Exit codes: 0 ok, 2 bad input (file, option, tensor, or an error raised by your own
module, factory or data function), 1 internal error, 130 Ctrl-C, 143 SIGTERM
(temporary files removed; an engine and its manifest are replaced together or not at
all), 141 quietly when stdout's reader has gone (`| head -1`). `report --check` adds 3.
"""


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="trtforge")
def cli() -> None:
    """trtforge: torch model -> ONNX -> fused, typed ONNX -> TensorRT engine, with every step checked."""


def main(argv: list[str] | None = None) -> int:
    """Console entry point: runs the group and maps trtforge errors to exit codes (2 user, 1 internal)."""
    try:
        from trtforge.cli._errors import EXIT_SIGINT, EXIT_SIGTERM, build_thread_alive, run_cli
    except KeyboardInterrupt:  # Ctrl-C before run_cli sets its handlers: nothing is written yet
        sys.stderr.write("\ninterrupted\n")  # (was a traceback of the import it landed in)
        return 128 + 2

    if argv is None:
        _enable_faulthandler()
    rc = run_cli(cli, argv)
    if rc in (EXIT_SIGINT, EXIT_SIGTERM) and (argv is None or build_thread_alive()):
        # Interrupted, and cleanup is done. Leave now: interpreter shutdown would wait on (or crash in) a
        # builder thread that ignored the cancel, and torch/TensorRT teardown after an interrupt can
        # end the process by the signal instead of this exit code. argv=None: the console entry point.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


def _enable_faulthandler() -> None:
    """A crash inside a native library (TensorRT, torch, ONNX Runtime) prints the Python stack of every
    thread on stderr before the process dies, so a bug report says where; a stderr that has no file
    descriptor (an embedding host's stream object) leaves the handler off."""
    import faulthandler
    import io

    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return


if __name__ == "__main__":
    sys.exit(main())
