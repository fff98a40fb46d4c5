"""One place that writes results: rich tables for people, one JSON document for scripts, errors as either.

Widths: on a terminal, prose wraps at word boundaries to its width; into a pipe or a file it does not wrap (a log
line holds a whole finding), and tables take COLUMNS when it is set. Commands, paths and repo ids are never wrapped
or truncated: table columns holding them are `no_wrap`, and a table is printed at least as wide as those
need, wrapping only its prose columns.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

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
    """A table at least as wide as its unwrappable columns need: prose columns wrap, ids never shrink."""
    from rich.measure import Measurement

    options = out.options.update_width(UNWRAPPED)
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


def error_line(message: str) -> str:
    """`error: message` as one line: control characters (a newline in a hostile file name) are escaped."""
    line = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in message)
    return f"error: {line}\n"


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
