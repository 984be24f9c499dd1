"""One slot per batch item: the batch pattern every layer shares.

A batch never loses an item: each input gets its answer or its own error, in order. Every
batch path first converts each input (parse a request, pull the state out of an input,
screenshot a page), keeps the ones that convert, sends those to the engine in one call, and
puts each result back into its input's slot. :class:`Slots` is that bookkeeping, written once.

Example:
    >>> slots = Slots.parse(["1", "x", "3"], int)
    >>> slots.pending
    [1, 3]
    >>> out = slots.fill([10, 30])
    >>> out[0], type(out[1]).__name__, out[2]
    (10, 'ValueError', 30)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Slots(Generic[T]):
    """Converted items waiting for their answers, and the errors of those that failed.

    Attributes:
        slots: One entry per input, in order: an exception for an input that failed to
            convert, else ``None`` until :meth:`fill` puts its answer there.
        indexes: The positions of the inputs that converted, in order.
        pending: Those converted items, in the same order (what to send to the engine).
    """

    def __init__(self, size: int) -> None:
        self.slots: list[Any] = [None] * size
        self.indexes: list[int] = []
        self.pending: list[T] = []

    @classmethod
    def parse(
        cls,
        items: Iterable[Any],
        convert: Callable[[Any], T],
        *,
        catch: type[BaseException] | tuple[type[BaseException], ...] = Exception,
        raise_errors: bool = False,
    ) -> Slots[T]:
        """Convert each item; an item whose conversion raises ``catch`` keeps its error.

        Args:
            items: The batch's inputs.
            convert: Turns one input into what the engine takes.
            catch: The exceptions that belong to an item (others propagate).
            raise_errors: Raise the first such error instead (``return_exceptions=False``).
        """
        items = list(items)
        out: Slots[T] = cls(len(items))
        for i, item in enumerate(items):
            try:
                converted = convert(item)
            except catch as exc:
                if raise_errors:
                    raise
                out.slots[i] = exc
                continue
            out.indexes.append(i)
            out.pending.append(converted)
        return out

    @property
    def errors(self) -> list[int]:
        """Positions of the inputs that failed to convert."""
        return [i for i, s in enumerate(self.slots) if isinstance(s, BaseException)]

    def fill(self, results: Sequence[Any]) -> list[Any]:
        """Put one result per pending item into its slot; the full list, in input order.

        Raises:
            ValueError: ``results`` does not hold exactly one result per pending item.
        """
        results = list(results)
        if len(results) != len(self.pending):
            raise ValueError(f"{len(results)} results for {len(self.pending)} pending batch items")
        for i, result in zip(self.indexes, results, strict=True):
            self.slots[i] = result
        return self.slots
