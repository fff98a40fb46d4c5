"""`specpair download REPO[@REV] [REPO2[@REV2]]`: pinned, verified, resumable downloads of a target and its drafter."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from specpair.cli._options import DryRunOpt, JsonOpt, QuietOpt
from specpair.cli._output import Output, console, print_table

if TYPE_CHECKING:
    from specpair.app.download import Downloaded, DownloadPlan
    from specpair.sources.download import RepoPlan

EXAMPLES = """\b
Examples:
  specpair download Qwen/Qwen3.6-35B-A3B@<commit> z-lab/Qwen3.6-35B-A3B-DFlash@<commit>
  specpair check specpair.lock                      # the pair just downloaded, offline
  specpair download Qwen/Qwen3-8B --no-require-sha --metadata-only     # lock what main points to now
  specpair download org/model --revision <commit> --local-dir ./model --include '*.json' --include '*.safetensors'
  specpair download org/target@<commit> org/draft@<commit> --dry-run

\b
Output: per repo its commit, files and where they are, then the lockfile; a bar on stderr on a terminal;
--dry-run: the plan (files, sizes, what is on disk, free space); --quiet: only the downloaded path(s); --json: one
document (schema specpair.download/1).

\b
Exit codes: 0 every file is on disk and verified (and the lockfile written); 1 the download did not complete
(a file failed its hash and was removed, the Hub kept failing, the disk filled up): run it again to resume;
2 refused before any transfer (bad arguments, no access, a branch or tag under --require-sha, not enough
free disk space)."""

ReposArg = Annotated[
    list[str],
    typer.Argument(
        metavar="REPO[@REV] [REPO2[@REV2]]",
        help="Hub repo, or a target and its drafter; each at its own branch, tag or commit (default main).",
    ),
]
RevisionOpt = Annotated[
    str | None, typer.Option("--revision", help="Revision of a single REPO; two repos take REPO@REV each.")
]
IncludeOpt = Annotated[
    list[str] | None, typer.Option("--include", help="Fetch only files matching this glob (repeatable).")
]
ExcludeOpt = Annotated[list[str] | None, typer.Option("--exclude", help="Skip files matching this glob (repeatable).")]
LocalDirOpt = Annotated[
    str | None,
    typer.Option("--local-dir", help="Write plain files here instead of the HF cache (a pair: DIR/<name> each)."),
]
MetadataOnlyOpt = Annotated[
    bool,
    typer.Option(
        "--metadata-only",
        help="Fetch only the small files `check` reads: *.json, *.jinja, *.txt, *.model, *.tiktoken, *.md.",
    ),
]
LockOpt = Annotated[
    str | None,
    typer.Option("--lock", help="Where to write the lockfile (default: specpair.lock in --local-dir, else here)."),
]
NoLockOpt = Annotated[bool, typer.Option("--no-lock", help="Write no lockfile (branches and tags are then accepted).")]
RequireShaOpt = Annotated[
    bool | None,
    typer.Option(
        "--require-sha/--no-require-sha",
        help="Refuse a branch or tag: every repo pinned to a commit (default: on when a lockfile is written).",
    ),
]


def download(
    repos: ReposArg,
    revision: RevisionOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    local_dir: LocalDirOpt = None,
    metadata_only: MetadataOnlyOpt = False,
    dry_run: DryRunOpt = False,
    lock: LockOpt = None,
    no_lock: NoLockOpt = False,
    require_sha: RequireShaOpt = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Download a repo, or a target and its drafter, each pinned to a commit; verify every file; write specpair.lock."""
    from specpair.app.download import fetch, plan_download
    from specpair.errors import BadInput
    from specpair.sources.download import check_space
    from specpair.sources.lockfile import LOCK_NAME

    if no_lock and lock is not None:
        raise BadInput("--lock", "--lock and --no-lock contradict each other: keep one")
    out = Output(json_output, quiet)

    def resolved(p: RepoPlan) -> None:
        if out.human and p.moving:
            console().print(f"{p.where} is commit {p.commit}", markup=False, highlight=False, soft_wrap=True)

    plan = plan_download(
        repos,
        revision,
        include=include,
        exclude=exclude,
        local_dir=local_dir,
        metadata_only=metadata_only,
        require_sha=(not no_lock) if require_sha is None else require_sha,
        on_resolved=resolved,
    )
    if dry_run:  # under --json one document: the plan says what does not fit, and its exit code
        document = plan.to_json()
        out.result(document, lambda: print_plan(plan))
        if not json_output:
            check_space(plan.needs)
        raise typer.Exit(document["exit_code"])
    # Beside the files when they go to --local-dir, so that `specpair verify DIR` finds it.
    done = fetch(plan, None if no_lock else lock or os.path.join(local_dir or ".", LOCK_NAME), progress=out)
    out.result(done.to_json, lambda: print_results(done), quiet=[r.plan.destination.directory for r in done.results])


def print_plan(plan: DownloadPlan) -> None:
    from rich.markup import escape
    from rich.table import Table

    from specpair.app.download import on_disk
    from specpair.sources.download import human_size

    out = console()
    for p, plan_states in zip(plan.plans, plan.states):
        out.print(
            f"[bold]{p.role}[/bold] {p.repo} @ {p.commit} → {escape(p.destination.directory)}",
            highlight=False,
            soft_wrap=True,
        )
        table = Table("file", "size", "on disk")
        table.columns[0].no_wrap = True  # file names are copied from here
        for s in plan_states:
            shown = on_disk(s) + (f" ({human_size(s.partial)} to resume from)" if s.partial else "")
            table.add_row(escape(s.file.path), human_size(s.file.size), shown)
        print_table(out, table)
    for n in plan.needs:
        verdict = "[green]fits[/green]" if n.needed <= n.free else "[red]does not fit[/red]"
        out.print(
            f"{human_size(n.needed)} to fetch, {human_size(n.free)} free on the filesystem of "
            f"{escape(n.directory)}: {verdict}",
            highlight=False,
            soft_wrap=True,
        )
    out.print("dry run: nothing was fetched")


def print_results(done: Downloaded) -> None:
    from specpair.sources.download import human_size

    out = console()
    for r in done.results:
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
    if done.lock is not None:
        out.print(f"lockfile: {done.lock}", markup=False, highlight=False, soft_wrap=True)
