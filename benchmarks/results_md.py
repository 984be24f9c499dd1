"""Write docs/results.md from benchmarks/results/*.json (the page is generated, never edited).

Every number on the page is read from a committed results file, next to the machine that
file says it was measured on. A file this script has no layout for is still listed, field
by field, so a new benchmark shows up the day its JSON is committed. Run from the repo root:

    python -m benchmarks.results_md           # rewrite docs/results.md
    python -m benchmarks.results_md --check   # exit 1 if docs/results.md is out of date

``tests/docs/test_results_page.py`` runs the check, so a results file committed without
regenerating the page fails the suite.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"

Json = dict[str, Any]


# --- formatting ------------------------------------------------------------------------


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _frac(value: Any, digits: int = 1) -> str:
    """A fraction in [0, 1] as a percentage."""
    return "–" if value is None else f"{100 * float(value):.{digits}f} %"


def _pct(value: Any, digits: int = 2) -> str:
    """A value that is already a percentage."""
    return "–" if value is None else f"{float(value):.{digits}f} %"


def _table(header: list[str], rows: Iterable[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def machine(info: Any) -> str:
    """One line naming the machine a result came from, from whatever the file recorded."""
    if info is None:
        return "not recorded"
    if isinstance(info, str):
        return info
    parts: list[str] = []
    if info.get("device"):
        parts.append(str(info["device"]))
    if info.get("cpu"):
        parts.append(str(info["cpu"]))
    if info.get("platform"):
        parts.append(str(info["platform"]))
    cores = info.get("cores", info.get("cpus"))
    if cores:
        parts.append(f"{cores} cores")
    threads = info.get("torch_threads", info.get("cpu_threads", info.get("threads")))
    if threads:
        parts.append(f"{threads} torch thread{'s' * (threads != 1)}")
    if info.get("memory_gib"):
        parts.append(f"{info['memory_gib']} GiB")
    if "gpu" in info:
        parts.append(f"GPU {info['gpu']}" if info["gpu"] else "no GPU")
    for key, label in (("python", "Python"), ("torch", "torch")):
        if info.get(key):
            parts.append(f"{label} {info[key]}")
    for key in ("transformers", "peft"):
        if info.get(key):
            parts.append(f"{key} {info[key]}")
    if info.get("ocr_precision"):
        parts.append(f"OCR recogniser in {info['ocr_precision']}")
    if info.get("load_avg_1m") is not None:
        parts.append(f"load average {info['load_avg_1m']:.1f}")
    if info.get("commit"):
        parts.append(f"commit {info['commit']}")
    if info.get("date"):
        parts.append(str(info["date"]))
    return ", ".join(parts) or "not recorded"


# --- general_model.json ----------------------------------------------------------------


def general_model(data: Json) -> str:
    runs = {name: run for name, run in data.items() if isinstance(run, dict) and "machine" in run}
    scored = {n: r for n, r in runs.items() if "noul_suite" in r or "banking77_zero_shot" in r}
    out = [
        "Zero-shot quality of the default engine (the general decision model, `general`) and "
        'of the bare similarity scorer (`scorer="similarity"`), with no examples and no '
        "fine-tuning. The yes/no suite (`tests/data/noul_suite.jsonl`) and BANKING77 were "
        "never trained on; the decision-mixture test sets are **in-distribution** (the model "
        "trained on their training splits). `prompt_injection` (built by "
        "`python -m clef_engine.train.injection_set`) is unseen by every model not trained "
        "with it; `general_with_prompt_injection_not_shipped` was trained and tested on the "
        "set's first version (before Do-Not-Answer's questions to the assistant joined its "
        "benign side), every other `prompt_injection` cell on the current one. Columns named "
        "`seed1` repeat a recipe with seed 1 (the others use seed 0): the gap between a "
        "recipe's two seeds is run-to-run noise; `general_seed1_split0_not_shipped` also "
        "used seed 1 but held out seed 0's calibration rows (`--split-seed 0`), and "
        "`general_soup_seeds01_not_shipped` is its weight average with `general` "
        "(`benchmarks/general_soup.py`). `general`, `general_int8`, "
        "`general_with_evidence_head_not_shipped`, `general_question_aware_not_shipped`, "
        "`general_all_layers_not_shipped`, `general_all_layers_seed1_not_shipped`, "
        "`general_soup_with_all_layers_not_shipped`, `general_seed1_split0_not_shipped` and "
        "`general_soup_seeds01_not_shipped` were calibrated after the option-order "
        "fix of 2026-12-07 (abb8996); the other `_not_shipped` columns were calibrated "
        "before it, so their ECE on 2- to 8-option choices (hate_offensive, snips, "
        "tweeteval_emotion, tweeteval_stance) is that of too-flat temperatures; their "
        "accuracies are unaffected. int8 accuracy moves with the CPU's int8 kernels: "
        "`general_int8` was measured on AMD EPYC, the earlier int8 columns on Intel Xeon.",
        "",
        "Commands: `python -m benchmarks.general_model [--scorer similarity] [--quantize "
        "int8] --ten-shot`, `--latency-ab` for the latency rows; `--model DIR --name NAME` for "
        "a trained model dir (the `_not_shipped` columns; their training commands are in "
        "`engine/data/general/MODEL_CARD.md`).",
        "",
    ]
    names = list(scored)
    rows: list[list[str]] = []

    def row(label: str, get: Callable[[Json], str]) -> None:
        cells = [get(scored[n]) for n in names]
        if any(c != "–" for c in cells):
            rows.append([label, *cells])

    def metric(run: Json, key: str, field: str) -> Any:
        return (run.get(key) or {}).get(field)

    row("yes/no suite, accuracy at 0.5", lambda r: _count(r.get("noul_suite")))
    row("yes/no suite, ECE", lambda r: _num(metric(r, "noul_suite", "ece"), 3))
    row(
        "BANKING77 zero-shot, accuracy",
        lambda r: _frac(metric(r, "banking77_zero_shot", "accuracy")),
    )
    row("BANKING77 zero-shot, ECE", lambda r: _num(metric(r, "banking77_zero_shot", "ece"), 3))
    row(
        "BANKING77 10 examples per intent (seed 0), accuracy",
        lambda r: _frac(metric(r, "banking77_ten_shot_seed0", "accuracy")),
    )
    row(
        "decision-mixture test sets, mean accuracy over the 12 shared sets (in-distribution)",
        lambda r: _frac(r.get("mixture_mean_accuracy")),
    )
    out += [_table(["", *[f"`{n}`" for n in names]], rows), ""]

    sets = sorted({s for n in names for s in (scored[n].get("mixture_test") or {})})
    if sets:
        out += ["Per decision-mixture test set (accuracy / ECE):", ""]
        out.append(
            _table(
                ["set", "rows", *[f"`{n}`" for n in names]],
                [
                    [
                        s,
                        _num(
                            _first(
                                scored[n].get("mixture_test", {}).get(s, {}).get("n") for n in names
                            )
                        ),
                        *[_acc_ece(scored[n].get("mixture_test", {}).get(s)) for n in names],
                    ]
                    for s in sets
                ],
            )
        )
        out.append("")
    cats = sorted({c for n in names for c in (scored[n].get("noul_suite_by_category") or {})})
    if cats:
        out += ["Yes/no suite by category (accuracy):", ""]
        out.append(
            _table(
                ["category", *[f"`{n}`" for n in names]],
                [
                    [
                        c,
                        *[
                            _frac(scored[n].get("noul_suite_by_category", {}).get(c), 0)
                            for n in names
                        ],
                    ]
                    for c in cats
                ],
            )
        )
        out.append("")
    ab = (runs.get("latency_ab") or {}).get("latency_ab")
    if ab:
        out += [
            "Single-decision latency, p50 per round, median of the rounds (rounds alternate "
            "between the engines):",
            "",
        ]
        lat_rows = [
            [
                name,
                _num(v.get("p50_ms_median"), 2) + " ms",
                ", ".join(_num(x, 2) for x in v.get("p50_ms_per_round", [])),
            ]
            for name, v in ab.items()
            if isinstance(v, dict)
        ]
        out.append(_table(["engine", "p50", "rounds (ms)"], lat_rows))
        ratios = [f"{k} {v}" for k, v in ab.items() if k.startswith("ratio")]
        if ratios:
            out += ["", "General / similarity: " + ", ".join(ratios) + "."]
        out.append("")
    out += _machines({n: r.get("machine") for n, r in runs.items()})
    return "\n".join(out)


def _count(result: Json | None) -> str:
    """Accuracy with the count it came from (the stored fraction is rounded to 4 places)."""
    if not result or result.get("accuracy") is None:
        return "–"
    n = result.get("n")
    if not n:
        return _frac(result["accuracy"])
    right = round(result["accuracy"] * n)
    return f"{_frac(right / n)} ({right}/{n})"


def _first(values: Iterable[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def _acc_ece(result: Json | None) -> str:
    if not result:
        return "–"
    return f"{_frac(result.get('accuracy'))} / {_num(result.get('ece'), 3)}"


def _machines(by_name: dict[str, Any]) -> list[str]:
    lines = {machine(m) for m in by_name.values()}
    if len(lines) == 1:
        return [f"Machine: {lines.pop()}.", ""]
    out = ["Machines:", ""]
    out += [f"- `{name}`: {machine(m)}" for name, m in by_name.items()]
    return [*out, ""]


# --- banking77_engine.json -------------------------------------------------------------


def banking77_engine(data: Json) -> str:
    out = [
        "The engine on BANKING77 with the bare similarity scorer (the scorer the default "
        "engine uses for options taught by examples): zero-shot over 77 readable intent "
        "names, 10 examples per intent (prototype head + example memory, mean of 3 seeds), "
        "and the full training set as prototypes.",
        "",
        "Command: `python -m benchmarks.banking77_engine`. "
        + (str(data.get("data", "")) + "." if data.get("data") else ""),
        "",
    ]
    settings = [
        ("zero_shot", "zero-shot"),
        ("ten_shot_mean_of_3_seeds", "10 per intent, 3 seeds"),
        ("full_train_prototypes", "full train set as prototypes"),
    ]
    rows = []
    for precision in ("fp32", "int8", "bf16"):
        section = data.get(precision) or {}
        for key, label in settings:
            r = section.get(key)
            if not r:
                continue
            alone = (r.get("head_alone") or {}).get("accuracy")
            rows.append(
                [
                    precision,
                    label,
                    _frac(r.get("accuracy")),
                    _num(100 * r["macro_f1"], 1) if r.get("macro_f1") is not None else "–",
                    f"{_num(r.get('ece_before_calibration'), 3)} → {_num(r.get('ece'), 3)}",
                    _num(r.get("brier"), 3),
                    _frac(alone),
                    _num(r.get("prototype_fit_s"), 1),
                ]
            )
    out.append(
        _table(
            [
                "precision",
                "setting",
                "accuracy",
                "macro-F1",
                "ECE before → after calibration",
                "Brier",
                "head alone (memory off)",
                "fit (s)",
            ],
            rows,
        )
    )
    out.append("")
    speed = []
    for precision in ("fp32", "int8", "bf16"):
        section = data.get(precision) or {}
        lat = (section.get("latency") or {}).get("decide_77_options") or {}
        bare = (section.get("latency") or {}).get("bare_backbone_forward") or {}
        thr = section.get("throughput") or {}
        if lat or thr:
            speed.append(
                [
                    precision,
                    _num(lat.get("p50_ms"), 2),
                    _num(lat.get("p95_ms"), 2),
                    _num(bare.get("p50_ms"), 2),
                    _num(thr.get("decisions_per_s"), 1),
                    _num(thr.get("batch_size")),
                ]
            )
    if speed:
        out += [
            "Speed of this run (one 77-option decision; batched throughput):",
            "",
            _table(
                [
                    "precision",
                    "decide p50 (ms)",
                    "p95 (ms)",
                    "bare forward p50 (ms)",
                    "decisions/s",
                    "batch",
                ],
                speed,
            ),
            "",
        ]
    out.append(f"Machine: {machine(data.get('machine'))}.")
    previous = data.get("previous_run_speed")
    if previous:
        prev_rows = []
        for precision in ("fp32", "int8", "bf16"):
            section = previous.get(precision) or {}
            lat = (section.get("latency") or {}).get("decide_77_options") or {}
            thr = section.get("throughput") or {}
            if lat or thr:
                prev_rows.append(
                    [
                        precision,
                        _num(lat.get("p50_ms"), 2),
                        _num(lat.get("p95_ms"), 2),
                        _num(thr.get("decisions_per_s"), 1),
                    ]
                )
        out += [
            "",
            f"An earlier run's speed (`previous_run_speed`: {previous.get('note', '')}):",
            "",
            _table(["precision", "decide p50 (ms)", "p95 (ms)", "decisions/s"], prev_rows),
            "",
            f"Machine: {machine(previous.get('machine'))}.",
        ]
    return "\n".join(out) + "\n"


# --- finetune_banking77.json -----------------------------------------------------------


def finetune_banking77(data: Json) -> str:
    env = data.get("environment") or {}
    out = [
        "Fine-tuning runs on BANKING77 (`clef-agents finetune` / `Trainer`), test split, "
        "temperature-calibrated. Accuracy and macro-F1 are percentages of the 3,080 test "
        'rows; "+ memory" is the model with its example memory (the default since it was '
        "measured); a section with several runs shows their mean. Guide: "
        "[finetune.md](finetune.md).",
        "",
        "Command: `python benchmarks/finetune_banking77.py` (`--only SECTION`, `--seed N`).",
        "",
        f"Environment of the file: {machine(env)}. {env.get('note', '')}".rstrip(),
        "",
    ]
    rows = []
    for key, section in data.items():
        if key == "environment" or not isinstance(section, dict):
            continue
        if "table" in section:
            for t in section["table"]:
                rows.append(
                    [
                        f"`{key}`",
                        str(t.get("variant", "")),
                        "–",
                        _pct(t.get("accuracy")),
                        _num(t.get("macro_f1"), 2),
                        _num(t.get("ece_temperature"), 4),
                        "–",
                        "–",
                        _minutes([t.get("train_seconds")]),
                        "not recorded",
                    ]
                )
            continue
        rows.append(_finetune_row(key, section))
    out.append(
        _table(
            [
                "section",
                "run",
                "train states",
                "accuracy",
                "macro-F1",
                "ECE",
                "+ memory",
                "int8 accuracy",
                "training",
                "CPU",
            ],
            rows,
        )
    )
    return "\n".join(out) + "\n"


def _finetune_row(key: str, section: Json) -> list[str]:
    if "mean" in section:
        m = section["mean"]
        runs = section.get("runs") or []
        mem = m.get("fp32_memory_accuracy")
        return [
            f"`{key}`",
            f"{len(runs)} run{'s' * (len(runs) != 1)}"
            + (f" ({runs[0].get('name')}, ...)" if runs else ""),
            _num(_first(r.get("train_states") for r in runs)),
            _pct(m.get("fp32_temperature_accuracy")),
            _num(m.get("fp32_temperature_macro_f1"), 2),
            _num(m.get("fp32_temperature_ece"), 4),
            _pct(mem) if mem is not None else "–",
            _pct(_first([m.get("int8_memory_accuracy"), m.get("int8_temperature_accuracy")])),
            _minutes([r.get("train_seconds") for r in runs]),
            str(_first([section.get("cpu"), *(r.get("cpu") for r in runs)]) or "not recorded"),
        ]
    fp32 = section.get("fp32") or {}
    t = fp32.get("temperature") or {}
    mem = fp32.get("memory") or {}
    int8 = section.get("int8") or {}
    int8_acc = _first(
        [
            (int8.get("memory") or {}).get("accuracy"),
            (int8.get("temperature") or {}).get("accuracy"),
        ]
    )
    return [
        f"`{key}`",
        str(section.get("name", key)),
        _num(section.get("train_states")),
        _pct(t.get("accuracy")),
        _num(t.get("macro_f1"), 2),
        _num(t.get("ece"), 4),
        _pct(mem["accuracy"]) if mem.get("accuracy") is not None else "–",
        _pct(int8_acc),
        _minutes([section.get("train_seconds")]),
        str(section.get("cpu") or "not recorded"),
    ]


def _minutes(seconds: list[Any]) -> str:
    values = [float(s) for s in seconds if isinstance(s, (int, float))]
    if not values:
        return "–"
    low, high = min(values) / 60, max(values) / 60
    return f"{low:.1f} min" if abs(high - low) < 0.05 else f"{low:.1f}–{high:.1f} min"


# --- finetune_sweep_gpu.json -----------------------------------------------------------


def finetune_sweep_gpu(data: Json) -> str:
    out = [
        "A recipe sweep of the fine-tuning trainer on a GPU (`python "
        "benchmarks/gpu/finetune_sweep.py`); the CPU runs above are the measurements of "
        "record. Mean test macro-F1 (%) per variant over its seeds, and of ensembles of "
        "consecutive seeds' runs (k members):",
        "",
    ]
    variants = (data.get("ensembles") or {}).get("variants") or {}
    if variants:
        rows = []
        for name, v in variants.items():
            single = v.get("single") or {}
            cells = [
                name,
                _num(len(v.get("seeds", []))),
                _num(single.get("macro_f1_mean"), 2),
                f"{_num(single.get('macro_f1_min'), 2)}–{_num(single.get('macro_f1_max'), 2)}",
                _num(single.get("ece_mean"), 4),
            ]
            for k in ("k2_consecutive", "k3_consecutive", "k4_consecutive"):
                cells.append(_num((v.get(k) or {}).get("macro_f1_mean"), 2))
            rows.append(cells)
        out.append(
            _table(["variant", "seeds", "macro-F1", "range", "ECE", "k=2", "k=3", "k=4"], rows)
        )
    else:
        runs = data.get("runs") or []
        out.append(
            _table(
                ["run", "macro-F1", "training"],
                [
                    [
                        str(r.get("name")),
                        _num(((r.get("fp32") or {}).get("temperature") or {}).get("macro_f1"), 2),
                        _minutes([r.get("train_seconds")]),
                    ]
                    for r in runs
                ],
            )
        )
    out += ["", f"Machine: {machine(data.get('environment'))}.", ""]
    return "\n".join(out)


# --- the smaller files -----------------------------------------------------------------


def vision_screenshots(data: Json) -> str:
    lat = data.get("latency_ms") or {}
    holdout = data.get("holdout") or {}
    rows = [
        [f"{k.replace('_', ' ')} p50 / p95", f"{_num(v.get('p50'))} / {_num(v.get('p95'))} ms"]
        for k, v in lat.items()
        if isinstance(v, dict)
    ]
    rows += [
        [
            "page-type accuracy",
            f"{data.get('classifier_correct')}/{data.get('pages')} = "
            f"{_frac(data.get('classifier_accuracy'))}",
        ],
        [
            "box hit rate (box contains the target's centre)",
            f"{data.get('box_hits')}/{data.get('box_targets')}",
        ],
    ]
    if holdout:
        rows.append(
            [
                "held-out pages: page type / boxes",
                f"{_frac(holdout.get('classifier_accuracy'))} of {holdout.get('pages')} / "
                f"{holdout.get('box_hits')}/{holdout.get('box_targets')}",
            ]
        )
    templates = data.get("template_pages") or {}
    for split in ("heldout", "tune"):
        part = templates.get(split)
        if not isinstance(part, dict):
            continue
        lat_split = part.get("latency_ms_end_to_end") or {}
        rows.append(
            [
                f"template pages, {split}: page type / boxes / end to end p50 / p95",
                f"{part.get('page_type_correct')}/{part.get('pages')} = "
                f"{_frac(part.get('page_type_accuracy'))} / "
                f"{part.get('box_hits')}/{part.get('box_targets')} = "
                f"{_frac(part.get('box_hit_rate'))} / "
                f"{_num(lat_split.get('p50'))} / {_num(lat_split.get('p95'))} ms",
            ]
        )
    heavy = templates.get("latency_ms_end_to_end_text_heavy")
    if isinstance(heavy, dict):
        rows.append(
            [
                f"template pages with {templates.get('text_heavy_min_ocr_lines')}+ OCR lines: "
                "end to end p50 / p95",
                f"{_num(heavy.get('p50'))} / {_num(heavy.get('p95'))} ms",
            ]
        )
    confusions = data.get("confusions") or {}
    out = [
        f"{data.get('pages')} local HTML pages of {data.get('page_types')} page types rendered "
        f"at {'×'.join(str(v) for v in data.get('viewport', []))} by headless Chromium, "
        f"{data.get('repeats')} timed decisions each; OCR on `{data.get('ocr_runtime')}`, "
        f"{data.get('threads')} threads.",
        "",
        _table(["", "result"], rows),
        "",
    ]
    if confusions:
        out += [
            "Confusions (label->predicted): "
            + ", ".join(f"{k} {v}" for k, v in confusions.items())
            + ".",
            "",
        ]
    if data.get("reference"):
        out += [f"Reference: {data['reference']}.", ""]
    out.append(f"Machine: {machine(data.get('machine'))}.")
    return "\n".join(out) + "\n"


def server_load(data: Json) -> str:
    work = data.get("workload") or {}
    out = [
        "The HTTP server under load over loopback: "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in work.items())
        + ".",
        "",
    ]
    rows = []
    for name in ("batched", "unbatched", "batched_fp32_reference"):
        r = data.get(name)
        if r:
            rows.append(
                [
                    name.replace("_", " "),
                    _num(r.get("throughput_per_s")),
                    _num(r.get("p50_ms")),
                    _num(r.get("p99_ms")),
                    _num(r.get("errors")),
                    _num(r.get("lost")),
                    _num(r.get("mean_batch_size")),
                ]
            )
    out.append(
        _table(
            ["mode", "decisions/s", "p50 (ms)", "p99 (ms)", "errors", "lost", "mean batch"], rows
        )
    )
    checks = data.get("checks") or {}
    if checks:
        out += [
            "",
            f"Speed-up batched / unbatched: {data.get('speedup')}×. Checks: "
            + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in checks.items())
            + ".",
        ]
    out += ["", f"Machine: {machine(data.get('machine'))}."]
    return "\n".join(out) + "\n"


def router_overhead(data: Json) -> str:
    rows = []
    for name in ("single", "single_with_resilient_engine", "batch_64"):
        r = data.get(name)
        if r:
            rows.append(
                [
                    name.replace("_", " "),
                    _num(r.get("bare_median_ms"), 3),
                    _num(r.get("router_median_ms"), 3),
                    _num(r.get("overhead_pct"), 2) + " %",
                    _num(r.get("samples")),
                ]
            )
    out = [
        "`ClefRouter` against a bare `decide` on the same engine (medians of interleaved "
        f"calls; model `{data.get('model_version')}` on {data.get('device')}).",
        "",
        _table(["call", "bare (ms)", "router (ms)", "overhead", "samples"], rows),
        "",
        f"The router's own cost on `FakeEngine`: {data.get('adapter_cost_ms')} ms. "
        + str(data.get("note", "")),
        "",
        f"Machine: {machine(data.get('machine'))}, Python {data.get('python')}.",
    ]
    return "\n".join(out) + "\n"


def decoder_prefix(data: Json) -> str:
    model = data.get("model") or {}
    rows = [
        [
            _num(r.get("options")),
            _num(r.get("prompt_tokens")),
            _num(r.get("shared_ms_p50"), 1),
            _num(r.get("naive_ms_p50"), 1),
            f"{r.get('speedup')}×",
            f"{r.get('flop_ratio')}×",
            f"{r.get('max_abs_diff'):.1e}" if r.get("max_abs_diff") is not None else "–",
        ]
        for r in data.get("results") or []
    ]
    out = [
        "Decoder scoring with a shared prefix (state prefilled once, options scored in one "
        "tree-masked pass) against one full forward per option, on a random "
        f"{model.get('arch', '')} model ({_num(model.get('parameters'))} parameters): the "
        "mechanism's cost, not a real model's quality.",
        "",
        _table(
            [
                "options",
                "prompt tokens",
                "shared p50 (ms)",
                "naive p50 (ms)",
                "speed-up",
                "FLOP ratio",
                "max |diff|",
            ],
            rows,
        ),
        "",
        f"Machine: {machine(data.get('machine'))}.",
    ]
    return "\n".join(out) + "\n"


def finetune_rl_cache(data: Json) -> str:
    rows = [
        [
            "with cache" if r.get("cache") else "without cache",
            _num(r.get("train_seconds")),
            _num(r.get("rl_seconds")),
        ]
        for r in data.get("runs") or []
    ]
    info = {
        "cpu": data.get("cpu"),
        "torch_threads": data.get("torch_threads"),
        "torch": data.get("torch"),
        **(data.get("packages") or {}),
    }
    out = [
        f"The RL stage of the trainer with and without its feature cache ({data.get('states')} "
        f"states, {data.get('rl_epochs')} RL epochs); speed-up {data.get('rl_speedup')}×.",
        "",
        _table(["run", "training (s)", "RL stage (s)"], rows),
        "",
        f"Machine: {machine(info)}.",
    ]
    return "\n".join(out) + "\n"


def metric_rows(data: Json) -> list[list[str]]:
    """One row per nested result that has an accuracy: section, where in it, the metrics."""
    rows: list[list[str]] = []
    env = (data.get("environment") or data.get("machine")) if isinstance(data, dict) else None

    def walk(value: Any, path: list[str], cpu: Any) -> None:
        if not isinstance(value, dict):
            return
        cpu = value.get("cpu", cpu)
        if "accuracy" in value and isinstance(value["accuracy"], (int, float)):
            rows.append(
                [
                    f"`{path[0]}`" if path else "",
                    " / ".join(path[1:]) or "–",
                    _auto_pct(value.get("accuracy")),
                    _auto_pct(value.get("macro_f1")),
                    _num(value.get("ece"), 4),
                    str(cpu or machine(env)),
                ]
            )
            return
        keys = set(value)
        for k, v in value.items():
            if k in SKIP or (k in {"uncalibrated", "calibrated"} and "temperature" in keys):
                continue
            walk(v, [*path, str(k)], cpu)

    for key, section in data.items() if isinstance(data, dict) else []:
        if key != "environment":
            walk(section, [key], None)
    return rows


SKIP = {"config", "history", "validation_grid", "wide_grid_report", "packages", "rows"}


def _auto_pct(value: Any) -> str:
    """Accuracy as a percentage, whether the file stored a fraction or a percentage."""
    if value is None:
        return "–"
    value = float(value)
    return _frac(value, 2) if value <= 1.0 else _pct(value)


def generic(data: Any) -> str:
    """A file without a layout here: its results with an accuracy, else its scalar fields."""
    rows = metric_rows(data) if isinstance(data, dict) else []
    if rows:
        return _table(["section", "result", "accuracy", "macro-F1", "ECE", "machine"], rows) + "\n"
    scalars: list[list[str]] = []

    def walk(value: Any, path: str, depth: int) -> None:
        if isinstance(value, dict) and depth < 4:
            for k, v in value.items():
                if k not in SKIP:
                    walk(v, f"{path}.{k}" if path else str(k), depth + 1)
        elif isinstance(value, (str, int, float, bool)) or value is None:
            scalars.append([f"`{path}`", _num(value, 4)])

    walk(data, "", 0)
    return _table(["field", "value"], scalars) + "\n"


def finetune_probes(data: Json) -> str:
    return "\n".join(
        [
            "Probes of the fine-tuning recipe that did not become options "
            "(`python benchmarks/finetune_probes.py NAME`): each result with an accuracy, "
            "test split unless its path says validation. The guide "
            "([finetune.md](finetune.md)) says what each probe tried.",
            "",
            generic(data),
        ]
    )


# --- general_lodo.json / finetune_general_base.json ------------------------------------


def general_lodo(data: Json) -> str:
    """Leave-one-dataset-out: a model trained without each set, tested on it."""
    rows, left, sim = [], [], []
    for name, entry in data.items():
        lo, si, sh = (entry.get(k) for k in LODO_COLUMNS)
        left.append(lo["accuracy"])
        sim.append(si["accuracy"])
        beats = "yes" if lo["accuracy"] > si["accuracy"] else "no"
        rows.append(
            [f"`{name}`", str(lo.get("n", "–")), _acc_ece(lo), _acc_ece(si), beats, _acc_ece(sh)]
        )
    n = len(rows)
    steps = sorted({(e.get("steps"), e.get("batch_size")) for e in data.values()})
    out = [
        "Each row: a general model trained on the other eleven sets for "
        + ", ".join(f"{s} steps of batch {b}" for s, b in steps)
        + ", then tested on the left-out set's test rows; beside it the bare similarity "
        "scorer (the engine before the general model) and the shipped general model, "
        "which saw the set in training (accuracy / ECE). The four choice sets "
        "(hate_offensive, snips, tweeteval_emotion, tweeteval_stance) were trained and "
        "scored again after the calibration refit of 2026-12-07 (their machine lines say "
        "so); before it their left-out ECE was 0.067, 0.303, 0.171 and 0.046. The refit "
        "moved only choice temperatures, so the yes/no and score rows stand. hwu64 was "
        "scored again on 2026-12-07 from a model trained by the same command: its 64-option "
        "questions now take a temperature interpolated from the buckets its run fitted "
        "(f9bb3a4), so its left-out ECE reads 0.041 where the first run, with the nearest "
        "bucket's temperature, read 0.456.",
        "",
        _table(
            ["left-out set", "n", "left out", "similarity scorer", "beats it", "shipped (seen)"],
            rows,
        ),
        "",
        f"Mean accuracy over the {n} left-out sets: {_frac(sum(left) / n)} (similarity "
        f"scorer {_frac(sum(sim) / n)}); the left-out model is more accurate on "
        f"{sum(a > b for a, b in zip(left, sim, strict=True))} of {n}.",
        "",
    ]
    out += _machines({name: entry.get("machine") for name, entry in data.items()})
    return "\n".join(out)


LODO_COLUMNS = ("left_out", "similarity_scorer", "shipped_general_in_distribution")


def general_scale(data: Json) -> str:
    """The general adapter's LoRA update scaled by lambda (WiSE-FT), each recalibrated."""
    scales = sorted({float(k.rsplit("_", 1)[1]) for k in data if k.startswith("scale_")})
    rows, machines = [], {}
    for scale in scales:
        run = data.get(f"scale_{scale:g}") or {}
        lodo = data.get(f"lodo_scale_{scale:g}") or {}
        left = lodo.get("left_out") or {}
        rows.append(
            [
                f"{scale:g}",
                _frac(run.get("mixture_mean_accuracy")),
                _count(run.get("noul_suite")),
                _num((run.get("noul_suite") or {}).get("ece"), 3),
                _acc_ece(run.get("banking77_zero_shot")),
                _frac(lodo.get("mean_accuracy")),
                f"{sum(v['ece'] <= 0.05 for v in left.values())} of {len(left)}" if left else "–",
            ]
        )
        machines[f"scale_{scale:g}"] = run.get("machine") or lodo.get("machine")
    header = ["lambda", "mixture test", "yes/no suite", "suite ECE", "BANKING77 zero-shot",
              "LODO mean", "LODO sets with ECE <= 0.05"]  # fmt: skip
    out = [
        "The shipped adapter (and each leave-one-out adapter) with its LoRA update multiplied "
        "by lambda, then recalibrated on held-out mixture training rows "
        "(`python -m benchmarks.general_scale --scales 1.0 0.75 0.5 --lodo DIR`). Mixture "
        "test: 300 rows per set. LODO columns were scored with missing option-count buckets "
        "interpolated (the working tree that became f9bb3a4). A probe, not shipped: no lambda "
        "below 1 is better on every column, so the shipped model keeps lambda = 1.",
        "",
        _table(header, rows),
        "",
    ]
    out += _machines({k: v for k, v in machines.items() if v})
    return "\n".join(out)


