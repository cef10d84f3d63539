"""A device argument (``device=``, ``--device``) read as a torch.device this machine has, or a UserError.

torch's own errors name neither the argument nor what would do ("Expected one of cpu, cuda, ... device type
at start of device string", "Device index must not be negative", "invalid device ordinal" from the first
CUDA call, much later), so every front door that takes a device checks it here first. torch is imported
on call only (importing trtforge stays cheap).
"""

from __future__ import annotations

from typing import Any

from trtforge.errors import SHOWN_CHARS, UserError, shown


def resolve_device(
    device: Any,
    what: str,
    *,
    kinds: tuple[str, ...],
    runs_on: str,
    expected: str,
    ints: bool = False,
    no_gpu_later: bool = False,
) -> Any:
    """`device` (a str or torch.device; an int N = cuda:N where `ints`) as a torch.device whose type is
    one of `kinds` and, for CUDA, whose index this machine has; UserError naming `what` otherwise.

    `runs_on` says what runs there ("a session runs on cuda"), `expected` what to pass instead.
    `no_gpu_later`: on a machine with no CUDA device at all, the index is not refused here: the caller's
    own gate says why nothing can run (TensorRT's "cannot run engines here: no CUDA driver").
    """
    import torch

    allowed: tuple[type, ...] = (str, torch.device, int) if ints else (str, torch.device)
    if isinstance(device, bool) or not isinstance(device, allowed):
        kinds_named = "a string, torch.device or GPU index" if ints else "a string or torch.device"
        raise UserError(f"{what} must be {kinds_named}, got {type(device).__name__} {shown(device)}.")
    if isinstance(device, int):
        if device < 0:
            raise UserError(f"{what} {shown(device)}: a GPU index is >= 0; {expected}.")
        device = f"cuda:{device}"
    try:
        kind = torch.device(device)
    except (RuntimeError, TypeError) as e:  # torch's message repeats the string: shortened there too
        why, text = str(e).splitlines()[0], str(device)
        if len(text) > SHOWN_CHARS:
            why = why.replace(text, shown(text))
        raise UserError(f"{what} {shown(text)}: {why}; {expected}.") from None
    if kind.type not in kinds:
        raise UserError(f"{what} {shown(str(device))}: {runs_on}; {expected}.")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind.type == "cuda" and (kind.index or 0) >= gpus and not (no_gpu_later and gpus == 0):
        raise UserError(
            f"{what} {shown(str(device))}: this machine has {gpus} usable CUDA device(s); pass "
            + ("'cpu' or a GPU it has." if "cpu" in kinds else "a GPU it has.")
        )
    return kind


__all__ = ["resolve_device"]
