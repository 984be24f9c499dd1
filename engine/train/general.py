"""Train the general decision model: a LoRA adapter on the packaged encoder, many tasks.

The zero-shot scorer compares a state's vector with each option's vector. A bare
sentence-similarity model answers yes/no questions poorly ("Is the customer angry?" is
about as similar to an angry message as to a calm one). Here the backbone learns, on the
decision mixture (:mod:`clef_engine.train.mixture`), to place a state near the option text
that answers the question, where each option text carries the question's instructions
(:func:`clef_engine.heads.zero_shot.option_texts` with ``prompted=True``): "Is the customer
angry? yes" against "Is the customer angry? no".

One step draws a batch of decisions from one data set (so the batch shares its option
texts), encodes states and option texts with gradients through the adapter, and takes
label-smoothed cross-entropy plus Brier over each question's options, with a learned
inverse temperature per question type. After training, temperatures per (type,
option-count bucket) are fitted on held-out mixture rows (never on an evaluation set),
for fp32 and for int8.

The run is resumable: a checkpoint (adapter, scales, optimizer, step) is written every
``checkpoint_every`` steps, and each step's batch is drawn from a generator seeded by
(seed, step), so a resumed run sees the same batches.

``--recalibrate`` refits only the calibrations of an existing model dir (same data, seed
and held-out fraction as its run). ``--split-seed`` picks the held-out rows independently
of ``--seed``, so runs of several seeds can hold out the same rows (and be averaged by
``benchmarks/general_soup.py``). ``--head`` also trains an option-evidence head
(:mod:`clef_engine.heads.option_evidence`) with the adapter; it was measured and is not
the shipped recipe (``engine/data/general/MODEL_CARD.md``).

Command:
    python -m clef_engine.train.general --data ../shared/data/decision-mix --out general-model
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from clef_engine.heads.option_evidence import HeadConfig, OptionEvidenceHead
from clef_engine.heads.zero_shot import option_texts
from clef_engine.train.mixture import Item, MixtureSampler, load_mixture

log = logging.getLogger(__name__)

TYPES = ("choice", "noul", "score")
MODEL_NAME = "clef-general-minilm"


def split_rows(sets: dict[str, Any], fraction: float, seed: int) -> dict[str, Any]:
    """Move ``fraction`` of each set's training rows into a calibration set (returned)."""
    from clef_engine.train.mixture import DataSet

    held: dict[str, DataSet] = {}
    for name, ds in sets.items():
        rng = random.Random(f"{seed}:{name}")
        rows = list(ds.rows)
        rng.shuffle(rows)
        n = max(1, int(len(rows) * fraction))
        held[name] = DataSet(name, rows[:n], ds.task, ds.labels)
        ds.rows = rows[n:]
    return held