def general_lodo_calibration(data: Json) -> str:
    """Two calibration fixes for unseen sets, tried on the leave-one-out runs (a probe)."""
    labels = {
        "base": "shipped recipe (temperatures fitted on the seen sets)",
        "softened": "temperatures x k per type (k from the other runs' left-out sets)",
        "cf": "minus a content-free state's scores",
        "cf_half": "minus half a content-free state's scores",
        "mu": "minus the mean calibration state's scores",
        "mu_half": "minus half the mean calibration state's scores",
    }
    left, shipped = data.get("left_out") or {}, data.get("shipped") or {}
    rows = []
    for key, text in labels.items():
        mean = (left.get(key) or {}).get("_mean") or {}
        ship = shipped.get(key) or {}
        mix = ship.get("mixture") or {}
        rows.append(
            [
                text,
                _frac(mean.get("accuracy")),
                _num(mean.get("ece"), 3),
                f"{mean.get('sets_within_0.05', '–')} of {mean.get('sets', '–')}",
                f"{_count(ship.get('suite'))} / {_num((ship.get('suite') or {}).get('ece'), 3)}",
                _acc_ece(ship.get("b77")),
                f"{_frac(mix.get('mean_accuracy'))} / "
                f"{mix.get('sets_within_0.05', '–')} of {mix.get('sets', '–')}",
            ]
        )
    header = ["treatment", "LODO mean", "LODO mean ECE", "LODO ECE <= 0.05", "shipped: suite",
              "shipped: BANKING77", "shipped: mixture / ECE <= 0.05"]  # fmt: skip
    factors = data.get("factors_from_all_runs") or {}
    base_ece = ((left.get("base") or {}).get("_mean") or {}).get("ece", 0.0)
    better = [k for k in labels if k != "base"
              and ((left.get(k) or {}).get("_mean") or {}).get("ece", 1.0) < base_ece]  # fmt: skip
    keeps = [
        k for k in labels
        if k != "base" and all(
            ((shipped.get(k) or {}).get(p) or {}).get("accuracy", 0.0)
            >= ((shipped.get("base") or {}).get(p) or {}).get("accuracy", 1.0)
            for p in ("suite", "b77")
        )
    ]  # fmt: skip
    out = [
        "Can the general model's calibration be made to carry over to sets it never saw, "
        "without training? Each treatment is applied to the leave-one-dataset-out runs "
        "(scored on the set each left out) and to the shipped model (scored on the "
        "hand-written yes/no suite, BANKING77 and the mixture's test rows; accuracy / ECE). "
        "`python -m benchmarks.general_lodo_calibration --lodo DIR` on the model dirs of "
        "`benchmarks.general_lodo`. Factors from all runs: "
        + ", ".join(f"{t} {k:g}" for t, k in factors.items())
        + ". A probe, not shipped. Treatments that lower the left-out mean ECE: "
        + (", ".join(f"`{k}`" for k in better) or "none")
        + "; that keep the shipped model's suite and BANKING77 accuracy: "
        + (", ".join(f"`{k}`" for k in keeps) or "none")
        + ".",
        "",
        _table(header, rows),
        "",
    ]
    out += _machines({"general_lodo_calibration": data.get("machine")})
    return "\n".join(out)


