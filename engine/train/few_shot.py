"""The few-shot stages of the trainer: the contrastive stage on the LoRA adapters and the
(semi-supervised) prototype head fitted on the adapted vectors.

:class:`FewShotStages` is a part of :class:`clef_engine.train.trainer.Trainer`; its methods use
the trainer's backbone, adapted model and head. The loss and the step sampler are in
:mod:`clef_engine.train.contrastive`, the head in :mod:`clef_engine.heads.prototype`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import torch

from clef_engine.heads.memory import ExampleMemory, fit_question_memory_cross
from clef_engine.heads.option_evidence import question_context
from clef_engine.heads.prototype import PrototypeClassifier
from clef_engine.heads.zero_shot import option_texts
from clef_engine.train.contrastive import contrastive_batch, supervised_contrastive_loss
from clef_engine.train.data import TrainingDataError, TrainingSet
from clef_engine.train.forward import ModelForward
from clef_engine.train.schedule import linear_schedule

CONTRASTIVE_CHUNK = 32
"""States per backbone forward inside one contrastive step (sorted by length first)."""


class FewShotStages(ModelForward):
    """The contrastive stage, the prototype heads and the unlabelled pool they read."""

    def _unlabeled_pool(self, data: TrainingSet, unlabeled: Sequence[str]) -> list[str]:
        """``unlabeled`` without repeats and labelled states; refuses unusable input early."""
        if self.config.head != "prototype":
            raise TrainingDataError(
                "unlabelled states feed the prototype head's pseudo-labels; "
                f"they need head='prototype' (got head={self.config.head!r})",
                field="unlabeled",
            )
        if isinstance(unlabeled, str):
            raise TrainingDataError(
                "unlabeled must be a sequence of states, not one string", field="unlabeled"
            )
        for i, state in enumerate(unlabeled):
            if not isinstance(state, str) or not state.strip():
                raise TrainingDataError(
                    f"unlabelled state {i} must be a non-empty string; got {state!r}",
                    field=f"unlabeled[{i}]",
                )
        labelled = {ex.state for ex in data.examples}
        pool = [t for t in dict.fromkeys(unlabeled) if t not in labelled]
        if not pool:
            raise TrainingDataError(
                f"none of the {len(unlabeled)} unlabelled states is left once the labelled "
                "states are removed; pass states that carry no label",
                field="unlabeled",
            )
        return pool

    def _members(self, data: TrainingSet, qid: str) -> tuple[list[str], list[list[int]]]:
        """Texts of a question's labelled states plus its option texts, grouped by label."""
        question = data.questions[qid]
        texts: list[str] = []
        members: list[list[int]] = [[] for _ in data.names(qid)]
        for ex in data.examples:
            if qid in ex.labels:
                members[ex.labels[qid]].append(len(texts))
                texts.append(ex.state)
        for label, text in enumerate(option_texts(question)):
            members[label].append(len(texts))
            texts.append(text)
        return texts, members

    def contrast(self, train: TrainingSet) -> dict[str, float]:
        """The contrastive stage (:mod:`clef_engine.train.contrastive`) on the LoRA adapters.

        Step ``s`` of ``contrastive_steps`` takes the questions in turn (those with at least
        two labels) and samples ``contrastive_per_label`` members of each label; the
        learning rate warms up over the first sixth of the steps, then decays linearly.
        """
        from tqdm.auto import tqdm

        cfg = self.config
        questions = [q for q in train.questions if len(train.names(q)) >= 2]
        if not questions:
            raise TrainingDataError(
                "the contrastive stage needs a question with at least two labels",
                field="contrastive_steps",
            )
        pools = {q: self._members(train, q) for q in questions}
        lengths = {q: self._token_counts(pools[q][0]) for q in questions}
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=cfg.contrastive_lr or cfg.lr, weight_decay=cfg.weight_decay
        )
        total = cfg.contrastive_steps
        scheduler = linear_schedule(optimizer, round(total / 6), total)
        rng = random.Random(cfg.seed)
        self.model.train()
        losses: list[float] = []
        bar = tqdm(range(total), desc="contrastive", disable=not cfg.progress, leave=False)
        for step in bar:
            qid = questions[step % len(questions)]
            texts, members = pools[qid]
            batch = contrastive_batch(members, cfg.contrastive_per_label, rng)
            # The loss is order-free: encode the step's states in chunks of similar length,
            # so the forward pads (and keeps activations for) a few tokens, not the longest.
            batch.sort(key=lambda item: lengths[qid][item[0]])
            size = CONTRASTIVE_CHUNK
            chunks = [batch[i : i + size] for i in range(0, len(batch), size)]
            pooled = torch.cat([self._forward([texts[i] for i, _ in c])[2] for c in chunks])
            labels = torch.tensor([c for _, c in batch], device=self.device)
            loss = supervised_contrastive_loss(pooled, labels, cfg.contrastive_temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        self.model.eval()
        tail = losses[-max(1, total // 10) :]
        return {
            "contrastive_steps": float(total),
            "contrastive_loss_first": losses[0],
            "contrastive_loss_last": sum(tail) / len(tail),
        }

    @torch.no_grad()
    def _encode(self, texts: list[str]) -> torch.Tensor:
        """Adapted, pooled, normalised vectors of ``texts`` (``[N, H]``, CPU), in chunks."""
        self.model.eval()
        out = [torch.empty(0, self.backbone.hidden_size)]
        for start in range(0, len(texts), 64):
            out.append(self._forward(texts[start : start + 64])[2].float().cpu())
        return torch.cat(out)

    @torch.no_grad()
    def fit_prototypes(
        self,
        train: TrainingSet,
        unlabeled: Sequence[str] | None = None,
        *,
        memory: bool = False,
    ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """Fit a prototype head per question on the adapted pooled vectors of ``train``.

        Each option's text is one more example of its label (as in the engine's prototype
        head); the temperature comes from a 5-fold split of those same examples and is
        folded into the stored weights. A validation split, when there is one, is left
        for the calibrator that the trainer fits afterwards. Questions with the same
        fingerprint (type and option set) share one head, fitted on the examples of all
        of them (a state with the same label under two of them counts once).

        ``unlabeled`` states (encoded once; :meth:`fit` has already dropped repeats and
        labelled states, see :meth:`_unlabeled_pool`) are pseudo-labelled for every
        question by the head fitted on its labelled states, at most ``pseudo_per_label``
        per option, and join a second fit
        (:class:`~clef_engine.heads.prototype.PrototypeClassifier`);
        the temperature still comes from the labelled states alone. Every question sees
        every unlabelled state, also in data where each question is asked of only some
        states.

        ``memory``: also fit a cross-fitted example memory per question
        (:func:`~clef_engine.heads.memory.fit_question_memory_cross`) into :attr:`memory`: the
        head's examples, encoded as the loaded model will encode states, each voted on by
        the examples of the other folds of the temperature's split and scored against
        the head fitted without its fold. The trainer asks for it when there is no
        validation split to fit the memory on.

        Returns the history entry of the unlabelled step, ``{"unlabeled_states",
        "pseudo_labels"}`` (the latter counts (state, question) pairs; ``{}`` without
        ``unlabeled``), and the memory report per question id (``{}`` without ``memory``).
        """
        self.model.eval()
        pool = None if unlabeled is None else self._encode(list(unlabeled))
        pseudo = 0
        reports: dict[str, dict[str, float]] = {}
        self.memory = ExampleMemory() if memory else None
        groups: dict[str, list[str]] = {}
        for qid in train.questions:
            groups.setdefault(self.fps[qid], []).append(qid)
        for qids in groups.values():
            fitted, texts, y = self._fit_prototype_head(train, qids, pool)
            pseudo += fitted.n_pseudo * len(qids)
            if self.memory is not None:
                report = self._cross_fit_memory(self.memory, train, qids, fitted, texts, y)
                reports.update(dict.fromkeys(qids, report))
        if self.memory is not None and not self.memory:
            self.memory = None
        stats = {}
        if pool is not None:
            stats = {"unlabeled_states": float(len(pool)), "pseudo_labels": float(pseudo)}
        return stats, reports

    def _fit_prototype_head(
        self, train: TrainingSet, qids: list[str], pool: torch.Tensor | None
    ) -> tuple[PrototypeClassifier, list[str], torch.Tensor]:
        """Fit the prototype head shared by the questions ``qids`` (one fingerprint), on
        :meth:`_prototype_examples` and the unlabelled vectors ``pool``, and add it to the
        head with its temperature folded in. Returns it with its examples' texts and labels.
        """
        question = train.questions[qids[0]]
        names = train.names(qids[0])
        texts, y = self._prototype_examples(train, qids)
        # One fold per distinct text: a state (or option text) that two questions of
        # the group share never answers for its own copy in the cross-fit.
        group_of = {text: n for n, text in enumerate(dict.fromkeys(texts))}
        fitted = PrototypeClassifier.fit(
            self._encode(texts),
            y,
            len(names),
            seed=self.config.seed,
            unlabeled=pool,
            per_label=self.config.pseudo_per_label,
            groups=torch.tensor([group_of[text] for text in texts]),
            keep_folds=self.memory is not None,
        )
        self.head.add_prototypes(
            str(question.type),  # type: ignore[attr-defined]
            names,
            (fitted.weight / fitted.temperature).to(self.device),
            (fitted.bias / fitted.temperature).to(self.device),
            question_context(question),
        )
        return fitted, texts, y

    def _prototype_examples(
        self, train: TrainingSet, qids: list[str]
    ) -> tuple[list[str], torch.Tensor]:
        """The examples of one prototype head shared by the questions ``qids`` (one
        fingerprint): the texts of their labelled states and option texts, and their labels
        in the order of the first question's options; a (text, label) pair counts once."""
        names = train.names(qids[0])
        pairs: dict[tuple[str, int], None] = {}  # (text, label), each pair once
        for qid in qids:  # labels in the order of the first question's options
            relabel = [names.index(name) for name in train.names(qid)]
            q_texts, members = self._members(train, qid)
            q_labels = [0] * len(q_texts)
            for label, items in enumerate(members):
                for i in items:
                    q_labels[i] = relabel[label]
            pairs.update(dict.fromkeys(zip(q_texts, q_labels, strict=True)))
        texts = [text for text, _ in pairs]
        y = torch.tensor([label for _, label in pairs], dtype=torch.long)
        return texts, y

    def _cross_fit_memory(
        self,
        memory: ExampleMemory,
        train: TrainingSet,
        qids: list[str],
        fitted: PrototypeClassifier,
        texts: list[str],
        y: torch.Tensor,
    ) -> dict[str, float]:
        """Cross-fit the example memory of the questions ``qids`` (one fingerprint) into
        ``memory``, on the examples ``texts``/``y`` of their prototype head ``fitted`` and
        the folds of its temperature's split (at most ``memory_max_states`` examples, drawn
        with the run's seed). Returns its report."""
        question = train.questions[qids[0]]
        started = time.perf_counter()
        report: dict[str, float]
        if fitted.folds is None or fitted.out_of_fold is None:
            # Too few examples for the temperature's folds: nothing to cross-fit on.
            report = {"states": float(len(y)), "held_out": 0.0, "cross_fitted": 1.0}
        else:
            keep = torch.arange(len(y))
            if len(keep) > self.config.memory_max_states:
                gen = torch.Generator().manual_seed(self.config.seed)
                keep = torch.randperm(len(y), generator=gen)[: self.config.memory_max_states]
                keep = keep.sort().values
            kept = fit_question_memory_cross(
                self._engine_vectors([texts[i] for i in keep.tolist()]),
                y[keep],
                train.names(qids[0]),
                fitted.folds[keep],
                torch.softmax(fitted.out_of_fold[keep].double(), dim=-1),
            )
            if kept[0] is not None:
                memory.add(
                    str(question.type),  # type: ignore[attr-defined]
                    kept[0],
                    question_context(question),
                )
            report = kept[1]
        report["seconds"] = round(time.perf_counter() - started, 1)
        return report
