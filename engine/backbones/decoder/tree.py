"""Shared-prefix option scoring: prefill each state once, then every option in one forward.

A batch of *rows* (one per state) is scored in two forward passes of the decoder:

1. **prefill**: the state prefixes, right-padded into one ``[B, P]`` batch, fill a KV
   cache (the model's own causal mask; flash/SDPA kernels apply);
2. **tree**: every question block and every option answer of every row, packed into one
   ``[B, T]`` batch that attends to the cached prefix through a 4-D mask: a question
   block sees the prefix and itself (causally); an option sees the prefix, its question
   block and itself, never another option. Position ids continue from the prefix, so each
   option is scored exactly as if it were the only continuation of the full prompt.

The prefix is therefore neither recomputed nor copied per option: the cost of the options
grows with their own tokens (plus their attention reads of the prefix), not with
options x state. :func:`score_naive` is the reference: one full sequence per option.

Each option's score is the mean log-probability of its answer tokens (length-normalised
log-likelihood), computed with the LM head applied only at the positions that predict an
answer token (never over the prefix).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

LOGIT_CHUNK = 1024
"""Rows of hidden states sent through the LM head at a time (bounds the ``[N, vocab]``
logits buffer)."""


@dataclass
class Group:
    """A question block (one listing rotation) and its option answers, as token ids."""

    block: list[int]
    options: list[list[int]]


@dataclass
class Row:
    """One state: its prefix and the groups that continue it."""

    prefix: list[int]
    groups: list[Group]

    def tree_length(self) -> int:
        return sum(len(g.block) + sum(len(o) for o in g.options) for g in self.groups)


def _chunks(costs: list[int], budget: int) -> list[list[int]]:
    """Group row indices (sorted by cost) so that ``len(chunk) * max cost <= budget``."""
    order = sorted(range(len(costs)), key=lambda i: costs[i], reverse=True)
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * costs[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


@dataclass
class _Tree:
    """Every row's question blocks and options, packed into one ``[B, T]`` batch."""

    ids: torch.Tensor
    pos: torch.Tensor
    """Position ids, continuing from each row's prefix."""
    seg: torch.Tensor
    """Segment of each token: one per block and one per option (pad: -1)."""
    parent: torch.Tensor
    """The segment a token also sees: a block sees only the prefix (-2), an option its
    block's segment (pad: -3)."""
    gather: list[tuple[int, int]]
    """(row, column) of the hidden state that predicts each answer token."""
    targets: list[int]
    """Each answer token."""
    owner: list[int]
    """Each answer token's option, numbered across the whole batch."""
    n_options: int
    shapes: list[list[int]]
    """Per row, the number of options of each group."""


def _pack(rows: list[Row], pad_id: int) -> _Tree:
    """Pack the question blocks and options of ``rows``, padded with ``pad_id``."""
    b = len(rows)
    t_max = max(r.tree_length() for r in rows)
    ids = torch.full((b, t_max), pad_id, dtype=torch.long)
    pos = torch.zeros((b, t_max), dtype=torch.long)
    seg = torch.full((b, t_max), -1, dtype=torch.long)
    parent = torch.full((b, t_max), -3, dtype=torch.long)
    tree = _Tree(ids, pos, seg, parent, gather=[], targets=[], owner=[], n_options=0, shapes=[])
    for i, r in enumerate(rows):
        at, s, p0 = 0, 0, len(r.prefix)
        tree.shapes.append([])
        for g in r.groups:
            nb = len(g.block)
            block_seg = s
            ids[i, at : at + nb] = torch.tensor(g.block)
            pos[i, at : at + nb] = torch.arange(p0, p0 + nb)
            seg[i, at : at + nb] = block_seg
            parent[i, at : at + nb] = -2
            last = at + nb - 1
            at, s = at + nb, s + 1
            for o in g.options:
                no = len(o)
                ids[i, at : at + no] = torch.tensor(o)
                pos[i, at : at + no] = torch.arange(p0 + nb, p0 + nb + no)
                seg[i, at : at + no] = s
                parent[i, at : at + no] = block_seg
                for j, token in enumerate(o):
                    tree.gather.append((i, last if j == 0 else at + j - 1))
                    tree.targets.append(token)
                    tree.owner.append(tree.n_options)
                tree.n_options += 1
                at, s = at + no, s + 1
            tree.shapes[-1].append(len(g.options))
    return tree