def finetune_general_base(data: Json) -> str:
    """Fine-tuning from the bare MiniLM against fine-tuning from the general model."""
    rows, machines = [], {}
    for key, section in data.items():
        for run in section["runs"]:
            fp32 = run["fp32"]
            cal, memory = fp32["calibrated"], fp32.get("memory") or {}
            rows.append(
                [
                    f"`{key}`",
                    run["base"],
                    str(run["seed"]),
                    _pct(cal["accuracy"]),
                    _pct(cal["macro_f1"]),
                    _num(cal["ece"], 4),
                    _pct(memory.get("accuracy")),
                    _minutes([run.get("train_seconds")]),
                ]
            )
        machines[key] = section.get("machine")
    header = ["recipe", "base", "seed", "accuracy", "macro-F1", "ECE", "with memory", "train"]
    out = [
        "BANKING77 test split (3,080 rows) after training on its training split from the bare "
        "all-MiniLM-L6-v2 or from the general model (its adapter merged); calibrated fp32. "
        "`train` is wall-clock time on a host that may have been shared with other jobs.",
        "",
        _table(header, rows),
        "",
    ]
    out += _machines(machines)
    return "\n".join(out)


def noul_examples(data: Json) -> str:
    """Yes/no questions taught by examples, on the hand-written suite's cases."""
    scorers = {"general": "general model (default)", "similarity": "bare model"}
    first = next(iter(data.values()))
    ks = sorted(int(k[1:]) for k in first if k.startswith("k") and k[1:].isdigit())
    rows = []
    for scorer, label in scorers.items():
        section = data.get(scorer)
        if not section:
            continue
        for k in ks:
            run = section.get(f"k{k}")
            if not run:
                continue
            spread = (
                f" ({_frac(run['accuracy_min'])} to {_frac(run['accuracy_max'])})"
                if run["draws"] > 1
                else ""
            )
            rows.append(
                [
                    label,
                    "zero-shot" if k == 0 else str(k),
                    str(run["draws"]),
                    _frac(run["accuracy_mean"]) + spread,
                    _frac(run.get("confidence_mean")),
                    _num(run["ece_mean"], 3),
                ]
            )
    cats = sorted(first["k0"]["by_category_mean"])
    by_cat = []
    for scorer, label in scorers.items():
        section = data.get(scorer) or {}
        for k in (0, max(ks)):
            run = section.get(f"k{k}")
            if run:
                name = f"{label}, {'zero-shot' if k == 0 else f'{k} per side'}"
                by_cat.append([name] + [_frac(run["by_category_mean"].get(c)) for c in cats])
    dropped = first.get("candidates_dropped", {})
    n_dropped = sum(v for sides in dropped.values() for v in sides.values())
    n_candidates = sum(sum(v) for v in first.get("candidates", {}).values())
    dev_rows = [
        [label + extra, str(d["n"]), _frac(d["accuracy"]), _num(d["nll"], 3),
         _frac(d["confidence_mean"]), _num(d["ece"], 3)]
        for key, extra in (("dev", ""), ("dev_yes_examples_only", ", yes examples only"),
                           ("dev_zero_shot", ", no examples"))
        for scorer, label in scorers.items()
        if (d := (data.get(scorer) or {}).get(key))
    ]  # fmt: skip
    out = [
        f'`Noul(criteria={{"true": {{"examples": [...]}}, "false": {{"examples": [...]}}}})` '
        f"on the {first['n']} cases of `tests/data/noul_suite.jsonl` whose category has "
        "examples (urgency, anger, refund requests, prompt injection, spam, risky tool calls, "
        "and the off-topic cases asked those questions); relevance cases are left out. The "
        "examples (`benchmarks/data/noul_examples.json`) were written by sessions that never "
        "saw the suite; candidates with a cosine of at least "
        f"{first.get('max_similarity', 0.6)} to any suite state under the bare MiniLM "
        f"({n_dropped} of {n_candidates}) were dropped before scoring, and each side "
        "teaches with the first 8 that remain. Below 8 per side, each row is the mean of "
        "seeded random draws (min to max in brackets). The bare model's rows with examples "
        "are what the default engine answered before yes/no examples moved to the general "
        "model's vectors (chosen on the dev split below, not on the suite). "
        "`python -m benchmarks.noul_examples [--scorer similarity]`.",
        "",
        _table(
            ["vectors", "examples per side", "draws", "accuracy", "mean confidence", "ECE"], rows
        ),
        "",
        "By category (accuracy):",
        "",
        _table(["", *cats], by_cat),
        "",
        "Dev split: the candidates that passed the filter after the first 8 per side, each "
        "category's question taught by its 8 + 8 examples (or given its 8 yes examples "
        "only, which are read as the yes side's description: fitted as prototypes against "
        "the no side's option text alone they answered 48.4 % right at 5193eb3; or asked "
        "with none):",
        "",
        _table(["vectors", "n", "accuracy", "NLL", "mean confidence", "ECE"], dev_rows),
        "",
    ]
    out += _machines({k: v.get("machine") for k, v in data.items()})
    return "\n".join(out)


