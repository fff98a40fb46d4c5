"""`specpair catalog`: the published checkpoints whose metadata ships inside specpair."""

from __future__ import annotations

from collections import defaultdict

from specpair.checkpoint import Checkpoint
from specpair.cli._options import JsonOpt
from specpair.cli._output import Output, console, print_prose, print_table

EXAMPLES = """\b
Examples:
  specpair catalog
  specpair catalog --json

\b
Output: a table of the entries; --json: one document (schema specpair.catalog/1)."""


def catalog(json_output: JsonOpt = False) -> None:
    """List the built-in catalog: what `check` and `inspect` can answer with no network."""
    from specpair.sources.catalog import SCHEMA, entries, is_pinned, is_reconstructed

    found = entries()
    Output(json_output).result(
        lambda: {
            "schema": SCHEMA,
            "entries": [{**c.to_json(), "reconstructed": is_reconstructed(c), "pinned": is_pinned(c)} for c in found],
        },
        lambda: print_human(found),
    )


def print_human(found: list[Checkpoint]) -> None:
    from rich.table import Table

    from specpair.sources.catalog import is_pinned, is_reconstructed, revision_label

    table = Table("repo", "revision", "role", "kind", "format", "layouts", "GB", "data")
    for column in (table.columns[0], table.columns[1], table.columns[4]):
        column.no_wrap = True  # repo ids, revisions and file names are copied from here: never folded or cut
    for c in found:
        kind = c.drafter.kind if c.drafter else c.family
        files = ", ".join(f.path for f in c.files if f.path.endswith(".gguf"))
        table.add_row(
            c.ref,
            revision_label(c),
            c.role,
            kind or "-",
            files or c.format,
            layout_summary(c),
            f"{c.total_bytes / 1e9:.1f}",
            "reconstructed" if is_reconstructed(c) else "config copy",
        )
    out = console()
    print_table(out, table)
    print_prose(
        out,
        "data: reconstructed = rebuilt from published facts (model cards, tables, test fixtures), config "
        "copy = parsed from a copy of the repo's config; `specpair catalog --json` has each entry's provenance. "
        f"revision: {sum(map(is_pinned, found))} of {len(found)} entries are pinned to a full commit; an "
        "abbreviated commit or none (unpinned) describes whatever the repo held when its facts were published.",
    )


def layout_summary(checkpoint: Checkpoint) -> str:
    """Storage layouts by share of bytes, largest first: 'nvfp4-modelopt 77%, bf16 18%, fp8-tensor 5%'."""
    totals: dict[str, int] = defaultdict(int)
    for g in checkpoint.groups:
        totals[g.layout] += g.bytes
    if len(totals) <= 1:
        return next(iter(totals), "unknown")
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    return ", ".join(f"{layout} {round(100 * size / checkpoint.total_bytes)}%" for layout, size in ranked)
