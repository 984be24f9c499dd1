"""Probes at the full-set BANKING77 macro-F1 that did not become features.

Each probe changes one thing in the trainer's default recipe from the outside (a
subclass or a post-hoc step), so the trainer keeps no option for it; docs/finetune.md
lists them with the other attempts. Results go to
``benchmarks/results/finetune_probes.json``, one section per probe.

    python benchmarks/finetune_probes.py full-finetune --seed 0   # then --seed 1, 2
    python benchmarks/finetune_probes.py prior-soup
    python benchmarks/finetune_probes.py knn --seed 0   # then --seed 1, 2
    python benchmarks/finetune_probes.py soup-memory --seed 0 --order-seed 1 --keep out/s0
    python benchmarks/finetune_probes.py ensemble out/s0/member_order0 out/s1/member_order1
    python benchmarks/finetune_probes.py memory-variants --seed 0   # then --seed 1 to 4

``full-finetune``: every linear weight of the encoder layers trains at ``--lr`` (default
1e-4) instead of LoRA adapters; everything else is the default recipe. The trained
weights are written as an exact LoRA adapter (``B`` = the weight change, ``A`` = the
identity, scaling 1), so the engine's loader merges them and the evaluation is the
benchmark's own.

``prior-soup``: trains the default recipe (seed 0) once, then
  * prior: the test set has 40 states per intent where ``train.csv`` has 35 to 187;
    logit adjustment (Menon et al. 2021) subtracts ``tau * log(training frequency)`` from
    each option's temperature-scaled logit, for tau 0, 0.5 and 1, and, as a second form,
    before the temperature, with the temperature fitted on the validation split weighted
    to a uniform prior;
  * soup: a second run from the same start (initialisation seed 0, same validation split)
    with batch order and dropout from seed 1; the two models' merged backbone weights and
    head weights are averaged (a uniform model soup, Wortsman et al. 2022), the
    temperature is fitted again on the validation split.

``soup-memory`` (``--seed N --order-seed M``): ``prior-soup``'s soup again, now with the
trainer's example memory (the default since that probe), on any seed. Two members from
one start (initialisation and validation split of seed N): the first is the default
recipe of seed N, the second takes its batch order and dropout from seed M. Each member,
then their uniform soup, gets the trainer's own tail: temperature and memory fitted on
the validation split, the model dir written and scored on the test set through
``from_pretrained`` (fp32). The soup averages the heads' weights and the adapters'
updates exactly: the members' LoRA matrices are stacked into one adapter of twice the
rank (``A = [A1; A2]``, ``B = [B1, B2] / 2``, the scaling kept), so the saved model dir
is an ordinary one. ``--keep DIR`` keeps the three model dirs (``member_order{N}``,
``member_order{M}``, ``soup``).

``ensemble DIR DIR ...``: the engine's answers (calibration and example memory on) of
each model dir on the test set, and, for every pair of them trained from different
starts (the ``seed`` in their ``training.json``), the mean of the pair's probabilities:
an ensemble of two independent runs, at twice the training and inference cost. Pairs
from one start are left out (that is ``soup-memory``'s comparison).

``knn`` (``--seed N``): trains the default recipe once, then mixes its temperature-scaled
probabilities with a k-nearest-neighbour vote over the fine-tuned backbone's pooled
vectors of the training states (the trainer's fitted part; the validation split stays out
of the memory): ``p = (1 - lam) * p_model + lam * p_knn``, with
``p_knn(y) ∝ sum over the k nearest of exp(cos / tau)`` for those labelled ``y``
(kNN-LM, Khandelwal et al. 2020). ``k``, ``tau`` and ``lam`` are chosen on the
validation split by NLL, and the temperature of the mixture is fitted there again; the
test set is scored once with the choice.

``memory-variants`` (``--seed N``): trains the default recipe with the memory of the
training states alone (``ProbeConfig(memory_add_validation=False)``, the trainer's way
before 2026-12-02:
the models of the ``full_memory_train_only*`` sections of ``finetune_banking77.json``,
which the ``full*`` sections, with the validation states, share), then builds other
memories for the same model from the outside, and scores each on the test set in fp32
and int8:
  * ``recorded``: the memory the trainer kept (checks that the probe's mixture, applied
    to the engine's calibrated head probabilities, gives the engine's own answers);
  * ``wide_grid``: settings chosen on the validation split as the trainer does, from a
    wider grid (``k`` up to 200, ``tau`` up to 0.2, ``lam`` up to 0.9; the trainer's
    choice sat on the edge of its grid, ``k = 50``, on four of five seeds);
  * ``plus_validation``: the recorded settings, with the validation states (vectors and
    labels) added to the memory after they chose them;
  * ``wide_grid_plus_validation``: both.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_banking77 as fb

import clef_engine.train.trainer as trainer_module
from benchmarks.probe_trainer import ProbeConfig, ProbeTrainer
from clef_engine.backbones.adapter import ADAPTER_DIR
from clef_engine.calibration.temperature import Calibrator, fit_temperature
from clef_engine.train.data import split

RESULTS = fb.ROOT / "benchmarks" / "results" / "finetune_probes.json"
QID = "category"
QUICK = False
"""``--quick``: 5 training and 3 test states per intent, one epoch, nothing saved."""


def save(section: str, payload: Any) -> None:
    if QUICK:
        print(json.dumps({section: "not saved (--quick)"}))
        return
    note = "one probe at a time on the 2 cores; docs/finetune.md says what else ran beside them"
    fb.save(section, payload, results=RESULTS, note=note)


class FullFineTuner(trainer_module.Trainer):
    """The default recipe with every encoder linear weight trained (no LoRA adapters)."""

    def build(self, data: Any, train: Any = None) -> None:
        super().build(data, train)  # builds the head and a LoRA model, replaced below
        self.model = copy.deepcopy(self.base_model)
        self.trained_layers: list[str] = []
        for p in self.model.parameters():
            p.requires_grad_(False)
        for name, module in self.model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.startswith("encoder."):
                module.weight.requires_grad_(True)  # _trainable() names it "lora.<name>"
                self.trained_layers.append(name)
        self.model.to(self.device)

    def _write(self, out: Path, data: Any, *args: Any, **kwargs: Any) -> None:
        from safetensors.torch import save_file

        base = dict(self.base_model.named_modules())
        tuned = dict(self.model.named_modules())
        tensors = {}
        for name in self.trained_layers:
            delta = (tuned[name].weight.detach() - base[name].weight.detach()).float().cpu()
            prefix = f"base_model.model.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.eye(delta.shape[1])
            tensors[f"{prefix}.lora_B.weight"] = delta.contiguous()
        rank = self.config.lora_rank
        self.config.lora_rank = 0  # the parent writes no peft adapter then
        try:
            super()._write(out, data, *args, **kwargs)
        finally:
            self.config.lora_rank = rank
        adapter = Path(out) / ADAPTER_DIR
        adapter.mkdir(exist_ok=True)
        save_file(tensors, str(adapter / "adapter_model.safetensors"))
        config = {"peft_type": "LORA", "r": 1, "lora_alpha": 1}  # scaling alpha / r = 1
        (adapter / "adapter_config.json").write_text(json.dumps(config))


class SameStartTrainer(trainer_module.Trainer):
    """Initialisation from ``start_seed``; batch order and dropout from ``config.seed``."""

    start_seed = 0

    def build(self, data: Any, train: Any = None) -> None:
        seed = self.config.seed
        self.config.seed = self.start_seed
        try:
            super().build(data, train)
        finally:
            self.config.seed = seed


def load() -> tuple[Any, Any]:
    root = fb.data_dir()
    train = fb.load_training_data(root / "train.csv", label_col=QID)
    test = fb.load_eval_data(root / "test.csv", {QID: train.questions[QID]}, label_col=QID)
    if QUICK:
        return fb.sample_per_label(train, 5, seed=0), fb.sample_per_label(test, 3, seed=0)
    return train, test


def config(**kw: Any) -> Any:
    # The probes measure the recipe as it was before the example memory became a default
    # (the ``knn`` probe is that memory, done from the outside).
    kw.setdefault("memory", False)
    return fb.TrainConfig(progress=False, **({"epochs": 1} if QUICK else {}), **kw)


def _logits(engine: Any, data: Any) -> tuple[np.ndarray, np.ndarray]:
    """Uncalibrated logits (log of the raw head's probabilities) and labels."""
    question = data.questions[QID]
    engine.calibrator = Calibrator(source="identity")
    engine.head.memory = None  # the head's own logits (the probes train without a memory)
    texts = [ex.state for ex in data.examples]
    raw = fb._probabilities(engine, texts, QID, question)
    labels = np.array([ex.labels[QID] for ex in data.examples])
    return np.log(np.clip(raw, 1e-300, 1.0)), labels


def _metrics(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    out = fb._metrics(p, labels)
    recall = [float((p.argmax(1)[labels == c] == c).mean()) for c in np.unique(labels)]
    out["balanced_accuracy"] = round(float(np.mean(recall)) * 100, 2)
    return out


def _weighted_temperature(logits: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> float:
    log_t = torch.zeros(1, requires_grad=True)
    z, y, w = torch.tensor(logits), torch.tensor(labels), torch.tensor(weights)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        nll = torch.nn.functional.cross_entropy(z / log_t.exp(), y, reduction="none")
        loss = (nll * w).sum() / w.sum()
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp())


def full_finetune(seed: int, lr: float) -> None:
    train, test = load()
    fb.Trainer = FullFineTuner  # fb.run builds its trainer from this name
    name = f"full_finetune_lr{lr:g}" + (f"_seed{seed}" if seed else "")
    save(name, fb.run(name, train, test, config(seed=seed, lr=lr), int8=False))


def prior_soup() -> None:
    train, test = load()
    fitted, val = split(train, fb.TrainConfig().val_fraction, seed=0)  # as the trainer does
    n = len(train.questions[QID].option_specs())
    with tempfile.TemporaryDirectory(prefix="clef-probe-") as tmp:
        members = [Path(tmp) / "seed0", Path(tmp) / "start0_order1"]
        seconds = []
        for directory, trainer in (
            (members[0], trainer_module.Trainer(config(seed=0))),
            (members[1], SameStartTrainer(config(seed=1))),
        ):
            # The validation split follows the seed; both members keep seed 0's.
            started = time.perf_counter()
            trainer_module.split = _split_of_seed0
            try:
                trainer.fit(train, directory)
            finally:
                trainer_module.split = split
            seconds.append(round(time.perf_counter() - started, 1))
        engines = [fb.DecisionEngine.from_pretrained(d) for d in members]

        # Prior: logit adjustment towards a uniform prior over the intents.
        counts = np.bincount([ex.labels[QID] for ex in fitted.examples], minlength=n)
        log_prior = np.log(counts / counts.sum())
        temperature = engines[0].calibrator.temperature("choice", n)
        val_z, val_y = _logits(engines[0], val)
        test_z, test_y = _logits(engines[0], test)
        weights = np.exp(-log_prior)[val_y] / n  # uniform / training prior, per state
        weighted_t = _weighted_temperature(val_z - log_prior, val_y, weights)
        prior: dict[str, Any] = {
            "train_seconds": seconds[0],
            "training_counts": {"min": int(counts.min()), "max": int(counts.max())},
            "temperature": round(temperature, 4),
            "weighted_temperature_after_adjustment": round(weighted_t, 4),
        }
        for split_name, z, y in (("validation", val_z, val_y), ("test", test_z, test_y)):
            for tau in (0.0, 0.5, 1.0):
                prior[f"{split_name}_tau{tau:g}"] = _metrics(z / temperature - tau * log_prior, y)
            prior[f"{split_name}_before_temperature_weighted_fit"] = _metrics(
                (z - log_prior) / weighted_t, y
            )
        save("full_prior_adjustment", prior)

        # Soup: average the two members' merged weights and heads.
        soup: dict[str, Any] = {"train_seconds": seconds}
        for tag, engine in zip(("seed0", "start0_order1"), engines, strict=True):
            soup[tag] = _calibrated(engine, val, test)
        with torch.no_grad():
            for part in ("backbone", "head"):
                modules = [
                    e.backbone.model if part == "backbone" else e.head.module for e in engines
                ]
                states = [m.state_dict() for m in modules]
                averaged = {
                    k: sum(s[k].float() for s in states) / len(states)
                    if states[0][k].is_floating_point()
                    else states[0][k]
                    for k in states[0]
                }
                modules[0].load_state_dict(averaged)
        soup["soup"] = _calibrated(engines[0], val, test)
        save("full_soup_2", soup)


def soup_memory(seed: int, order_seed: int, keep: Path | None = None) -> None:
    train, test = load()
    cfg = fb.TrainConfig(progress=False, seed=seed, **({"epochs": 1} if QUICK else {}))
    fitted, val = split(train, cfg.val_fraction, seed=seed)  # as the trainer does
    result: dict[str, Any] = {"seed": seed, "order_seed": order_seed}

    def finish(trainer: Any, directory: Path) -> dict[str, Any]:
        """The tail of ``Trainer.fit``: temperature and memory on the validation split."""
        started = time.perf_counter()
        metrics, logits, labels, types = trainer.evaluate(val)
        calibration = trainer_module.fit_calibrator(logits, labels, types, source="validation")
        memory = trainer.fit_memory(fitted, val, calibration)
        trainer._write(directory, train, calibration, [], 0, dict(metrics), 0.0, memory)
        out = {
            "validation": {k: round(v, 4) for k, v in metrics.items()},
            "memory": memory,
            "test": fb.evaluate(directory, test),
            "finish_seconds": round(time.perf_counter() - started, 1),
        }
        print(json.dumps({"validation": out["validation"], "test": out["test"]}), flush=True)
        return out

    with tempfile.TemporaryDirectory(prefix="clef-probe-") as tmp:
        out = keep or Path(tmp)  # the model dirs (``--keep``: for the ``ensemble`` probe)
        states = []
        for order in (seed, order_seed):
            trainer = SameStartTrainer(dataclasses.replace(cfg, seed=order))
            trainer.start_seed = seed
            trainer.build(train, fitted)
            started = time.perf_counter()
            history, best = trainer._supervised(
                fitted, val, cfg.epochs, Path(tmp) / f"checkpoint{order}", False
            )
            if best["state"] is not None:
                trainer._restore(best["state"])
            trainer.config = cfg  # training.json keeps the start's seed: ensemble pairs by it
            states.append(trainer._state())
            result[f"member_order{order}"] = {
                "train_seconds": round(time.perf_counter() - started, 1),
                "best_epoch": best["epoch"],
                "history": history,
                **finish(trainer, out / f"member_order{order}"),
            }
        k = len(states)
        trainer = trainer_module.Trainer(
            dataclasses.replace(
                cfg,
                lora_rank=cfg.lora_rank * k,
                lora_alpha=(cfg.lora_alpha or 2 * cfg.lora_rank) * k,  # the same scaling
            )
        )
        trainer.build(train, fitted)
        soup = {}
        for name in states[0]:
            if ".lora_A." in name:
                soup[name] = torch.cat([s[name] for s in states], 0)
            elif ".lora_B." in name:
                soup[name] = torch.cat([s[name] / k for s in states], 1)
            else:
                soup[name] = sum(s[name] for s in states) / k
        trainer._restore(soup)
        result["soup"] = finish(trainer, out / "soup")
    save(f"full_soup_memory_seed{seed}", result)


def ensemble(directories: list[Path]) -> None:
    _, test = load()
    question = test.questions[QID]
    texts = [ex.state for ex in test.examples]
    labels = np.array([ex.labels[QID] for ex in test.examples])
    probabilities, models = {}, {}
    for directory in directories:
        name = str(directory)
        engine = fb.DecisionEngine.from_pretrained(directory)  # calibration and memory on
        probabilities[name] = fb._probabilities(engine, texts, QID, question)
        report = json.loads((directory / "training.json").read_text())
        models[name] = {
            "start_seed": report["config"]["seed"],
            "test": fb._metrics(probabilities[name], labels),
        }
        print(json.dumps({name: models[name]}), flush=True)
    pairs = []
    names = list(models)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if models[a]["start_seed"] == models[b]["start_seed"]:
                continue  # same start: that is the soup-memory probe's comparison
            pair = {
                "models": [a, b],
                "member_mean_macro_f1": round(
                    (models[a]["test"]["macro_f1"] + models[b]["test"]["macro_f1"]) / 2, 2
                ),
                "test": fb._metrics((probabilities[a] + probabilities[b]) / 2, labels),
            }
            print(json.dumps(pair), flush=True)
            pairs.append(pair)
    result: dict[str, Any] = {"models": models, "pairs": pairs}
    if pairs:
        result["pairs_mean"] = {
            k: round(float(np.mean([p["test"][k] for p in pairs])), 4)
            for k in ("accuracy", "macro_f1", "ece", "nll")
        }
        result["pairs_mean"]["member_mean_macro_f1"] = round(
            float(np.mean([p["member_mean_macro_f1"] for p in pairs])), 2
        )
    save("full_ensemble", result)


def knn(seed: int) -> None:
    train, test = load()
    fitted, val = split(train, fb.TrainConfig().val_fraction, seed=seed)  # as the trainer does
    n = len(train.questions[QID].option_specs())
    with tempfile.TemporaryDirectory(prefix="clef-probe-") as tmp:
        started = time.perf_counter()
        trainer_module.Trainer(config(seed=seed)).fit(train, Path(tmp))
        seconds = round(time.perf_counter() - started, 1)
        engine = fb.DecisionEngine.from_pretrained(Path(tmp))
        temperature = engine.calibrator.temperature("choice", n)

        def vectors(data: Any) -> np.ndarray:
            texts = [ex.state for ex in data.examples]
            return engine.backbone.encode(texts).pooled.cpu().numpy()

        started = time.perf_counter()
        memory = vectors(fitted)
        memory_y = np.array([ex.labels[QID] for ex in fitted.examples])
        memory_seconds = round(time.perf_counter() - started, 1)
        split_data = {"validation": val, "test": test}
        z = {k: _logits(engine, d) for k, d in split_data.items()}
        sims = {k: vectors(d) @ memory.T for k, d in split_data.items()}

    def model_p(name: str) -> np.ndarray:
        logits = z[name][0] / temperature
        p = np.exp(logits - logits.max(1, keepdims=True))
        return p / p.sum(1, keepdims=True)

    def knn_p(name: str, k: int, tau: float) -> np.ndarray:
        s = sims[name]
        top = np.argpartition(-s, k - 1, axis=1)[:, :k]
        near = np.take_along_axis(s, top, axis=1)
        w = np.exp((near - near.max(1, keepdims=True)) / tau)
        p = np.zeros((len(s), n))
        np.add.at(p, (np.arange(len(s))[:, None], memory_y[top]), w)
        return p / p.sum(1, keepdims=True)

    def log(p: np.ndarray) -> np.ndarray:
        return np.log(np.clip(p, 1e-12, 1))

    def mixed(name: str, k: int, tau: float, lam: float) -> np.ndarray:
        return log((1 - lam) * model_p(name) + lam * knn_p(name, k, tau))

    val_y, test_y = z["validation"][1], z["test"][1]
    grid: list[dict[str, Any]] = [
        {"k": k, "tau": tau, "lam": lam}
        for k in (5, 10, 20, 50)
        for tau in (0.02, 0.05, 0.1)
        for lam in (0.1, 0.2, 0.3, 0.5, 0.7)
    ]
    scored = []
    for g in grid:
        m = _metrics(mixed("validation", g["k"], g["tau"], g["lam"]), val_y)
        scored.append({**g, "validation_nll": m["nll"], "validation_accuracy": m["accuracy"]})
    best = min(scored, key=lambda r: r["validation_nll"])
    k, tau, lam = best["k"], best["tau"], best["lam"]
    val_mix = mixed("validation", k, tau, lam)
    t = fit_temperature(torch.tensor(val_mix), torch.tensor(val_y))
    result: dict[str, Any] = {
        "train_seconds": seconds,
        "memory_states": len(memory_y),
        "memory_seconds": memory_seconds,
        "temperature": round(temperature, 4),
        "model": {
            "validation": _metrics(log(model_p("validation")), val_y),
            "test": _metrics(log(model_p("test")), test_y),
        },
        "knn_alone": {
            "validation": _metrics(log(knn_p("validation", k, tau)), val_y),
            "test": _metrics(log(knn_p("test", k, tau)), test_y),
        },
        "chosen": {
            "k": k,
            "tau": tau,
            "lam": lam,
            "mixture_temperature": round(t, 4),
            "validation": _metrics(val_mix / t, val_y),
            "test": _metrics(mixed("test", k, tau, lam) / t, test_y),
        },
        "validation_grid": scored,
    }
    print(json.dumps({key: result[key] for key in ("model", "knn_alone", "chosen")}), flush=True)
    save("full_knn_mixture" + (f"_seed{seed}" if seed else ""), result)


WIDE_GRID = {
    "grid_k": (5, 10, 20, 50, 100, 200),
    "grid_tau": (0.02, 0.05, 0.1, 0.2),
    "grid_lambda": (0.1, 0.2, 0.3, 0.5, 0.7, 0.9),
}


def memory_variants(seed: int) -> None:
    from clef_engine.heads.memory import QuestionMemory, fit_question_memory

    train, test = load()
    _, val = split(train, fb.TrainConfig().val_fraction, seed=seed)  # as the trainer does
    names = train.names(QID)
    test_y = np.array([ex.labels[QID] for ex in test.examples])
    val_y = torch.tensor([ex.labels[QID] for ex in val.examples])
    result: dict[str, Any] = {"packages": fb.package_versions(), "cpu": fb.cpu_model()}
    wide: QuestionMemory | None = None
    with tempfile.TemporaryDirectory(prefix="clef-probe-") as tmp:
        started = time.perf_counter()
        # The training states alone in the memory: the variants below add to it.
        probe = ProbeConfig(
            progress=False,
            seed=seed,
            memory_add_validation=False,
            **({"epochs": 1} if QUICK else {}),
        )
        trained = ProbeTrainer(probe).fit(train, Path(tmp))
        result["train_seconds"] = round(time.perf_counter() - started, 1)
        result["trainer_memory"] = trained.memory
        for precision in ("fp32", "int8"):
            engine = fb.DecisionEngine.from_pretrained(
                Path(tmp), quantize="int8" if precision == "int8" else None
            )
            recorded = engine.head.memory.get("choice", names)
            assert recorded is not None, "the default recipe kept no memory"
            engine_answers = fb._probabilities(
                engine, [ex.state for ex in test.examples], QID, train.questions[QID]
            )
            test_p, test_v = _head_and_vectors(engine, test)
            if wide is None:  # settings are chosen once, in fp32, as the trainer does
                val_p, val_v = _head_and_vectors(engine, val)
                wide, report = fit_question_memory(
                    recorded.vectors, recorded.labels, names, val_v, val_p, val_y, **WIDE_GRID
                )
                assert wide is not None, report
                result["wide_grid_report"] = report
            variants = {
                "recorded": recorded,
                "wide_grid": QuestionMemory(
                    recorded.vectors, recorded.labels, names, wide.settings
                ),
            }
            # What the trainer's memory stores (ADD_VALIDATION_TO_MEMORY; QuestionMemory.extended).
            for name in ("recorded", "wide_grid"):
                prefix = "" if name == "recorded" else f"{name}_"
                variants[f"{prefix}plus_validation"] = variants[name].extended(val_v, val_y)
            out: dict[str, Any] = {"head": fb._metrics(test_p.numpy(), test_y)}
            for name, memory in variants.items():
                p = memory.mix(test_p, test_v, names).numpy()
                out[name] = {
                    **asdict_settings(memory),
                    "states": len(memory),
                    "test": fb._metrics(p, test_y),
                }
            probe_p = recorded.mix(test_p, test_v, names).numpy()
            out["recorded"]["max_abs_diff_to_engine"] = float(
                np.abs(probe_p - engine_answers).max()
            )
            result[precision] = out
            print(json.dumps({precision: out}), flush=True)
    save("full_memory_variants" + (f"_seed{seed}" if seed else ""), result)


def _head_and_vectors(engine: Any, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's calibrated head probabilities (memory off) and pooled vectors."""
    texts = [ex.state for ex in data.examples]
    memory, engine.head.memory = engine.head.memory, None
    try:
        p = fb._probabilities(engine, texts, QID, data.questions[QID])
    finally:
        engine.head.memory = memory
    return torch.from_numpy(p), engine.backbone.encode(texts).pooled.float().cpu()


def asdict_settings(memory: Any) -> dict[str, Any]:
    s = memory.settings
    return {"k": s.k, "tau": s.tau, "lam": s.lam, "temperature": round(s.temperature, 4)}


def _split_of_seed0(data: Any, fraction: float, *, seed: int = 0) -> Any:
    return split(data, fraction, seed=0)


def _calibrated(engine: Any, val: Any, test: Any) -> dict[str, Any]:
    """Temperature fitted on the validation split, metrics on both splits."""
    val_z, val_y = _logits(engine, val)
    test_z, test_y = _logits(engine, test)
    t = fit_temperature(torch.tensor(val_z), torch.tensor(val_y))
    out = {
        "temperature": round(t, 4),
        "validation": _metrics(val_z / t, val_y),
        "test": _metrics(test_z / t, test_y),
    }
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "probe",
        choices=[
            "full-finetune",
            "prior-soup",
            "soup-memory",
            "ensemble",
            "knn",
            "memory-variants",
        ],
    )
    parser.add_argument(
        "models", nargs="*", type=Path, help="ensemble: model dirs (e.g. from soup-memory --keep)"
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="soup-memory: write the model dirs here"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="full-finetune, soup-memory, knn, memory-variants: the recipe's seed",
    )
    parser.add_argument(
        "--order-seed", type=int, default=1, help="soup-memory: the second member's order seed"
    )
    parser.add_argument("--lr", type=float, default=1e-4, help="full-finetune: learning rate")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run; saves nothing")
    args = parser.parse_intermixed_args()  # model dirs may follow the options
    global QUICK
    QUICK = args.quick
    torch.set_num_threads(args.threads)
    if args.probe == "full-finetune":
        full_finetune(args.seed, args.lr)
    elif args.probe == "knn":
        knn(args.seed)
    elif args.probe == "soup-memory":
        if args.order_seed == args.seed:
            parser.error("--order-seed must differ from --seed (the members would be one run)")
        soup_memory(args.seed, args.order_seed, args.keep)
    elif args.probe == "ensemble":
        if len(args.models) < 2:
            parser.error("ensemble needs at least two model dirs")
        ensemble(args.models)
    elif args.probe == "memory-variants":
        memory_variants(args.seed)
    else:
        prior_soup()


if __name__ == "__main__":
    main()