def vision_page_type_calibration(data: Json) -> str:
    """The page-type temperature and the answers before and after it, per page set."""
    rows = []
    sets = [
        (data.get("fit_pages"), "fit on", ("before", "after", "leave_one_package_out")),
        (data.get("heldout_pages"), "held out (never fit on)", ("before", "after")),
    ]
    for size, section in data.get("subsets_of_fit_pages", {}).items():
        label = f"fit on, subsets of {size.replace('_', ' ')} ({section['draws']} draws)"
        sets.append((section, label, ("before", "after")))
    for section, label, kinds in sets:
        for kind in kinds if section else ():
            r = section[kind]
            rows.append(
                [
                    label,
                    kind.replace("_", " "),
                    str(r["pages"]),
                    _frac(r["accuracy"]),
                    _num(r["mean_confidence"], 3),
                    _num(r["ece"], 3),
                    _num(r["nll"], 3),
                    _num(r["brier"], 3),
                ]
            )
    header = ["pages", "answers", "n", "right", "mean top probability", "ECE", "NLL", "Brier"]
    leaving = data.get("temperature_leaving_out", {}).values()
    return "\n\n".join(
        [
            f"Temperature fitted: {data['temperature']} (shipped: {data['shipped_temperature']}),"
            f" on {data['fit_on']}; fitted leaving one package out:"
            f" {min(leaving, default=0):.4f}-{max(leaving, default=0):.4f}.",
            _table(header, rows),
            f"Command: `python benchmarks/vision_page_type_calibration.py --threads 2`."
            f" Machine: {machine(data.get('machine'))}.",
        ]
    )


