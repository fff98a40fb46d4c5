"""A verdict per serving stack: status, reasons, launch command, and the specpair command that fixes it."""

from __future__ import annotations

from dataclasses import dataclass, field

from specpair.checkpoint import Checkpoint
from specpair.checkpoint.families import drafter_kind
from specpair.compat.memory import MemoryPlan
from specpair.compat.pair import Deployment, Pair
from specpair.compat.rules import Finding, evaluate
from specpair.compat.rules.memory import memory_plan
from specpair.compat.stacks import STACKS
from specpair.errors import BadInput

SCHEMA = "specpair.check/1"


@dataclass
class Verdict:
    stack: str
    status: str  # ok | warn | fail
    reasons: list[Finding] = field(default_factory=list)
    launch: str | None = None
    fix: str | None = None  # the commands that clear every error of this stack, when there are such
    blocked_by: list[str] = field(default_factory=list)  # errors no specpair command clears
    memory: MemoryPlan | None = None

    def to_json(self) -> dict:
        return {
            "status": self.status,
            "reasons": [
                {"rule": f.rule, "severity": f.severity, "message": f.message, "values": f.values} for f in self.reasons
            ],
            "launch": self.launch,
            "fix": self.fix,
            "blocked_by": self.blocked_by,
            "memory": self.memory.to_json() if self.memory else None,
        }


def judge(
    target: Checkpoint, draft: Checkpoint | None, deployment: Deployment, stacks: list[str]
) -> tuple[Pair, dict[str, Verdict]]:
    if target.role == "drafter":
        raise BadInput(
            target.ref,
            f"is a {target.drafter.kind} drafter, not a target: give the target first (specpair check TARGET DRAFT)",
        )
    separate = draft is not None and draft is not target
    kind = drafter_kind(draft.drafter.kind if separate and draft.drafter else None, separate)
    pair = Pair(target, draft if draft is not None else target, kind, deployment)
    verdicts = {}
    for stack in stacks:
        found = evaluate(pair, stack)
        findings = [f for _, f in found]
        severities = {f.severity for f in findings}
        status = "fail" if "error" in severities else "warn" if "warn" in severities else "ok"
        # A rule's fix clears that rule's findings; it is offered only when, all applied, no error is left.
        fixes: dict[str, None] = {}
        blocked: dict[str, None] = {}
        for r, f in found:
            if f.severity == "error":
                steps = r.fix(pair, stack) if r.fix else None
                if steps:
                    fixes.update(dict.fromkeys(steps))  # a download two fixes need runs once
                else:
                    blocked[r.id] = None
        fix = " && ".join(fixes) if fixes and not blocked else None
        memory = memory_plan(pair, stack)
        launch = STACKS[stack].launch_line(pair, memory) if status != "fail" else None
        verdicts[stack] = Verdict(stack, status, findings, launch, fix, list(blocked), memory)
    return pair, verdicts


def exit_code(verdicts: dict[str, Verdict]) -> int:
    """0 when at least one asked stack can run the pair (ok or warn), 1 when every one fails."""
    return 0 if any(v.status != "fail" for v in verdicts.values()) else 1


def report(pair: Pair, verdicts: dict[str, Verdict]) -> dict:
    return {
        "schema": SCHEMA,
        "target": pair.target.to_json(),
        "draft": pair.draft.to_json(),
        "drafter_kind": pair.kind,
        "verdicts": {stack: v.to_json() for stack, v in verdicts.items()},
        "exit_code": exit_code(verdicts),
    }
