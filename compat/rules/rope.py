"""RoPE and context length: the drafter's trained length, positions, YaRN, config schema."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint.families import BLOCK, CHAIN, TAPS
from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_KINDS,
    ALL_STACKS,
    BLOCK_DRAFTERS,
    SEPARATE_DRAFTERS,
    Values,
    rule,
)


@rule(
    "rope.context",
    "warn",
    ALL_STACKS,
    SEPARATE_DRAFTERS,
    title="The serving context stays within what the drafter was trained for.",
    message="You serve {target} at {context} tokens, but {draft} {limit}: past that its positions are extrapolated and acceptance falls (speculators#613; vllm#58080 drafted token 0 past the draft's max positions). Serve at --context {safe} or use a drafter trained longer.",
    example={"context": 65536, "limit": "was trained at 4096 tokens (max_position_embeddings 40960)", "safe": 4096},
)
def _context(p: Pair, stack: str) -> Iterable[Values]:
    rope = p.draft.rope
    trained, max_positions = rope.trained_context, rope.max_position_embeddings
    if trained and p.context > trained:
        limit = f"was trained at {trained} tokens" + (
            f" (max_position_embeddings {max_positions})" if max_positions else ""
        )
        yield {"context": p.context, "limit": limit, "safe": trained}
    elif max_positions and p.context > max_positions:
        yield {"context": p.context, "limit": f"has max_position_embeddings {max_positions}", "safe": max_positions}


@rule(
    "rope.target_context",
    "error",
    ALL_STACKS,
    ALL_KINDS,
    title="The serving context stays within the target's own max positions.",
    message="--context {context} exceeds {target}'s max_position_embeddings {max_positions}.",
    example={"context": 524288, "max_positions": 262144},
)
def _target_context(p: Pair, stack: str) -> Iterable[Values]:
    limit = p.target.rope.max_position_embeddings
    if p.deployment.context and limit and p.deployment.context > limit and not p.target.rope.scaling:
        yield {"context": p.deployment.context, "max_positions": limit}


@rule(
    "rope.scaling",
    "warn",
    ALL_STACKS,
    ALL_KINDS,
    title="A drafter that shares the target's positions uses the same RoPE scaling (YaRN), and one reading the "
    "target's features its theta.",
    message="{target} uses {target_rope} RoPE but {draft} uses {draft_rope}: {consequence}",
    example={
        "target_rope": "yarn (factor 4)",
        "draft_rope": "default",
        "consequence": "past the draft's native length its positions disagree with the target's (Automodel#2399).",
    },
)
def _scaling(p: Pair, stack: str) -> Iterable[Values]:
    target_type = p.target.rope.rope_type or "default"
    if not p.separate:
        if stack == "vllm" and p.target.rope.scaling:
            yield {
                "target_rope": target_type,
                "draft_rope": "the MTP head's own config",
                "consequence": "vLLM does not pass --hf-overrides YaRN to the MTP draft (vllm#58080): set it in the config itself.",
            }
        return
    draft_type = p.draft.rope.rope_type or "default"
    theta_differs = TAPS in p.kind_row.reads and p.draft.rope.theta and p.draft.rope.theta != p.target.rope.theta
    if p.kind_row.drafting == BLOCK and theta_differs:
        consequence = (
            "its rotary frequencies are not those of the features it reads. A converter that reads only a top-level "
            "rope_theta, where the drafter's config keeps it in rope_parameters, writes a default instead "
            "(lucebox#447: 1e6 for 1e7); acceptance falls with context. Convert it again from its own config."
        )
    elif p.kind_row.drafting == CHAIN and (theta_differs or draft_type != target_type):
        consequence = "the drafter places tokens at other positions than the target; acceptance drops with length."
    else:  # a block drafter's positions are its own: only the theta of the features it reads must be the target's
        return
    yield {
        "target_rope": f"{target_type} (theta {p.target.rope.theta:g})" if p.target.rope.theta else target_type,
        "draft_rope": f"{draft_type} (theta {p.draft.rope.theta:g})" if p.draft.rope.theta else draft_type,
        "consequence": consequence,
    }


@rule(
    "rope.schema",
    "error",
    ("tensorfold",),
    BLOCK_DRAFTERS,
    title="TensorFold's DFlash loader reads rope_parameters.rope_theta (the transformers-5 schema).",
    message="TensorFold reads rope_parameters.rope_theta, but {draft} gives RoPE as {schema} (its loader raises KeyError); move it to rope_parameters.rope_theta = {theta} (rope_type 'default').",
    example={"schema": "a top-level rope_theta", "theta": "1e+07"},
)
def _schema(p: Pair, stack: str) -> Iterable[Values]:
    rope = p.draft.rope
    if p.draft.format != "gguf" and rope.schema != "rope_parameters":
        schema = "a top-level rope_theta" if rope.schema == "rope_theta" else "no rope key"
        yield {"schema": schema, "theta": f"{rope.theta:g}" if rope.theta else "<theta>"}
