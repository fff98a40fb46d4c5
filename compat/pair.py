"""What the rules look at: a target, a drafter, how they are paired, and the user's deployment."""

from __future__ import annotations

from dataclasses import dataclass

from specpair.checkpoint import Checkpoint, Taps
from specpair.checkpoint.families import DRAFTER_KINDS
from specpair.compat.memory import Gpu

DEFAULT_CONTEXT = 32768


@dataclass(frozen=True)
class Deployment:
    gpu: Gpu | None = None
    gpus: int = 1
    context: int | None = None  # None: min(target max positions, DEFAULT_CONTEXT)
    concurrency: int = 1


@dataclass
class Pair:
    target: Checkpoint
    draft: Checkpoint  # the target itself when the drafter is its MTP head
    kind: str  # dflash | dflash2 | mtp | eagle3 | draft_model
    deployment: Deployment

    @property
    def checkpoints(self) -> list[Checkpoint]:
        """Target and drafter, once each (an MTP pair is one checkpoint)."""
        return [self.target] if self.draft is self.target else [self.target, self.draft]

    @property
    def context(self) -> int:
        if self.deployment.context:
            return self.deployment.context
        return min(self.target.rope.max_position_embeddings or DEFAULT_CONTEXT, DEFAULT_CONTEXT)

    @property
    def taps(self) -> Taps | None:
        """Target layers the drafter reads; EAGLE-3 heads without ids get vLLM's default (2, L//2, L-3)."""
        drafter = self.draft.drafter
        if drafter and drafter.taps:
            return drafter.taps
        if self.kind == "eagle3":
            n = self.target.shapes.num_layers
            raw = [2, n // 2, n - 3]
            return Taps([i - 1 for i in raw], raw, "vLLM default (2, L//2, L-3)", "input of decoder layer k")
        return None

    @property
    def block_size(self) -> int:
        """Tokens verified per round: the drafter's trained block, else its kind's (the block `run` uses)."""
        drafter = self.draft.drafter
        if drafter and drafter.block_size:
            return drafter.block_size
        return DRAFTER_KINDS[self.kind].block_size

    @property
    def draft_name(self) -> str:
        return f"{self.draft.ref} (MTP head)" if self.kind == "mtp" else self.draft.ref
