"""`specpair verify DIR|LOCK`: re-hash what `specpair download` wrote and compare it with specpair.lock."""

from __future__ import annotations

from typing import Annotated

import typer

from specpair.cli._options import JsonOpt, QuietOpt
from specpair.cli._output import Output, console, print_table

EXAMPLES = """\b
Examples:
  specpair verify specpair.lock
  specpair verify .                   # the specpair.lock in this directory
  specpair verify specpair.lock --json

\b
Output: a table per repo (file, size, status) and a summary line; --quiet: nothing (the exit code tells);
--json: one document (schema specpair.verify/1).
Exit codes: 0 every file matches the lock; 1 a file is missing, or its size or sha256 differs; 2 bad input."""

STATUS_STYLE = {"ok": "green", "missing": "red", "size_differs": "red", "hash_differs": "red"}
LockArg = Annotated[str, typer.Argument(metavar="DIR|LOCK", help="A specpair.lock, or the directory holding one.")]


def verify(target: LockArg, json_output: JsonOpt = False, quiet: QuietOpt = False) -> None:
    """Re-hash every file a lockfile lists (sha256) and report ok / missing / size differs / hash differs."""
    from specpair.app.verify import verify_lock

    result = verify_lock(target)
    Output(json_output, quiet).result(result.to_json, lambda: print_human(result))
    raise typer.Exit(result.exit_code)


def print_human(result) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console()
    for r, repo_checks in zip(result.repos, result.checks):
        out.print(
            f"[bold]{r.role}[/bold] {r.repo} @ {r.commit}  {escape(r.directory)}", highlight=False, soft_wrap=True
        )
        table = Table("file", "size", "status")
        table.columns[0].no_wrap = True  # file names are copied from here
        for c in repo_checks:
            found = f" ({c.found_size} bytes)" if c.status == "size_differs" else ""
            status = c.status.replace("_", " ") + found
            table.add_row(escape(c.path), str(c.size), f"[{STATUS_STYLE[c.status]}]{status}[/]")
        print_table(out, table)
    differ = result.differ
    summary = (
        f"{len(differ)} of {result.files} files differ from the lock"
        if differ
        else f"all {result.files} files match the lock"
    )
    out.print(summary, style="red" if differ else "green")
