"""One place that writes what a command prints: the `Output` object a command makes from --json and --quiet, which
prints the result (rich tables for people, one JSON document for scripts, or only what a script needs) and shows
the application layer's progress on stderr; errors as one line or one JSON document.

--json: stdout holds one JSON document, errors included; stderr is as without it. --quiet: stdout holds only the
result a script needs (each command's help says what: the generated text, the downloaded paths, or nothing when
the exit code tells), and stderr nothing but an error. Progress (stderr): on a terminal, a bar for metered work
and a line per stage; elsewhere a line per stage (and, where asked, a line per tenth of metered work).

Widths: on a terminal, prose wraps at word boundaries to its width; into a pipe or a file it does not wrap (a log
line holds a whole finding), and tables take COLUMNS when it is set. Commands, paths and repo ids are never wrapped
or truncated: table columns holding them are `no_wrap`, and a table is printed at least as wide as those
need, wrapping only its prose columns.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from specpair.app.progress import Advance, duration

ERROR_SCHEMA = "specpair.error/1"
UNWRAPPED = 1_000_000  # the console width into a pipe: no line is long enough to wrap


def print_json(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def console():
    """A rich console on stdout (rich is imported only when human-readable output is printed)."""
    from rich.console import Console

    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else UNWRAPPED
    return Console(highlight=False, soft_wrap=False, width=width)


def print_prose(out, text: str, style: str | None = None, indent: int = 0) -> None:
    """A paragraph (rich markup allowed): on a terminal wrapped at spaces to its width, a long token never split;
    into a pipe one line, whatever COLUMNS says (a log line holds the whole finding)."""
    from rich.text import Text

    out.print(
        Text.from_markup(" " * indent + text, style=style or "", overflow="ignore"), soft_wrap=not out.is_terminal
    )


def print_command(out, text: str, indent: int = 2) -> None:
    """A command or path, on one line whatever the width (the terminal may fold it; no newline is added)."""
    out.print(" " * indent + text, markup=False, highlight=False, soft_wrap=True)


def print_table(out, table) -> None:
    """A table at least as wide as its unwrappable columns need: on a terminal prose columns wrap, ids never shrink;
    into a pipe no column wraps."""
    from rich.measure import Measurement

    options = out.options.update_width(UNWRAPPED)
    if not out.is_terminal:  # into a pipe nothing wraps: a row stays one line for grep, cut and awk
        for column in table.columns:
            column.no_wrap = True
    for column in table.columns:  # rich measures a cell's words, not what no_wrap keeps on one line ("393.22 KB")
        if column.no_wrap:
            cells = [column.header, *column.cells]
            column.min_width = max(column.min_width or 0, *(Measurement.get(out, options, c).maximum for c in cells))
    needed = Measurement.get(out, options, table).minimum
    width = out.width
    out.width = max(width, needed)  # rich crops to the console width: widen it for this table only
    try:
        out.print(table)
    finally:
        out.width = width


class Output:
    """What one command prints. It is the application layer's `Progress` (stage, note, warn, meter) on stderr, and
    prints the command's result on stdout in the mode asked (`result`)."""

    def __init__(self, json_output: bool = False, quiet: bool = False, prefix: str = "") -> None:
        self.json, self.quiet, self.prefix = json_output, quiet, prefix
        self.terminal = sys.stderr.isatty()

    @property
    def human(self) -> bool:
        """Whether the result is printed for people (neither --json nor --quiet)."""
        return not (self.json or self.quiet)

    def result(
        self,
        document: dict[str, Any] | Callable[[], dict[str, Any]],
        human: Callable[[], None],
        quiet: Iterable[str] | Callable[[], None] = (),
    ) -> None:
        """The command's result: the JSON `document` under --json; under --quiet the `quiet` lines (or what
        `quiet()` prints); else `human()`."""
        if self.json:
            print_json(document() if callable(document) else document)
        elif self.quiet and callable(quiet):
            quiet()
        elif self.quiet:
            for line in quiet:
                sys.stdout.write(line + "\n")
        else:
            human()

    def stage(self, what: str) -> None:
        self._line(what + " ...")

    def note(self, line: str) -> None:
        self._line(line)

    def warn(self, message: str) -> None:
        self._line("warning: " + message)

    def _line(self, text: str) -> None:
        if not self.quiet:
            sys.stderr.write(self.prefix + text + "\n")
            sys.stderr.flush()

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
        """A bar with rate and ETA on a terminal; elsewhere, with `tenths`, a line at each further tenth of the
        work (done, rate, ETA), else nothing."""
        if self.quiet or total <= done or not (self.terminal or tenths):
            yield lambda n: None
        elif self.terminal:
            with _bar(label, total, unit, done) as advance:
                yield advance
        else:
            yield _Tenths(self, total, unit, done, detail).advance


