"""A verdict per serving stack: status, reasons, launch command, and the specpair command that fixes it."""

from __future__ import annotations

from dataclasses import dataclass, field

from specpair.checkpoint import Checkpoint
from specpair.compat.pair import Deployment, Pair
from specpair.compat.rules import Finding, evaluate
from specpair.compat.stacks import STACKS
from specpair.errors import BadInput

SCHEMA = "specpair.check/1"


@dataclass
class Verdict:
    stack: str
    status: str  # ok | warn | fail
    reasons: list[Finding] = field(default_factory=list)
    launch: str | None = None
    fix: str | None = None

    def to_json(self) -> dict:
        return {
            "status": self.status,
            "reasons": [{"rule": f.rule, "severity": f.severity, "message": f.message} for f in self.reasons],
            "launch": self.launch,
            "fix": self.fix,
        }


def drafter_kind(target: Checkpoint, draft: Checkpoint | None) -> str:
    """How the pair speculates: the drafter's own kind, the target's MTP head, or a plain draft model."""
    if target.role == "drafter":
        raise BadInput(target.ref, f"is a {target.drafter.kind} drafter, not a target: give the target first (specpair check TARGET DRAFT)")
    if draft is None or draft is target:
        return "mtp"
    if draft.drafter is not None:
        return draft.drafter.kind
    return "draft_model"


def judge(target: Checkpoint, draft: Checkpoint | None, deployment: Deployment, stacks: list[str]) -> tuple[Pair, dict[str, Verdict]]:
    kind = drafter_kind(target, draft)
    pair = Pair(target, draft if draft is not None else target, kind, deployment)
    verdicts = {}
    for stack in stacks:
        found = evaluate(pair, stack)
        findings = [f for _, f in found]
        severities = {f.severity for f in findings}
        status = "fail" if "error" in severities else "warn" if "warn" in severities else "ok"
        fixes = dict.fromkeys(fix for r, f in found if f.severity == "error" and r.fix and (fix := r.fix(pair, stack)))
        fix = " && ".join(fixes) or None
        launch = STACKS[stack].launch(pair) if status != "fail" else None
        verdicts[stack] = Verdict(stack, status, findings, launch, fix)
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
