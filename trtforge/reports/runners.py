"""Runners: Polygraphy `BaseRunner`s that run one target and time themselves.

ONNX Runtime uses Polygraphy's own `OnnxrtRunner` over sessions from `trtforge.numerics`: an EXACT
session (graph optimizations off) for the accuracy outputs, swapped for a FAST one (optimizations on)
before latency is timed (`use_purpose`), so no accuracy figure depends on the CPU's int8 kernels.
PyTorch eager and the TensorRT engine (through `trtforge.runtime`) are small `BaseRunner`
subclasses. `BaseRunner.infer` checks every feed against the runner's input metadata, so a feed
that does not fit a target fails in that target's row with Polygraphy's message.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from trtforge.numerics.sessions import EXACT, make_session
from trtforge.reports.inputs import ReportInput


def preload() -> None:
    """Do the imports Polygraphy's runners make on their first call (it imports torch, if installed, to
    test feeds for torch tensors), so they are not counted in the first target's memory and time."""
    from polygraphy.backend import onnxrt  # noqa: F401
    from polygraphy.util import array

    array.is_torch(None)


def quiet_polygraphy() -> Any:
    """Silence Polygraphy's logger (its critical messages still raise; they land in the rows)."""
    from polygraphy.logger import G_LOGGER

    return G_LOGGER.verbosity(G_LOGGER.CRITICAL + 1)


def input_metadata(specs: Sequence[ReportInput]) -> TensorMetadata:
    """Polygraphy metadata from our specs (dynamic dims as None)."""
    meta = TensorMetadata()
    for s in specs:
        meta.add(s.name, dtype=s.dtype, shape=[d if isinstance(d, int) and d >= 0 else None for d in s.shape])
    return meta


def ort_settings(threads: int | None) -> dict:
    """The thread and session settings an ONNX Runtime target records."""
    return {
        "onnxruntime_intra_op_num_threads": threads or "default (one per physical core)",
        "onnxruntime_inter_op_num_threads": 1 if threads else "default",
        "execution_provider": "CPUExecutionProvider",
        "sessions": "exact (graph optimizations off) for accuracy; fast (all optimizations) for latency",
    }


def _ort_runner_class() -> type:
    from polygraphy.backend.onnxrt import OnnxrtRunner

    class OrtRunner(OnnxrtRunner):
        """OnnxrtRunner whose session is made for a purpose: EXACT (accuracy, the default) or FAST."""

        def __init__(self, path: str | os.PathLike[str], threads: int | None, name: str):
            self._path, self._threads, self.purpose = str(path), threads, EXACT
            super().__init__(self._make, name=name)

        def _make(self) -> Any:
            # quiet: a run the model refuses is recorded in the report (the target's reason), not logged
            return make_session(self._path, self.purpose, threads=self._threads, quiet=True)

        def use_purpose(self, purpose: str) -> None:
            """Swap the active session for one made for `purpose` (the old one is released first)."""
            if purpose == self.purpose:
                return
            self.purpose = purpose
            if self.is_active:
                del self.sess
                self.sess = self._make()

    return OrtRunner


def make_ort_runner(path: str | os.PathLike[str], threads: int | None, name: str) -> tuple[BaseRunner, dict]:
    """An ONNX Runtime runner (exact session until `use_purpose(FAST)`), and its settings."""
    return _ort_runner_class()(path, threads, name), ort_settings(threads)


class TorchRunner(BaseRunner):
    """PyTorch eager on CPU or CUDA: feeds become tensors on `device`, outputs come back as numpy."""

    def __init__(
        self,
        module: Any,
        specs: Sequence[ReportInput],
        output_names: Sequence[str],
        device: str = "cpu",
        name: str | None = None,
    ):
        super().__init__(name=name, prefix="trtforge-torch")
        self._module, self._specs = module, list(specs)
        self._output_names, self._device = list(output_names), device

    def activate_impl(self) -> None:
        self.module = self._module.to(self._device).eval()

    def get_input_metadata_impl(self) -> TensorMetadata:
        return input_metadata(self._specs)

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        import torch

        from trtforge.compiler.export import flatten_outputs

        cuda = self._device.startswith("cuda")
        with torch.no_grad():
            feeds = {
                k: torch.from_numpy(np.ascontiguousarray(v)).to(self._device) for k, v in feed_dict.items()
            }
            if cuda:
                torch.cuda.synchronize(self._device)
            start = time.perf_counter()
            outputs = flatten_outputs(self.module(**feeds))
            if cuda:
                torch.cuda.synchronize(self._device)
            self.inference_time = time.perf_counter() - start
        if len(outputs) != len(self._output_names):
            raise ValueError(
                f"the module returned {len(outputs)} outputs, expected {len(self._output_names)} "
                f"({self._output_names})"
            )
        return OrderedDict((n, o.detach().cpu().numpy()) for n, o in zip(self._output_names, outputs))

    def deactivate_impl(self) -> None:
        self._module = self.module.to("cpu")
        del self.module


class TrtEngineRunner(BaseRunner):
    """A trtforge engine (+ manifest) run through `trtforge.runtime` on one stream."""

    def __init__(
        self, engine_path: str | os.PathLike[str], specs: Sequence[ReportInput], name: str | None = None
    ):
        super().__init__(name=name, prefix="trtforge-trt")
        self._path, self._specs = Path(engine_path), list(specs)

    def activate_impl(self) -> None:
        from trtforge.runtime import load

        self.engine = load(self._path)
        self.session = self.engine.session(streams=1)

    def get_input_metadata_impl(self) -> TensorMetadata:
        return input_metadata(self._specs)

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        start = time.perf_counter()
        out = self.session.run(feed_dict)  # numpy in -> numpy out, synchronized
        self.inference_time = time.perf_counter() - start
        return OrderedDict((k, np.asarray(v)) for k, v in out.items())

    def deactivate_impl(self) -> None:
        self.session.close()
        del self.session, self.engine