@contextlib.contextmanager
def _bar(label: str, total: int, unit: str, done: int) -> Iterator[Advance]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TaskProgressColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        [BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()]
        if unit == "bytes"
        else [
            BarColumn(),
            TaskProgressColumn(),
            f"{{task.completed:,.0f}}/{{task.total:,.0f}} {unit}",
            "{task.fields[rate]}",
            TimeRemainingColumn(),
        ]
    )
    with Progress(label, *columns, console=Console(stderr=True), transient=True) as bar:
        started = time.perf_counter()
        task = bar.add_task(label, total=total, completed=done, rate="")

        def advance(n: int) -> None:
            bar.advance(task, n)
            if unit != "bytes":
                rate = (bar.tasks[0].completed - done) / max(time.perf_counter() - started, 1e-9)
                bar.update(task, rate=f"{rate:,.1f} {unit}/s")

        yield advance


class _Tenths:
    """One line at each further tenth of metered work: how far, where (detail), rate, time elapsed and left."""

    def __init__(self, out: Output, total: int, unit: str, done: int, detail: Callable[[], str] | None) -> None:
        self.out, self.total, self.unit, self.done, self.detail = out, total, unit, done, detail
        self.first = done
        self.tenths = done * 10 // total
        self.started = time.perf_counter()
        self.lock = threading.Lock()

    def advance(self, n: int) -> None:
        with self.lock:
            self.done += n
            tenths = min(10, self.done * 10 // max(self.total, 1))
            if tenths <= self.tenths:
                return
            self.tenths = tenths
            elapsed = time.perf_counter() - self.started
            rate = (self.done - self.first) / max(elapsed, 1e-9)
            left = (self.total - self.done) / rate if rate else 0.0
            shown = rate_text(rate, self.unit)
            where = f" ({self.detail()})" if self.detail else ""
            self.out.note(f"{tenths * 10}%{where}, {shown}, {elapsed:.0f} s elapsed, {duration(left)} left")


def rate_text(rate: float, unit: str) -> str:
    """'12.5 MB/s', '3.0 tiles/s'; below one a second, two significant digits ('0.011 prompts/s', not '0.0')."""
    if unit == "bytes":
        return f"{rate / 1e6:,.1f} MB/s"
    return f"{rate:,.2g} {unit}/s" if 0 < rate < 1 else f"{rate:,.1f} {unit}/s"


def printable(text: str, one_line: bool = False) -> str:
    """`text` with control characters escaped (a model's reply or a file name may hold terminal escapes); newlines
    kept, unless `one_line`."""
    return "".join(
        c if c.isprintable() or (c == "\n" and not one_line) else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def error_line(message: str) -> str:
    """`error: message` as one line: control characters (a newline in a hostile file name) are escaped."""
    return f"error: {printable(message, one_line=True)}\n"


def report_error(where: str | None, problem: str, code: int, command: str | None, as_json: bool) -> int:
    """An error that ends a command: one line on stderr, or under --json one document on stdout."""
    if as_json:
        print_json(
            {
                "schema": ERROR_SCHEMA,
                "command": command,
                "error": {"file": where, "problem": problem},
                "exit_code": code,
            }
        )
    else:
        sys.stderr.write(error_line(f"{where}: {problem}" if where else problem))
    return code


class ClosedPipeSafe:
    """sys.stdout that turns a closed reader (`specpair check ... | head -2`) into silence: the command still
    finishes its work and exits with its own code. After the first EPIPE the descriptor points at /dev/null,
    so what is still buffered (and the interpreter's last flush) goes nowhere instead of failing again."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.closed_reader = False

    def write(self, text: str) -> int:
        if not self.closed_reader:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._silence()
        return len(text)

    def flush(self) -> None:
        if not self.closed_reader:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._silence()

    def _silence(self) -> None:
        self.closed_reader = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
