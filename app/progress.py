"""How long work reports itself while it runs. The application layer calls these; `cli/_output.Output` is what a
person or a log sees of them (a bar on a terminal, a line per stage elsewhere, nothing with --quiet)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol

Advance = Callable[[int], None]


class Progress(Protocol):
    def stage(self, what: str) -> None:
        """A stage of the work begins ("loading 1.2 GB from ./model onto cuda")."""

    def note(self, line: str) -> None:
        """A figure or an outcome as the work goes on (a stage's speed, one gate setting's result)."""

    def warn(self, message: str) -> None:
        """Something the user should know that does not stop the work."""

    def meter(
        self,
        label: str,
        total: int,
        *,
        unit: str = "bytes",
        done: int = 0,
        detail: Callable[[], str] | None = None,
        tenths: bool = False,
    ) -> contextlib.AbstractContextManager[Advance]:
        """Work counted in `unit` ("bytes" or "tiles"), `done` of `total` already: the context yields the callable
        that advances it. `detail` says where the work is (e.g. "3 of 14 tensors"); `tenths`: off a terminal, a
        line at each further tenth of the work instead of none."""


class Silent:
    """Progress that goes nowhere: the default of every application function."""

    def stage(self, what: str) -> None:
        pass

    def note(self, line: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    @contextlib.contextmanager
    def meter(
        self,
        label: str,
        total: int,
        *,
        unit: str = "bytes",
        done: int = 0,
        detail: Callable[[], str] | None = None,
        tenths: bool = False,
    ) -> Iterator[Advance]:
        yield lambda n: None


SILENT = Silent()


def duration(seconds: float) -> str:
    """'about 12 s', 'about 4.2 h', 'under a second'."""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 5400:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"