class GeneralTrainer:
    """The LoRA-adapted encoder and its training loop."""

    def __init__(
        self,
        *,
        rank: int = 16,
        lr: float = 5e-4,
        batch_size: int = 32,
        max_length: int = 64,
        layers: int | None = 3,
        label_smoothing: float = 0.05,
        brier_weight: float = 0.5,
        seed: int = 0,
        device: str | None = "cpu",
        head: bool = False,
    ) -> None:
        import peft

        from clef_engine.backbones import load_backbone
        from clef_engine.train.trainer import _default_targets

        torch.manual_seed(seed)
        # fp32 on every device: the adapter trains in full precision.
        self.backbone = load_backbone("encoder", None, device=device, dtype="fp32")
        self.device = self.backbone.device
        self.tokenizer = self.backbone.tokenizer  # type: ignore[attr-defined]
        base = self.backbone.model  # type: ignore[attr-defined]
        depth = int(base.config.num_hidden_layers)
        # Adapting only the top ``layers`` blocks: the backward pass stops there, which
        # roughly halves a step on the CPU.
        top = list(range(depth - layers, depth)) if layers else None
        self.lora_config = peft.LoraConfig(
            r=rank,
            lora_alpha=2 * rank,
            lora_dropout=0.1,
            target_modules=_default_targets(base),
            layers_to_transform=top,
            bias="none",
        )
        self.model = peft.get_peft_model(base, self.lora_config)
        self.log_scale = torch.nn.Parameter(
            torch.full((len(TYPES),), math.log(20.0), device=self.device)
        )
        self.head: OptionEvidenceHead | None = None
        """The option-evidence head (``head=True``): each option reads the state's tokens
        for its own evidence, a learned correction on top of the cosine score."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": params, "lr": lr}, {"params": [self.log_scale], "lr": 1e-2}]
        if head:
            hidden = int(base.config.hidden_size)
            self.head = OptionEvidenceHead(HeadConfig(hidden_size=hidden, option_bank=False))
            self.head.to(self.device)
            groups.append({"params": list(self.head.parameters()), "lr": lr})
        self.optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
        self.batch_size = batch_size
        self.max_length = max_length
        self.label_smoothing = label_smoothing
        self.brier_weight = brier_weight
        self.seed = seed
        self.step = 0
        self.seconds = 0.0
        """Training time over every resumed part of the run."""

    # -- forward -------------------------------------------------------------------------

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Normalised mean-pooled vectors ``[N, H]``, as the engine pools them."""
        return self.encode_tokens(texts)[0]

    def encode_tokens(
        self, texts: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pooled vectors ``[N, H]``, token states ``[N, L, H]`` (zero on padding, as the
        engine hands them to a head) and the ``[N, L]`` mask."""
        enc = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(hidden.dtype)
        hidden = hidden * m
        pooled = hidden.sum(1) / m.sum(1).clamp(min=1.0)
        return torch.nn.functional.normalize(pooled, dim=-1), hidden, mask.bool()

    def loss(self, items: Sequence[Item]) -> tuple[torch.Tensor, float]:
        """Label-smoothed CE + Brier over each item's options; also the batch accuracy."""
        texts = [option_texts(it.question, prompted=True) for it in items]
        unique = list(dict.fromkeys(t for ts in texts for t in ts))
        where = {t: i for i, t in enumerate(unique)}
        states, tokens, mask = self.encode_tokens([it.state for it in items])
        options = self.encode(unique)
        width = max(len(ts) for ts in texts)
        index = torch.zeros(len(items), width, dtype=torch.long)
        valid = torch.zeros(len(items), width, dtype=torch.bool)
        for i, ts in enumerate(texts):
            index[i, : len(ts)] = torch.tensor([where[t] for t in ts])
            valid[i, : len(ts)] = True
        index, valid = index.to(self.device), valid.to(self.device)
        sims = torch.einsum("bh,bnh->bn", states, options[index])
        kinds = torch.tensor(
            [TYPES.index(str(it.question.type)) for it in items],  # type: ignore[attr-defined]
            device=self.device,
        )
        if self.head is None:
            logits = sims * self.log_scale.exp()[kinds].unsqueeze(1)
        else:  # one head pass per item: its options attend to each other
            logits = torch.zeros_like(sims)
            for i, (it, ts) in enumerate(zip(items, texts, strict=True)):
                logits[i, : len(ts)] = self.head(
                    tokens[i : i + 1], mask[i : i + 1], states[i : i + 1],
                    options[index[i, : len(ts)]], str(it.question.type),  # type: ignore[attr-defined]
                )[0]  # fmt: skip
        logits = logits.masked_fill(~valid, -1e4)
        logp = torch.log_softmax(logits, dim=-1)
        target = torch.tensor([it.label for it in items], device=self.device)
        nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1)
        uniform = -(logp * valid).sum(1) / valid.sum(1)
        ce = (1 - self.label_smoothing) * nll + self.label_smoothing * uniform
        p = logp.exp() * valid
        onehot = torch.nn.functional.one_hot(target, width).float()
        brier = ((p - onehot) ** 2).sum(1)
        loss = (ce + self.brier_weight * brier).mean()
        accuracy = float((logits.argmax(1) == target).float().mean())
        return loss, accuracy

    # -- loop ----------------------------------------------------------------------------

    def batch(self, sampler: MixtureSampler) -> list[Item]:
        """The batch of step ``self.step``: one data set, drawn by (seed, step)."""
        sampler.rng = random.Random(f"{self.seed}:{self.step}")
        source = sampler.rng.choices(sampler.names, sampler.weights)[0]
        return [sampler.draw(source) for _ in range(self.batch_size)]

    def train(
        self,
        sampler: MixtureSampler,
        steps: int,
        *,
        checkpoint: Path | None = None,
        checkpoint_every: int = 100,
        max_minutes: float | None = None,
        warmup: float = 0.05,
    ) -> dict[str, Any]:
        """Run to ``steps`` (continuing a checkpoint when there is one); returns stats."""
        if checkpoint is not None and (checkpoint / "meta.json").is_file():
            self.load_checkpoint(checkpoint)
            log.info("resumed at step %d", self.step)
        warm = max(1, int(steps * warmup))

        def rate(step: int) -> float:
            if step < warm:
                return (step + 1) / warm
            return max(0.0, (steps - step) / max(1, steps - warm))

        bases = [g["lr"] for g in self.optimizer.param_groups]
        self.model.train()
        if self.head is not None:
            self.head.train()
        started = time.monotonic()
        recent: list[tuple[float, float]] = []
        while self.step < steps:
            if max_minutes is not None and time.monotonic() - started > 60 * max_minutes:
                log.info("time budget reached at step %d", self.step)
                break
            tick = time.monotonic()
            items = self.batch(sampler)
            for g, base in zip(self.optimizer.param_groups, bases, strict=True):
                g["lr"] = base * rate(self.step)
            loss, acc = self.loss(items)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self._trained(), 1.0)
            self.optimizer.step()
            for g, base in zip(self.optimizer.param_groups, bases, strict=True):
                g["lr"] = base  # the stored base rates stay what the run was started with
            self.step += 1
            self.seconds += time.monotonic() - tick
            recent.append((float(loss.detach()), acc))
            if self.step % 20 == 0:
                n = len(recent)
                log.info(
                    "step %d/%d loss %.4f acc %.3f scales %s (%.1f s/step)",
                    self.step,
                    steps,
                    sum(r[0] for r in recent) / n,
                    sum(r[1] for r in recent) / n,
                    self.scales(),
                    (time.monotonic() - started) / max(1, n),
                )
            if checkpoint is not None and self.step % checkpoint_every == 0:
                self.save_checkpoint(checkpoint)
        if checkpoint is not None:
            self.save_checkpoint(checkpoint)
        self.model.eval()
        if self.head is not None:
            self.head.eval()
        return {"steps": self.step, "seconds": round(self.seconds, 1)}

    def scales(self) -> list[float]:
        """The inverse temperatures in training: per question type, or the head's one."""
        learned = self.log_scale if self.head is None else self.head.log_scale.view(1)
        return [round(float(s), 1) for s in learned.detach().exp()]

    # -- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self, directory: Path) -> None:
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"param.{n}": p.detach().contiguous().cpu() for n, p in self._named()}
        opt = self.optimizer.state_dict()
        for pid, state in opt["state"].items():
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    tensors[f"opt.{pid}.{k}"] = v.contiguous().cpu()
        tmp = directory / "state.safetensors.tmp"
        save_file(tensors, str(tmp))
        tmp.replace(directory / "state.safetensors")
        meta = {
            "step": self.step,
            "seed": self.seed,
            "seconds": round(self.seconds, 1),
            "groups": opt["param_groups"],
        }
        (directory / "meta.json").write_text(json.dumps(meta))

    def load_checkpoint(self, directory: Path) -> None:
        from safetensors.torch import load_file

        tensors = load_file(str(directory / "state.safetensors"))
        meta = json.loads((directory / "meta.json").read_text())
        with torch.no_grad():
            for n, p in self._named():
                p.copy_(tensors[f"param.{n}"].to(p.device))
        state: dict[int, dict[str, Any]] = {}
        for k, v in tensors.items():
            if k.startswith("opt."):
                _, pid, name = k.split(".", 2)
                state.setdefault(int(pid), {})[name] = v.to(self.device)
        self.optimizer.load_state_dict({"state": state, "param_groups": meta["groups"]})
        self.step = int(meta["step"])
        self.seconds = float(meta.get("seconds", 0.0))

    def _named(self) -> list[tuple[str, torch.nn.Parameter]]:
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if self.head is not None:
            named += [(f"head.{n}", p) for n, p in self.head.named_parameters()]
        return [*named, ("log_scale", self.log_scale)]

    def _trained(self) -> list[torch.nn.Parameter]:
        """The parameters whose gradients are clipped together (adapter and head)."""
        return [p for n, p in self._named() if n != "log_scale"]

    # -- export ----------------------------------------------------------------------------

    def save_adapter(self, directory: Path) -> None:
        """``directory/adapter/`` in peft's format (what the engine merges at load)."""
        from clef_engine.backbones import PACKAGED

        adapter = directory / "adapter"
        self.model.save_pretrained(str(adapter))
        (adapter / "README.md").unlink(missing_ok=True)
        # peft records the base model's local path; the packaged model's name is portable.
        config = json.loads((adapter / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = PACKAGED
        (adapter / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


@torch.inference_mode()
def raw_logits(engine: Any, items: Sequence[Item], batch: int = 64) -> list[torch.Tensor]:
    """Uncalibrated option scores of ``items`` under ``engine``: cosine similarities, or
    the option-evidence head's logits when the model has one."""
    from clef_engine.heads.option_evidence import pad_tokens

    module = getattr(engine.head, "module", None)
    out: list[torch.Tensor] = []
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        states = [it.state for it in chunk]
        encoded = engine.backbone.encode(states, return_tokens=module is not None)
        pooled = encoded.pooled.float()
        if module is None:
            for i, it in enumerate(chunk):
                out.append(pooled[i] @ engine.prepare_question(it.question).vectors.float().T)
            continue
        tokens, mask = pad_tokens([s.float() for s in encoded.token_states])
        for i, it in enumerate(chunk):
            prepared = engine.prepare_question(it.question)
            kind = str(it.question.type)  # type: ignore[attr-defined]
            logits = module(tokens[i : i + 1], mask[i : i + 1], pooled[i : i + 1],
                            prepared.vectors.float(), kind)  # fmt: skip
            out.append(logits[0])
    return out


def fit_general_calibration(engine: Any, items: Sequence[Item], source: str) -> Any:
    """Temperatures per (type, bucket) on held-out mixture items."""
    from clef_engine.calibration.fit import fit_calibrator

    logits = raw_logits(engine, items)
    return fit_calibrator(
        logits,
        [it.label for it in items],
        [str(it.question.type) for it in items],  # type: ignore[attr-defined]
        source=source,
    )


def calibration_items(held: dict[str, Any], per_set: int, seed: int) -> list[Item]:
    sampler = MixtureSampler(held, seed=seed + 1)
    return [sampler.draw(name) for name in sampler.names for _ in range(per_set)]


def write_model_dir(
    trainer: GeneralTrainer, out: Path, held: dict[str, Any], *, per_set: int, seed: int,
    excluded: Sequence[str],
) -> Path:  # fmt: skip
    """Adapter + config.json with fp32 and int8 calibrations fitted on ``held``."""
    from clef_engine.backbones import PACKAGED

    out.mkdir(parents=True, exist_ok=True)
    trainer.save_adapter(out)
    config: dict[str, Any] = {
        "format": "clef-agents",
        "format_version": 1,
        "model_name": MODEL_NAME,
        "backbone": {"kind": "encoder", "path": PACKAGED},
        "scorer": {"option_texts": "prompted"},
        "calibration": {},
    }
    if trainer.head is not None:  # it answers every question: no trained option vectors
        config["head"] = {**trainer.head.save(out), "scope": "all"}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return fit_calibrations(out, held, per_set=per_set, seed=seed, excluded=excluded)


def fit_calibrations(
    out: Path, held: dict[str, Any], *, per_set: int, seed: int, excluded: Sequence[str]
) -> Path:
    """Fit the fp32 and int8 calibrations of the model dir ``out`` on ``held`` (the run's
    held-out training rows) into its ``config.json``; ``--recalibrate`` runs only this."""
    from clef_engine.calibration.temperature import Calibrator
    from clef_engine.runtime.engine import DecisionEngine

    config = json.loads((out / "config.json").read_text())
    items = calibration_items(held, per_set, seed)
    source = (
        f"held-out decision-mix training rows ({len(items)} questions"
        + (f"; sets left out: {', '.join(excluded)}" if excluded else "")
        + "), clef_engine.train.general"
    )
    for quantize, field in ((None, "calibration"), ("int8", "calibration_int8")):
        engine = DecisionEngine.from_pretrained(
            out, quantize=quantize, calibrator=Calibrator(source="identity"), warmup=False
        )
        config[field] = fit_general_calibration(engine, items, source).to_dict()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", required=True, nargs="+", help="the decision-mix folder (and more set folders)"
    )
    parser.add_argument("--out", required=True, help="model dir to write")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--layers", type=int, default=3, help="adapt the top N blocks (0: all)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, auto")
    parser.add_argument("--exclude", nargs="*", default=[], help="sets left out (leave-one-out)")
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--calibration-per-set", type=int, default=400)
    parser.add_argument("--held-out", type=float, default=0.1)
    parser.add_argument(
        "--split-seed",
        type=int,
        default=None,
        help="seed of the held-out calibration rows (default: --seed); runs that are to be "
        "averaged or compared on one calibration set share it",
    )
    parser.add_argument(
        "--head", action="store_true", help="train an option-evidence head with the adapter"
    )
    parser.add_argument(
        "--recalibrate",
        action="store_true",
        help="only refit the calibrations of the model dir --out (same --data, --seed, "
        "--split-seed, --exclude and --held-out as its training run)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    sets = load_mixture(args.data, split="train", exclude=args.exclude)
    held = split_rows(
        sets, args.held_out, args.seed if args.split_seed is None else args.split_seed
    )
    if args.recalibrate:
        fit_calibrations(
            Path(args.out), held, per_set=args.calibration_per_set, seed=args.seed,
            excluded=args.exclude,
        )  # fmt: skip
        return 0
    sampler = MixtureSampler(sets, seed=args.seed)
    trainer = GeneralTrainer(
        rank=args.rank,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        layers=args.layers or None,
        max_length=args.max_length,
        device=None if args.device == "auto" else args.device,
        head=args.head,
    )
    out = Path(args.out)
    stats = trainer.train(
        sampler, args.steps, checkpoint=out / "checkpoint", max_minutes=args.max_minutes
    )
    log.info("trained: %s", stats)
    if trainer.step < args.steps:
        log.info("stopped early; run the same command again to continue")
        return 3
    write_model_dir(
        trainer, out, held, per_set=args.calibration_per_set, seed=args.seed,
        excluded=args.exclude,
    )  # fmt: skip
    (out / "train.json").write_text(
        json.dumps({**vars(args), **stats, "sets": sorted(sets)}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
