"""Host arrays to a device without the host waiting for it (asynchronous scheduling relies on it)."""

from __future__ import annotations

from typing import Any

import numpy as np


def to_device(array: np.ndarray, device: Any) -> Any:
    """A host array as a tensor on `device`, copied without the host waiting for the device.

    A plain ``.to(cuda)`` of pageable memory may synchronise with the stream (it would wait for the
    step in flight); going through pinned memory makes it an asynchronous copy in stream order.
    """
    import torch

    tensor = torch.from_numpy(array)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