RENDERERS: dict[str, tuple[str, Callable[[Json], str]]] = {
    "general_model": ("Zero-shot: the general decision model", general_model),
    "banking77_engine": ("BANKING77 through the engine (similarity scorer)", banking77_engine),
    "finetune_banking77": ("Fine-tuning on BANKING77 (CPU)", finetune_banking77),
    "finetune_sweep_gpu": ("Fine-tuning recipe sweep (GPU)", finetune_sweep_gpu),
    "finetune_rl_cache": ("Fine-tuning: the RL stage's feature cache", finetune_rl_cache),
    "vision_screenshots": ("Screenshots (OCR on OpenVINO)", vision_screenshots),
    "vision_screenshots_onnxruntime": ("Screenshots (OCR on ONNX Runtime)", vision_screenshots),
    "server_load": ("Server under load", server_load),
    "router_overhead": ("LangChain router overhead", router_overhead),
    "decoder_prefix": ("Decoder backbone: shared-prefix scoring", decoder_prefix),
    "finetune_probes": ("Fine-tuning probes (CPU)", finetune_probes),
    "general_lodo": ("Zero-shot: leave one dataset out", general_lodo),
    "general_scale": ("Zero-shot: adapter strength (probe)", general_scale),
    "general_lodo_calibration": (
        "Zero-shot: calibration on unseen sets (probe)",
        general_lodo_calibration,
    ),
    "finetune_general_base": ("Fine-tuning from the general model", finetune_general_base),
    "noul_examples": ("Yes/no questions taught by examples", noul_examples),
    "vision_page_type_calibration": (
        "Screenshots: page-type calibration",
        vision_page_type_calibration,
    ),
}


