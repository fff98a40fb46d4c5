"""Option types shared by every command, defined once so each command spells them the same way."""

from __future__ import annotations

from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout instead of tables.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing on success; the exit code tells.")]
GgufFileOpt = Annotated[
    str | None, typer.Option("--gguf-file", help="Which .gguf file to read when a directory or repo holds several.")
]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Do not contact the Hub: use the HF cache, then the built-in catalog.")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show every row: all findings, all tensors.")]
