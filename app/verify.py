"""`specpair verify DIR|LOCK`: re-hash what `specpair download` wrote and compare it with specpair.lock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specpair.sources.lockfile import FileCheck, LockedRepo

SCHEMA = "specpair.verify/1"


@dataclass
class VerifyResult:
    lock: str  # the lockfile read
    repos: list[LockedRepo]
    checks: list[list[FileCheck]]  # per repo, per file

    @property
    def differ(self) -> list[FileCheck]:
        return [c for repo_checks in self.checks for c in repo_checks if c.status != "ok"]

    @property
    def files(self) -> int:
        return sum(len(repo_checks) for repo_checks in self.checks)

    @property
    def exit_code(self) -> int:
        return 1 if self.differ else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "lock": self.lock,
            "ok": not self.differ,
            "exit_code": self.exit_code,
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
                for r, repo_checks in zip(self.repos, self.checks)
            ],
        }


def verify_lock(target: str) -> VerifyResult:
    """Every file the lock at `target` (a specpair.lock, or the directory holding one) lists, re-hashed."""
    from specpair.sources.lockfile import lock_path_of, read_lock, verify

    path = lock_path_of(target)
    repos = read_lock(path)
    return VerifyResult(path, repos, verify(repos))
