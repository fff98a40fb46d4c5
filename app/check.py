"""`specpair check TARGET [DRAFT]`: open a target and its drafter (or the pair a specpair.lock pins) and judge them
on each serving stack, from metadata alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specpair.errors import BadInput

if TYPE_CHECKING:
    from specpair.compat.pair import Pair
    from specpair.compat.verdict import Verdict


@dataclass
class CheckResult:
    pair: Pair
    verdicts: dict[str, Verdict]  # stack -> its verdict, in the order asked

    @property
    def exit_code(self) -> int:
        from specpair.compat.verdict import exit_code

        return exit_code(self.verdicts)

    @property
    def fallbacks(self) -> list[tuple[str, str]]:
        """(ref, why) for each checkpoint read offline because the Hub could not be reached."""
        from specpair.sources.hub import unreachable_note

        checkpoints = [self.pair.target] + ([self.pair.draft] if self.pair.draft is not self.pair.target else [])
        return [(c.ref, note) for c in checkpoints if (note := unreachable_note(c)) is not None]

    def to_json(self) -> dict[str, Any]:
        from specpair.compat.verdict import report

        return report(self.pair, self.verdicts)


def check_pair(
    target: str,
    draft: str | None = None,
    *,
    stacks: list[str] | None = None,
    gpu: str | None = None,
    gpus: int = 1,
    context: int | None = None,
    concurrency: int = 1,
    gguf_file: str | None = None,
    draft_gguf_file: str | None = None,
    offline: bool = False,
) -> CheckResult:
    """Verdicts on `stacks` (any case; default all) for a deployment on `gpus` of `gpu` (a name of the GPU table;
    default the local GPU, if any). Without `draft`, the target's MTP head; a TARGET ending in .lock is the pair
    `specpair download` wrote, read where it lies."""
    from specpair.compat.memory import GPUS, local_gpu
    from specpair.compat.pair import Deployment
    from specpair.compat.stacks import STACK_NAMES
    from specpair.compat.verdict import judge
    from specpair.sources import open_checkpoint

    asked = []
    for name in stacks or STACK_NAMES:
        known = next((s for s in STACK_NAMES if s == name.lower()), None)
        if known is None:
            raise BadInput(f"--stack {name}", f"unknown stack (stacks: {', '.join(STACK_NAMES)})")
        asked.append(known)
    if gpu is not None and gpu.lower() not in GPUS:
        raise BadInput(f"--gpu {gpu}", f"unknown GPU (known: {', '.join(GPUS)})")
    deployment = Deployment(
        gpu=GPUS[gpu.lower()] if gpu else local_gpu(), gpus=gpus, context=context, concurrency=concurrency
    )
    if draft is None and target.endswith(".lock"):
        from specpair.sources.lockfile import open_locked_pair

        target_checkpoint, draft_checkpoint = open_locked_pair(target, gguf_file, draft_gguf_file)
    else:
        target_checkpoint = open_checkpoint(target, gguf_file, offline or None)
        draft_checkpoint = open_checkpoint(draft, draft_gguf_file, offline or None) if draft else None
    pair, verdicts = judge(target_checkpoint, draft_checkpoint, deployment, list(dict.fromkeys(asked)))
    return CheckResult(pair, verdicts)
