"""`specpair verify DIR|LOCK`: re-hash what `specpair download` wrote and compare it with specpair.lock."""

from __future__ import annotations

from typing import Annotated

import typer

from specpair.cli import app
from specpair.cli._options import JsonOpt, QuietOpt
from specpair.cli._output import console, print_json, print_table

EXAMPLES = """\b
Examples:
  specpair verify specpair.lock
  specpair verify .                   # the specpair.lock in this directory
  specpair verify specpair.lock --json

\b
Exit codes: 0 every file matches the lock; 1 a file is missing, or its size or sha256 differs; 2 bad input."""

STATUS_STYLE = {"ok": "green", "missing": "red", "size_differs": "red", "hash_differs": "red"}


@app.command(epilog=EXAMPLES)
def verify(
    target: Annotated[str, typer.Argument(metavar="DIR|LOCK", help="A specpair.lock, or the directory holding one.")],
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Re-hash every file a lockfile lists (sha256) and report ok / missing / size differs / hash differs."""
    from specpair.sources.lockfile import lock_path_of, read_lock
    from specpair.sources.lockfile import verify as verify_files

    path = lock_path_of(target)
    repos = read_lock(path)
    per_repo = verify_files(repos)
    checks = [c for repo_checks in per_repo for c in repo_checks]
    differ = [c for c in checks if c.status != "ok"]
    code = 1 if differ else 0
    if json_output:
        print_json(
            {
                "schema": "specpair.verify/1",
                "lock": path,
                "ok": not differ,
                "exit_code": code,
                "repos": [
                    {
                        "repo": r.repo,
                        "commit": r.commit,
                        "path": r.directory,
                        "files": [
                            {
                                "path": c.path,
                                "size": c.size,
                                "status": c.status,
                                "found_size": c.found_size,
                                "found_sha256": c.found_sha256,
                            }
                            for c in repo_checks
                        ],
                    }
                    for r, repo_checks in zip(repos, per_repo)
                ],
            }
        )
    elif not quiet:
        from rich.markup import escape
        from rich.table import Table

        out = console()
        for r, repo_checks in zip(repos, per_repo):
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
        summary = (
            f"{len(differ)} of {len(checks)} files differ from the lock"
            if differ
            else f"all {len(checks)} files match the lock"
        )
        out.print(summary, style="red" if differ else "green")
    raise typer.Exit(code)
