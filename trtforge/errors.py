"""Error types. A UserError is the user's to fix (bad file, option, input) and maps to exit code 2."""

from __future__ import annotations


class TrtforgeError(Exception):
    """Base class of every error trtforge raises on purpose."""


class UserError(TrtforgeError):
    """Bad input from the user: a file, tensor or option that is not what was expected (exit code 2)."""


class BackendUnavailableError(UserError):
    """No usable TensorRT backend is installed, or the requested one is missing."""


class ExportError(TrtforgeError):
    """torch -> ONNX export failed, or the exported graph disagrees with torch."""


class BuildError(TrtforgeError):
    """The TensorRT parser or builder rejected the network."""


class TrtforgeWarning(UserWarning):
    """Something the user should know that does not stop the run (the CLI prints it as one line)."""
