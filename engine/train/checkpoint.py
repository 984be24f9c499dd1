"""The trainer's weights as a state: kept epochs and checkpoints.

:class:`CheckpointState` is a part of :class:`clef_engine.train.trainer.Trainer`. A state is the
trained weights by name (``head.*``, ``lora.*``, as ``Trainer._trainable`` names them); a
checkpoint (``checkpoint/state.safetensors`` + ``meta.json``, written after every epoch)
also holds the kept epoch's state and the optimizer and scheduler, so
``resume=True`` continues where a run stopped.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from clef_engine.train.forward import ModelForward

CHECKPOINT_DIR = "checkpoint"
"""Where a run keeps its checkpoints, inside the output dir (an ensemble: one per member)."""


class CheckpointState(ModelForward):
    """Copies, restores and checkpoints the trained weights."""

    def _state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self._trainable().items()}

    def _restore(self, state: dict[str, torch.Tensor]) -> None:
        params = self._trainable()
        with torch.no_grad():
            for n, value in state.items():
                params[n].copy_(value.to(params[n].device))

    def _save_checkpoint(
        self,
        directory: Path,
        epoch: int,
        history: list[dict[str, float]],
        best: dict[str, Any],
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        data: str = "",
    ) -> None:
        """Write the checkpoint; ``data`` identifies the states it was trained and validated
        on (see :meth:`checkpoint_data`)."""
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"current.{n}": v.cpu().contiguous() for n, v in self._state().items()}
        tensors.update(
            {f"best.{n}": v.cpu().contiguous() for n, v in (best["state"] or {}).items()}
        )
        opt = optimizer.state_dict()
        for idx, slots in opt["state"].items():
            for k, v in slots.items():
                tensors[f"opt.{idx}.{k}"] = torch.as_tensor(v).cpu().contiguous()
        save_file(tensors, str(directory / "state.safetensors"))
        meta = {
            "epoch": epoch,
            "history": history,
            "best_epoch": best["epoch"],
            "best_score": best["score"],
            "param_groups": opt["param_groups"],
            "scheduler": scheduler.state_dict()["last_epoch"],
            "config": asdict(self.config),
            "data": data,
        }
        (directory / "meta.json").write_text(json.dumps(meta, indent=1, default=str))

    @staticmethod
    def checkpoint_data(directory: Path) -> str | None:
        """The ``data`` a checkpoint was written with (``None``: a checkpoint from before
        it was recorded, or no checkpoint)."""
        path = directory / "meta.json"
        if not path.is_file():
            return None
        data = json.loads(path.read_text()).get("data")
        return str(data) if data else None

    def _load_checkpoint(
        self, directory: Path, optimizer: torch.optim.Optimizer, scheduler: Any
    ) -> tuple[int, list[dict[str, float]], dict[str, Any]]:
        from safetensors.torch import load_file

        meta = json.loads((directory / "meta.json").read_text())
        tensors = load_file(str(directory / "state.safetensors"))

        def prefixed(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}

        self._restore(prefixed("current."))
        best_state = prefixed("best.")
        # ``ema.*`` tensors (a weight average, in checkpoints of earlier versions) are left.
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in tensors.items():
            if k.startswith("opt."):
                _, idx, slot = k.split(".", 2)
                state.setdefault(int(idx), {})[slot] = v
        groups = meta["param_groups"]
        for g in groups:
            if "betas" in g:
                g["betas"] = tuple(g["betas"])
        optimizer.load_state_dict({"state": state, "param_groups": groups})
        scheduler.last_epoch = int(meta["scheduler"])
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
        best = {
            "score": float(meta["best_score"]),
            "epoch": int(meta["best_epoch"]),
            "state": best_state or None,
        }
        return int(meta["epoch"]), list(meta["history"]), best
