"""One place that writes results: rich tables for people, one JSON document for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any


def print_json(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def console():
    """A rich console on stdout; rich is imported only when a human-readable table is printed."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def fail(message: str, code: int = 2) -> None:
    """Print `error: message` as one line on stderr and exit; control characters (a newline in a hostile
    file name, say) are escaped so the message stays one line."""
    line = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in message)
    sys.stderr.write(f"error: {line}\n")
    raise SystemExit(code)
