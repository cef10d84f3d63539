"""Click options that several commands share, defined once so defaults and help agree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def smoothquant_options(scope: str = "") -> Callable[[Any], Any]:
    """`--smoothquant ALPHA` and `--no-smoothquant` (used by `calibrate` and `compile`); `scope`
    prefixes their help, e.g. "INT8: " where the options only matter for one precision."""

    def apply(command: Any) -> Any:
        verb = f"{scope}calibrate" if scope else "Calibrate"
        command = click.option("--no-smoothquant", is_flag=True, help=f"{verb} without SmoothQuant.")(command)
        return click.option(
            "--smoothquant",
            type=float,
            default=0.8,
            show_default=True,
            metavar="ALPHA",
            help=f"{scope}SmoothQuant migration strength for MatMuls (0.8 took MiniLM from 0.911 to "
            "0.997 cosine).",
        )(command)

    return apply
