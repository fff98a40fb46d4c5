"""Which drafter module loads a checkpoint: by its DrafterConfig kind; a plain model is a draft model; no
checkpoint at all is the target's own MTP head."""

from __future__ import annotations

from specpair.runtime.drafters import Drafter
from specpair.runtime.drafters.dflash import DFlash
from specpair.runtime.drafters.draft_model import DraftModel
from specpair.runtime.drafters.eagle3 import Eagle3
from specpair.runtime.drafters.mtp import MTP
from specpair.runtime.model import Transformer
from specpair.sources.model import Model

LOADERS = {
    "dflash": DFlash.load,
    "dflash2": DFlash.load,
    "eagle3": Eagle3.load,
    "mtp": MTP.load,
    "draft_model": DraftModel.load,
}


def drafter_kind(draft: Model | None) -> str:
    if draft is None:
        return "mtp"
    return draft.config.drafter.kind if draft.config.drafter is not None else "draft_model"


def load_drafter(draft: Model | None, target_model: Model, target: Transformer, bits: int | None = None) -> Drafter:
    """The drafter in `draft` (None: the MTP head in `target_model`) beside `target`, loaded from `target_model`."""
    kind = drafter_kind(draft)
    return LOADERS[kind](target_model if draft is None else draft, target, bits)
