"""A target drafting with its own MTP head: the head is declared and its weights shipped."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_STACKS,
    HEAD_DRAFTERS,
    Values,
    rule,
)


@rule(
    "mtp.present",
    "error",
    ALL_STACKS,
    HEAD_DRAFTERS,
    title="A target used as its own MTP drafter declares MTP layers and still ships their weights.",
    message="{target} {problem}, so it has no MTP head to draft with; {what}.",
    example={
        "problem": "declares 1 MTP layer in its config but ships no mtp.* tensors",
        "what": "use a checkpoint that keeps the MTP weights (quantizers and converters often drop them)",
    },
)
def _mtp(p: Pair, stack: str) -> Iterable[Values]:
    mtp = p.target.mtp
    if mtp is None:
        yield {
            "problem": "declares no MTP layers (mtp_num_hidden_layers / num_nextn_predict_layers)",
            "what": "pair it with a separate drafter",
        }
    elif mtp.tensors == 0:
        yield {
            "problem": f"declares {mtp.layers} MTP layer(s) in its config but ships no MTP tensors",
            "what": "use a checkpoint that keeps the MTP weights (quantizers and converters often drop them)",
        }
