"""Which drafter module loads a checkpoint: by its DrafterConfig kind; a plain model is a draft model; no
checkpoint at all is the target's own MTP head. Each kind's row (checkpoint/families.py) names its module."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from specpair import runtime
from specpair.checkpoint import families
from specpair.runtime.drafters import Drafter
from specpair.runtime.model import Transformer
from specpair.sources.model import Model


def _loader(where: str) -> Callable[[Model, Transformer, int | None], Drafter]:
    """The `load` of the class a row's `runtime` names ("module:Class")."""
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name).load


LOADERS = {kind: _loader(families.DRAFTER_KINDS[kind].runtime) for kind in runtime.AVAILABLE.drafter_kinds}


def drafter_kind(draft: Model | None) -> str:
    """The pair's drafter kind with `draft` as its drafter (None: the target's own head)."""
    own = draft.config.drafter.kind if draft is not None and draft.config.drafter is not None else None
    return families.drafter_kind(own, draft is not None)


def load_drafter(draft: Model | None, target_model: Model, target: Transformer, bits: int | None = None) -> Drafter:
    """The drafter in `draft` (None: the MTP head in `target_model`) beside `target`, loaded from `target_model`."""
    kind = drafter_kind(draft)
    return LOADERS[kind](target_model if draft is None else draft, target, bits)
