"""`specpair catalog`: the published checkpoints whose metadata ships inside specpair."""

from __future__ import annotations

from collections import defaultdict

from specpair.checkpoint import Checkpoint
from specpair.cli import app
from specpair.cli._options import JsonOpt
from specpair.cli._output import console, print_json

EXAMPLES = """\b
Examples:
  specpair catalog
  specpair catalog --json"""


@app.command(epilog=EXAMPLES)
def catalog(json_output: JsonOpt = False) -> None:
    """List the built-in catalog: what `check` and `inspect` can answer with no network."""
    from specpair.sources.catalog import SCHEMA, entries

    found = entries()
    if json_output:
        print_json({"schema": SCHEMA, "entries": [c.to_json() for c in found]})
        return
    from rich.table import Table

    table = Table("repo", "revision", "role", "kind", "layouts", "GB", "provenance")
    for c in found:
        kind = c.drafter.kind if c.drafter else c.family
        short = (c.provenance or "unknown").partition(". ")[0]
        table.add_row(c.ref, c.revision or "-", c.role, kind or "-", layout_summary(c),
                      f"{c.total_bytes / 1e9:.1f}", short)
    console().print(table)


def layout_summary(checkpoint: Checkpoint) -> str:
    """Storage layouts by share of bytes, largest first: 'nvfp4-modelopt 77%, bf16 18%, fp8-tensor 5%'."""
    totals: dict[str, int] = defaultdict(int)
    for g in checkpoint.groups:
        totals[g.layout] += g.bytes
    if len(totals) <= 1:
        return next(iter(totals), "unknown")
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    return ", ".join(f"{layout} {round(100 * size / checkpoint.total_bytes)}%" for layout, size in ranked)
