"""Device and dtype selection: cuda, then mps, then cpu; bf16 on CUDA."""

from __future__ import annotations

import torch

from clef_engine.errors import DeviceUnavailableError


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def select_device(requested: str | torch.device | None = None) -> torch.device:
    """Pick a device. ``None`` or ``"auto"`` picks cuda, then mps, then cpu.

    Raises:
        DeviceUnavailableError: an explicitly requested device is not available.
    """
    if requested is None or str(requested) == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as exc:
        raise DeviceUnavailableError(f"device: unknown device {requested!r}") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                "device: 'cuda' was requested but torch sees no CUDA GPU "
                f"(torch {torch.__version__}); use device='cpu' or 'auto'"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(
                f"device: {device} was requested but only "
                f"{torch.cuda.device_count()} CUDA device(s) exist"
            )
    elif device.type == "mps" and not _mps_available():
        raise DeviceUnavailableError("device: 'mps' was requested but MPS is not available")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise DeviceUnavailableError(f"device: unsupported device type {device.type!r}")
    return device


def select_dtype(device: torch.device, requested: str | torch.dtype | None = None) -> torch.dtype:
    """bf16 on CUDA, fp32 elsewhere, unless ``requested`` says otherwise."""
    if requested is None or requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(requested, torch.dtype):
        return requested
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if requested not in names:
        raise ValueError(f"dtype: unknown dtype {requested!r}; use one of {sorted(names)}")
    return names[requested]