def render(results: Path = RESULTS) -> str:
    """The whole page, from every ``*.json`` in ``results``."""
    files = {p.stem: p for p in sorted(results.glob("*.json"))}
    order = [name for name in RENDERERS if name in files]
    order += [name for name in files if name not in RENDERERS]
    out = [
        "# Results",
        "",
        "<!-- Generated by `python -m benchmarks.results_md` from benchmarks/results/*.json."
        " Do not edit by hand: edit the benchmark, rerun it, regenerate. -->",
        "",
        "Every number here is read from a results file committed by the benchmark that "
        "measured it (`benchmarks/results/NAME.json`), with the machine that file records. "
        "Targets that were not reached are shown as measured. Compare numbers only within "
        "one machine.",
        "",
    ]
    out += [f"- [{RENDERERS.get(n, (n,))[0]}](#{_anchor(n)})" for n in order]
    out.append("")
    for name in order:
        data = json.loads(files[name].read_text())
        title, renderer = RENDERERS.get(name, (name, generic))
        out += [
            f"## {title}",
            "",
            f'<a id="{_anchor(name)}"></a>Source: `benchmarks/results/{name}.json`.',
            "",
        ]
        try:
            body = renderer(data)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            body = f"(This file's layout is not the one the page expects: {exc!r}.)\n\n"
            body += generic(data)
        out.append(body.rstrip() + "\n")
    return "\n".join(out).rstrip() + "\n"


def _anchor(name: str) -> str:
    return "results-" + name.replace("_", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    parser.add_argument("--out", type=Path, default=PAGE)
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of *.json")
    args = parser.parse_args(argv)
    text = render(args.results)
    if args.check:
        current = args.out.read_text() if args.out.is_file() else ""
        if current != text:
            print(
                f"{args.out} is out of date: run python -m benchmarks.results_md", file=sys.stderr
            )
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
