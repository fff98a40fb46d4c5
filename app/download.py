"""`specpair download REPO[@REV] [REPO2[@REV2]]`: a target and its drafter, each pinned to a commit, every file
verified, and the lockfile that says what was fetched."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specpair.app.progress import SILENT, Progress

if TYPE_CHECKING:
    from specpair.sources.download import DiskNeed, FileState, RepoPlan, RepoResult

SCHEMA = "specpair.download/1"


@dataclass
class DownloadPlan:
    plans: list[RepoPlan]  # per repo: its commit, files and destination
    states: list[list[FileState]]  # per repo, per file: what is on disk already
    needs: list[DiskNeed]  # per filesystem: bytes to fetch and free

    @property
    def fits(self) -> bool:
        return all(n.needed <= n.free for n in self.needs)

    def to_json(self) -> dict[str, Any]:
        """The --dry-run document: the plan, what does not fit, and its exit code."""
        repos = []
        for p, plan_states in zip(self.plans, self.states):
            repos.append(
                {
                    **repo_head(p),
                    "bytes_total": sum(s.file.size for s in plan_states),
                    "bytes_needed": sum(s.file.size - s.partial for s in plan_states if not s.present),
                    "files": [
                        {"path": s.file.path, "size": s.file.size, "on_disk": on_disk(s), "partial_bytes": s.partial}
                        for s in plan_states
                    ],
                }
            )
        disk = [
            {"directory": n.directory, "needed": n.needed, "free": n.free, "fits": n.needed <= n.free}
            for n in self.needs
        ]
        return {"schema": SCHEMA, "dry_run": True, "repos": repos, "disk": disk, "exit_code": 0 if self.fits else 2}


@dataclass
class Downloaded:
    results: list[RepoResult]
    lock: str | None  # the lockfile written, as named (None: --no-lock)

    def to_json(self) -> dict[str, Any]:
        repos = []
        for r in self.results:
            repos.append(
                {
                    **repo_head(r.plan),
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
        lock = None if self.lock is None else os.path.abspath(self.lock)
        return {"schema": SCHEMA, "dry_run": False, "exit_code": 0, "lock": lock, "repos": repos}


def plan_download(
    repos: list[str],
    revision: str | None = None,
    *,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    local_dir: str | None = None,
    metadata_only: bool = False,
    require_sha: bool = True,
    on_resolved: Callable[[RepoPlan], None] = lambda plan: None,
) -> DownloadPlan:
    """Each repo resolved to its commit (`on_resolved` hears of each), its files listed and surveyed on disk."""
    from specpair.sources import download as dl

    plans = dl.plan(repos, revision, include or [], exclude or [], local_dir, metadata_only, require_sha, on_resolved)
    states = [dl.survey(p) for p in plans]
    return DownloadPlan(plans, states, dl.disk_needs(plans, states))


def fetch(plan: DownloadPlan, lock: str | None, progress: Progress = SILENT) -> Downloaded:
    """Every file of `plan` on disk and verified (resuming what is there), then the lockfile at `lock`."""
    from specpair.sources import download as dl
    from specpair.sources.lockfile import write_lock

    dl.check_space(plan.needs)
    dl.create_destinations(plan.plans)
    to_fetch = [s for plan_states in plan.states for s in plan_states if not s.present]
    total, done = sum(s.file.size for s in to_fetch), sum(s.partial for s in to_fetch)
    with progress.meter("downloading", total, done=done) as on_bytes:
        results = dl.fetch(plan.plans, plan.states, on_bytes)
    if lock is not None:
        write_lock(os.path.abspath(lock), [r.locked() for r in results])
    return Downloaded(results, lock)


def repo_head(p: RepoPlan) -> dict[str, Any]:
    return {
        "repo": p.repo,
        "role": p.role,
        "revision": p.revision,
        "commit": p.commit,
        "layout": p.destination.layout,
        "path": p.destination.directory,
    }


def on_disk(state: FileState) -> str:
    return "present" if state.present else ("partial" if state.partial else "absent")
