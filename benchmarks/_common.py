"""Shared helpers for benchmark scripts: machine description, JSON output, percentiles."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def shared_data() -> Path:
    """``../shared/data`` beside the checkout (searched upwards, for git worktrees)."""
    for parent in ROOT.parents:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    return ROOT.parent / "shared" / "data"


EXTRA_SETS = ROOT / "data" / "mixture-extra"
"""Mixture sets built in this checkout (``clef_engine.train.injection_set`` writes here)."""


def mixture_roots() -> list[Path]:
    """The decision mixture's folders: the shared sets, then the ones built here."""
    return [shared_data() / "decision-mix", EXTRA_SETS]


def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = float("nan")
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(mem_gib, 1),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def percentiles(values_ms: list[float]) -> dict[str, float]:
    arr = np.asarray(values_ms)
    return {
        "p50_ms": round(float(np.percentile(arr, 50)), 3),
        "p95_ms": round(float(np.percentile(arr, 95)), 3),
        "mean_ms": round(float(arr.mean()), 3),
        "n": int(arr.size),
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(), **payload}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    return out