def _tree_mask(tree: _Tree, prefix_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive ``[B, T, P + T]`` mask of the tree pass: prefix keys where real, then
    tree keys in the token's own segment (causally) or in its parent segment."""
    seg, parent = tree.seg, tree.parent
    b, t_max = seg.shape
    p_max = prefix_mask.shape[1]
    # allowed[b, t, s]: same segment and not in the future, or s is in t's parent block.
    causal = torch.ones(t_max, t_max, dtype=torch.bool).tril()
    same = (seg.unsqueeze(2) == seg.unsqueeze(1)) & causal
    in_parent = parent.unsqueeze(2) == seg.unsqueeze(1)
    tree_allowed = same | in_parent
    prefix_allowed = (prefix_mask.bool().unsqueeze(1)).expand(b, t_max, p_max).clone()
    allowed = torch.cat([prefix_allowed, tree_allowed], dim=2)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask


class TreeScorer:
    """Scores option answers of rows on a causal LM (see module docstring).

    Args:
        model: A Hugging Face ``*ForCausalLM`` (optionally wrapped by peft).
        pad_id: Token id used for padding (never attended to).
        max_batch_tokens: Rows per forward are limited so that ``rows x longest row``
            stays under this many tokens.
    """

    def __init__(self, model: Any, *, pad_id: int, max_batch_tokens: int = 16384) -> None:
        self.model = model
        self.pad_id = int(pad_id)
        self.max_batch_tokens = int(max_batch_tokens)
        decoder = model.get_decoder()
        self._decoder: Any = None
        params = inspect.signature(decoder.forward).parameters
        # transformers >= 5.x renamed ``past_key_values`` to ``cache``.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.softcap = getattr(model.config, "final_logit_softcapping", None)

    def compile(self) -> None:
        """Run the decoder through ``torch.compile`` (dynamic shapes)."""
        self._decoder = torch.compile(self.model.get_decoder(), dynamic=True)

    def decoder(self) -> Any:
        return self._decoder if self._decoder is not None else self.model.get_decoder()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.get_decoder().parameters()).dtype

    # -- shared LM-head part --------------------------------------------------------

    def _logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        head = self.model.get_output_embeddings()
        out = []
        for start in range(0, hidden.shape[0], LOGIT_CHUNK):
            logits = head(hidden[start : start + LOGIT_CHUNK]).float()
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
            part = targets[start : start + LOGIT_CHUNK].unsqueeze(1)
            out.append(logits.log_softmax(dim=-1).gather(1, part).squeeze(1))
        return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)

    def _mean_per_option(
        self,
        hidden: torch.Tensor,
        gather: list[tuple[int, int]],
        targets: list[int],
        owner: list[int],
        n_options: int,
    ) -> torch.Tensor:
        device = hidden.device
        rows = torch.tensor([g[0] for g in gather], device=device)
        cols = torch.tensor([g[1] for g in gather], device=device)
        lp = self._logprobs(hidden[rows, cols], torch.tensor(targets, device=device))
        index = torch.tensor(owner, device=device)
        sums = torch.zeros(n_options, dtype=torch.float32, device=device).index_add_(0, index, lp)
        counts = torch.zeros(n_options, dtype=torch.float32, device=device)
        counts.index_add_(0, index, torch.ones_like(lp))
        return (sums / counts.clamp(min=1.0)).cpu()

    # -- shared-prefix scoring ------------------------------------------------------

    def score(self, rows: list[Row]) -> list[list[torch.Tensor]]:
        """Per row, per group: ``[n_options]`` mean log-probabilities of the answers."""
        costs = [len(r.prefix) + r.tree_length() for r in rows]
        out: list[list[torch.Tensor]] = [[] for _ in rows]
        for chunk in _chunks(costs, self.max_batch_tokens):
            for i, scores in zip(chunk, self._score_chunk([rows[i] for i in chunk]), strict=True):
                out[i] = scores
        return out

    def _score_chunk(self, rows: list[Row]) -> list[list[torch.Tensor]]:
        decoder = self.decoder()
        cache, prefix_mask = self._prefill(decoder, rows)
        tree = _pack(rows, self.pad_id)
        mask = _tree_mask(tree, prefix_mask, self.dtype)
        device = self.device
        hidden = decoder(
            input_ids=tree.ids.to(device),
            attention_mask=mask.unsqueeze(1).to(device),
            position_ids=tree.pos.to(device),
            use_cache=True,
            **{self._cache_kw: cache},
        ).last_hidden_state
        flat = self._mean_per_option(hidden, tree.gather, tree.targets, tree.owner, tree.n_options)
        out: list[list[torch.Tensor]] = []
        k = 0
        for sizes in tree.shapes:
            out.append([])
            for n in sizes:
                out[-1].append(flat[k : k + n])
                k += n
        return out

    def _prefill(self, decoder: Any, rows: list[Row]) -> tuple[Any, torch.Tensor]:
        """Run the right-padded state prefixes through ``decoder`` into a fresh KV cache;
        return the cache and the ``[B, P]`` prefix mask (1 on real tokens)."""
        from transformers import DynamicCache

        b = len(rows)
        p_max = max(len(r.prefix) for r in rows)
        prefix = torch.full((b, p_max), self.pad_id, dtype=torch.long)
        prefix_mask = torch.zeros((b, p_max), dtype=torch.long)
        for i, r in enumerate(rows):
            prefix[i, : len(r.prefix)] = torch.tensor(r.prefix)
            prefix_mask[i, : len(r.prefix)] = 1
        # A cache without the config: every layer keeps every position, which the tree
        # mask needs (it addresses prefix keys by their column).
        cache = DynamicCache()
        device = self.device
        decoder(
            input_ids=prefix.to(device),
            attention_mask=prefix_mask.to(device),
            use_cache=True,
            **{self._cache_kw: cache},
        )
        return cache, prefix_mask

    # -- reference ------------------------------------------------------------------

    def score_naive(self, rows: list[Row]) -> list[list[torch.Tensor]]:
        """The same scores from one full causal forward per option (slow; the reference)."""
        seqs: list[tuple[list[int], int, list[int]]] = []  # (ids, answer start, answer)
        for r in rows:
            for g in r.groups:
                for o in g.options:
                    seqs.append((r.prefix + g.block + o, len(r.prefix) + len(g.block), o))
        decoder = self.decoder()
        device = self.device
        scores = torch.zeros(len(seqs), dtype=torch.float32)
        for chunk in _chunks([len(s[0]) for s in seqs], self.max_batch_tokens):
            width = max(len(seqs[j][0]) for j in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            gather, targets, owner = [], [], []
            for row, j in enumerate(chunk):
                seq, start, answer = seqs[j]
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
                for k, token in enumerate(answer):
                    gather.append((row, start + k - 1))
                    targets.append(token)
                    owner.append(row)
            hidden = decoder(
                input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False
            ).last_hidden_state
            part = self._mean_per_option(hidden, gather, targets, owner, len(chunk))
            scores[torch.tensor(chunk)] = part
        out: list[list[torch.Tensor]] = []
        k = 0
        for r in rows:
            out.append([])
            for g in r.groups:
                out[-1].append(scores[k : k + len(g.options)])
                k += len(g.options)
        return out
