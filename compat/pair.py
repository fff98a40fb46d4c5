"""What the rules look at: a target, a drafter, how they are paired, and the user's deployment."""

from __future__ import annotations

from dataclasses import dataclass

from specpair.checkpoint import Checkpoint, Taps
from specpair.checkpoint.families import DRAFTER_KINDS, DrafterKind, Serves, default_layout
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
    kind: str  # a DRAFTER_KINDS key
    deployment: Deployment

    @property
    def kind_row(self) -> DrafterKind:
        return DRAFTER_KINDS[self.kind]

    def serves(self, stack: str) -> Serves | None:
        """How `stack` serves this pair's drafter kind; None when it does not."""
        return self.kind_row.serving.get(stack)

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
        """Target layers the drafter reads; a head naming none, its kind's default layout's (the EAGLE repository's
        2, L//2, L-3 for EAGLE-3)."""
        drafter = self.draft.drafter
        if drafter and drafter.taps:
            return drafter.taps
        layout = default_layout(self.kind)
        if layout is not None and layout.default_ids is not None:
            raw = layout.default_ids(self.target.shapes.num_layers)
            return Taps(layout.reading.layers(raw), raw, "no ids in the config", layout.title, layout.name)
        return None

    @property
    def block_size(self) -> int:
        """Tokens verified per round: the drafter's trained block, else its kind's (the block `run` uses; 16 for DFlash,
        as SGLang and llama.cpp assume)."""
        drafter = self.draft.drafter
        if drafter and drafter.block_size:
            return drafter.block_size
        return self.kind_row.block_size

    @property
    def separate(self) -> bool:
        """Whether the drafter is a checkpoint of its own (not a head inside the target)."""
        return self.kind_row.head_group is None

    @property
    def head_missing(self) -> bool:
        """The pair drafts with the target's own head, which the target does not ship."""
        return not self.separate and (self.target.mtp is None or self.target.mtp.tensors == 0)

    @property
    def draft_name(self) -> str:
        return self.draft.ref if self.separate else f"{self.draft.ref} ({self.kind_row.title} head)"
