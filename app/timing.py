"""Speed figures that say when they cannot be trusted: undrafted and drafted runs timed in turn (AB, BA, AB, ...), so
that a drift of the machine's speed (another process taking a core, clocks, heat) lands on both alike, and a figure
marked unreliable when repeats of one measurement disagree by more than SPREAD_LIMIT (max/min)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

SPREAD_LIMIT = 1.25  # max/min of repeats' rates: past it, the machine's speed moved more than drafting would
A = TypeVar("A")
B = TypeVar("B")


def in_turn(first: Callable[[], A], second: Callable[[], B], turn: int) -> tuple[A, B]:
    """Both runs, `first` before `second` on even turns and after it on odd ones."""
    if turn % 2 == 0:
        a = first()
        return a, second()
    b = second()
    return first(), b


def alternate(first: Callable[[], A], second: Callable[[], B], repeats: int) -> tuple[list[A], list[B]]:
    """`repeats` runs of each, in turn: AB BA AB ..."""
    pairs = [in_turn(first, second, turn) for turn in range(repeats)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def spread(rates: Iterable[float | None]) -> float | None:
    """max/min of the repeats' rates (of one measurement); None with fewer than two."""
    known = [r for r in rates if r]
    return max(known) / min(known) if len(known) > 1 else None


@dataclass(frozen=True)
class Spread:
    """How far the repeats behind the undrafted and the drafted figure disagree."""

    repeats: int  # repeats behind each figure
    undrafted: float | None  # max/min of the undrafted repeats; None: fewer than two
    drafted: float | None

    @classmethod
    def of(cls, undrafted: list[float | None], drafted: list[float | None]) -> Spread:
        return cls(max(len(undrafted), len(drafted)), spread(undrafted), spread(drafted))

    @classmethod
    def across(cls, measurements: list[tuple[list[float | None], list[float | None]]]) -> Spread:
        """The worst spread of several measurements, each its (undrafted, drafted) repeats' rates."""
        parts = [cls.of(u, d) for u, d in measurements]
        return cls(
            min(p.repeats for p in parts), _largest(p.undrafted for p in parts), _largest(p.drafted for p in parts)
        )

    @property
    def worst(self) -> float | None:
        return _largest((self.undrafted, self.drafted))

    @property
    def reliable(self) -> bool:
        return self.worst is None or self.worst <= SPREAD_LIMIT

    def to_json(self) -> dict[str, Any]:
        return {
            "repeats": self.repeats,
            "spread": {"undrafted": self.undrafted, "drafted": self.drafted},
            "limit": SPREAD_LIMIT,
            "reliable": self.reliable,
        }

    def warning(self) -> str:
        """Why the figures are not results; '' when they are."""
        if self.reliable:
            return ""
        return (
            f"speed unreliable: its {self.repeats} repeats disagree up to {self.worst:.2f}× (max/min; limit "
            f"{SPREAD_LIMIT:.2f}×): the machine's speed moved while it ran; rerun when it is idle"
        )


def _largest(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
