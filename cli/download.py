"""`specpair download REPO[@REV] [REPO2[@REV2]]`: pinned, verified, resumable downloads of a target and its drafter."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from specpair.cli import app
from specpair.cli._options import JsonOpt
from specpair.cli._output import console, print_json, print_table

if TYPE_CHECKING:
    from specpair.sources.download import DiskNeed, FileState, RepoPlan, RepoResult

EXAMPLES = """\b
Examples:
  specpair download Qwen/Qwen3.6-35B-A3B@<commit> z-lab/Qwen3.6-35B-A3B-DFlash@<commit>
  specpair check specpair.lock                      # the pair just downloaded, offline
  specpair download Qwen/Qwen3-8B --no-require-sha --metadata-only     # lock what main points to now
  specpair download org/model --revision <commit> --local-dir ./model --include '*.json' --include '*.safetensors'
  specpair download org/target@<commit> org/draft@<commit> --dry-run

\b
Exit codes: 0 every file is on disk and verified (and the lockfile written); 1 the download did not complete
(a file failed its hash and was removed, the Hub kept failing, the disk filled up): run it again to resume;
2 refused before any transfer (bad arguments, no access, a branch or tag under --require-sha, not enough
free disk space)."""


@app.command(epilog=EXAMPLES)
def download(
    repos: Annotated[
        list[str],
        typer.Argument(
            metavar="REPO[@REV] [REPO2[@REV2]]",
            help="Hub repo, or a target and its drafter; each at its own branch, tag or commit (default main).",
        ),
    ],
    revision: Annotated[
        str | None, typer.Option("--revision", help="Revision of a single REPO; two repos take REPO@REV each.")
    ] = None,
    include: Annotated[
        list[str] | None, typer.Option("--include", help="Fetch only files matching this glob (repeatable).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Skip files matching this glob (repeatable).")
    ] = None,
    local_dir: Annotated[
        str | None,
        typer.Option("--local-dir", help="Write plain files here instead of the HF cache (a pair: DIR/<name> each)."),
    ] = None,
    metadata_only: Annotated[
        bool,
        typer.Option(
            "--metadata-only",
            help="Fetch only the small files `check` reads: *.json, *.jinja, *.txt, *.model, *.tiktoken, *.md.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the plan (files, sizes, what is on disk, free space) and fetch nothing."),
    ] = False,
    lock: Annotated[
        str | None,
        typer.Option("--lock", help="Where to write the lockfile (default: specpair.lock in --local-dir, else here)."),
    ] = None,
    no_lock: Annotated[
        bool, typer.Option("--no-lock", help="Write no lockfile (branches and tags are then accepted).")
    ] = False,
    require_sha: Annotated[
        bool | None,
        typer.Option(
            "--require-sha/--no-require-sha",
            help="Refuse a branch or tag: every repo pinned to a commit (default: on when a lockfile is written).",
        ),
    ] = None,
    json_output: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the downloaded path(s).")] = False,
) -> None:
    """Download a repo, or a target and its drafter, each pinned to a commit; verify every file; write specpair.lock."""
    from specpair.errors import BadInput
    from specpair.sources import download as dl
    from specpair.sources.lockfile import LOCK_NAME, write_lock

    if no_lock and lock is not None:
        raise BadInput("--lock", "--lock and --no-lock contradict each other: keep one")
    human = not (json_output or quiet)
    out = console() if human else None

    def resolved(p: RepoPlan) -> None:
        if out is not None and p.moving:
            out.print(f"{p.where} is commit {p.commit}", markup=False, highlight=False, soft_wrap=True)

    plans = dl.plan(
        repos,
        revision,
        include or [],
        exclude or [],
        local_dir,
        metadata_only,
        (not no_lock) if require_sha is None else require_sha,
        resolved,
    )
    states = [dl.survey(p) for p in plans]
    needs = dl.disk_needs(plans, states)
    if dry_run:
        if json_output:  # one document: the plan says what does not fit, and its exit code
            document = _plan_json(plans, states, needs)
            print_json(document)
            raise typer.Exit(document["exit_code"])
        if not quiet:
            _print_plan(plans, states, needs)
        dl.check_space(needs)
        return
    dl.check_space(needs)
    dl.create_destinations(plans)
    to_fetch = [s for plan_states in states for s in plan_states if not s.present]
    total, done = sum(s.file.size for s in to_fetch), sum(s.partial for s in to_fetch)
    with _progress(total, done, human and sys.stderr.isatty()) as on_bytes:
        results = dl.fetch(plans, states, on_bytes)
    # Beside the files when they go to --local-dir, so that `specpair verify DIR` finds it.
    lock = lock or os.path.join(local_dir or ".", LOCK_NAME)
    lock_path = None if no_lock else os.path.abspath(lock)
    if lock_path is not None:
        write_lock(lock_path, [r.locked() for r in results])
    if json_output:
        print_json(_result_json(results, lock_path))
    elif quiet:
        for r in results:
            print(r.plan.destination.directory)
    else:
        _print_results(results, None if no_lock else lock)


@contextmanager
def _progress(total: int, done: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    """Bytes, rate and ETA on stderr when it is a terminal; a no-op counter otherwise."""
    if not enabled or total == done:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress(
        "downloading",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("download", total=total, completed=done)
        yield lambda n: bar.advance(task, n)


def _plan_json(plans: list[RepoPlan], states: list[list[FileState]], needs: list[DiskNeed]) -> dict[str, Any]:
    repos = []
    for p, plan_states in zip(plans, states):
        repos.append(
            {
                **_repo_head(p),
                "bytes_total": sum(s.file.size for s in plan_states),
                "bytes_needed": sum(s.file.size - s.partial for s in plan_states if not s.present),
                "files": [
                    {"path": s.file.path, "size": s.file.size, "on_disk": _on_disk(s), "partial_bytes": s.partial}
                    for s in plan_states
                ],
            }
        )
    disk = [{"directory": n.directory, "needed": n.needed, "free": n.free, "fits": n.needed <= n.free} for n in needs]
    return {
        "schema": "specpair.download/1",
        "dry_run": True,
        "repos": repos,
        "disk": disk,
        "exit_code": 0 if all(d["fits"] for d in disk) else 2,
    }


def _result_json(results: list[RepoResult], lock_path: str | None) -> dict[str, Any]:
    repos = []
    for r in results:
        repos.append(
            {
                **_repo_head(r.plan),
                "bytes_total": sum(f.size for f in r.files),
                "bytes_transferred": sum(f.transferred for f in r.files),
                "bytes_resumed": sum(f.resumed for f in r.files),
                "verified": True,
                "files": [
                    {
                        "path": f.path,
                        "size": f.size,
                        "sha256": f.sha256,
                        "status": f.status,
                        "bytes_transferred": f.transferred,
                        "bytes_resumed": f.resumed,
                    }
                    for f in r.files
                ],
            }
        )
    return {"schema": "specpair.download/1", "dry_run": False, "exit_code": 0, "lock": lock_path, "repos": repos}


def _repo_head(p: RepoPlan) -> dict[str, Any]:
    return {
        "repo": p.repo,
        "role": p.role,
        "revision": p.revision,
        "commit": p.commit,
        "layout": p.destination.layout,
        "path": p.destination.directory,
    }


def _on_disk(state: FileState) -> str:
    return "present" if state.present else ("partial" if state.partial else "absent")


def _print_plan(plans: list[RepoPlan], states: list[list[FileState]], needs: list[DiskNeed]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from specpair.sources.download import human_size

    out = console()
    for p, plan_states in zip(plans, states):
        out.print(
            f"[bold]{p.role}[/bold] {p.repo} @ {p.commit} → {escape(p.destination.directory)}",
            highlight=False,
            soft_wrap=True,
        )
        table = Table("file", "size", "on disk")
        table.columns[0].no_wrap = True  # file names are copied from here
        for s in plan_states:
            on_disk = _on_disk(s) + (f" ({human_size(s.partial)} to resume from)" if s.partial else "")
            table.add_row(escape(s.file.path), human_size(s.file.size), on_disk)
        print_table(out, table)
    for n in needs:
        verdict = "[green]fits[/green]" if n.needed <= n.free else "[red]does not fit[/red]"
        out.print(
            f"{human_size(n.needed)} to fetch, {human_size(n.free)} free on the filesystem of "
            f"{escape(n.directory)}: {verdict}",
            highlight=False,
            soft_wrap=True,
        )
    out.print("dry run: nothing was fetched")


def _print_results(results: list[RepoResult], lock: str | None) -> None:
    from specpair.sources.download import human_size

    out = console()
    for r in results:
        present = sum(f.size for f in r.files if f.status == "present")
        transferred = sum(f.transferred for f in r.files)
        resumed = sum(f.resumed for f in r.files)
        out.print(
            f"[bold]{r.plan.role}[/bold] {r.plan.repo} @ {r.plan.commit}: {len(r.files)} files, "
            f"{human_size(sum(f.size for f in r.files))}, all verified ({human_size(transferred)} downloaded"
            + (f", {human_size(resumed)} resumed from an earlier run" if resumed else "")
            + (f", {human_size(present)} already present" if present else "")
            + ")",
            highlight=False,
            soft_wrap=True,
        )
        out.print(f"  {r.plan.destination.directory}", markup=False, highlight=False, soft_wrap=True)
    if lock is not None:
        out.print(f"lockfile: {lock}", markup=False, highlight=False, soft_wrap=True)
