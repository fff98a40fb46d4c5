"""The vllm-project/speculators drafter format, both ways: read as the config vLLM builds from it, written from a
drafter's own config.

A speculators config holds the drafter's decoder config under `transformer_layer_config`, its kind's keys at the
top level and `speculators_config{algorithm, proposal_methods, default_proposal_method, verifier{name_or_path,
architectures}}`: the verifier the drafter was made for, which `vllm serve DRAFT` loads as the target. Reading
mirrors vLLM's SpeculatorsConfig (vllm/transformers_utils/configs/speculators/base.py and algos.py): its
structure checks, then the kind's keys over the transformer config, the taps where vLLM puts them. Writing
produces what speculators 0.9.0's converters write (src/speculators/convert/dflash/converter.py,
convert/eagle/eagle3_converter.py). The per-kind facts are the drafter-kind rows' `speculators` (families.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specpair.checkpoint.families import DRAFTER_BY_SPECULATORS_TYPE, DRAFTER_KINDS, DSPARK, EAGLE_NORMS, DrafterKind
from specpair.errors import BadInput
from specpair.formats import brief
from specpair.formats.transforms import TensorMap

if TYPE_CHECKING:
    from specpair.checkpoint.config import DrafterConfig

# Its tap id j is the residual stream entering decoder layer j: the output of layer j - 1 (families.py
# SpeculatorsSchema); specpair's taps are "output of layer k".
TAP_SHIFT = -1
PROPOSAL = "greedy"  # the proposal method speculators' converters write (proposals/greedy.py)


@dataclass(frozen=True)
class Verifier:
    """The target a speculators-format drafter pins."""

    name_or_path: str
    architectures: tuple[str, ...]


def is_speculators(config: dict[str, Any]) -> bool:
    """Whether a config.json is in the speculators format (vLLM's test: a `speculators_config` key)."""
    return config.get("speculators_config") is not None


def read(config: dict[str, Any], where: str) -> tuple[dict[str, Any], Verifier, DrafterKind]:
    """The config vLLM builds from a speculators config (the kind's own schema), the verifier it pins, its kind.
    A structure vLLM refuses is refused here, in one line naming the key."""
    spec = config["speculators_config"]
    model_type = config.get("speculators_model_type")
    kind = DRAFTER_BY_SPECULATORS_TYPE.get(model_type) if isinstance(model_type, str) else None
    if kind is None:
        known = ", ".join(DRAFTER_BY_SPECULATORS_TYPE)
        what = f"speculators_model_type {brief(model_type)} is not one specpair reads ({known})"
        if model_type == DSPARK.speculators_type:
            what += f": a {DSPARK.title} drafter, which vLLM serves with {DSPARK.methods['vllm']}"
        raise BadInput(where, what)
    schema = kind.speculators
    if not isinstance(spec, dict):
        raise BadInput(where, f"'speculators_config' is {brief(spec)}, not an object")
    methods = spec.get("proposal_methods")
    if not (isinstance(methods, list) and methods and isinstance(methods[0], dict)):
        raise BadInput(where, f"'speculators_config.proposal_methods' is {brief(methods)}, not a list of objects")
    tokens = methods[0].get("speculative_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        given = "missing" if tokens is None else brief(tokens)
        raise BadInput(where, f"'speculators_config.proposal_methods[0].speculative_tokens' is {given}, not a count")
    verifier = spec.get("verifier")
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    if not isinstance(name, str) or not name:
        raise BadInput(where, "'speculators_config.verifier.name_or_path' is missing: the drafter pins no verifier")
    archs = verifier.get("architectures") or []
    if not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise BadInput(where, f"'speculators_config.verifier.architectures' is {brief(archs)}, not a list of strings")
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        given = "missing" if layer is None else brief(layer)
        raise BadInput(where, f"'transformer_layer_config' is {given}, not an object")
    built = {**layer, **{k: config[k] for k in schema.keys if config.get(k) is not None}}
    for key, value in schema.defaults.items():
        built.setdefault(key, value)
    if "block_size" in schema.keys:  # vLLM drafts the proposal's tokens a round, after the anchor
        built.setdefault("block_size", tokens + 1)
    built["architectures"] = [schema.read_as]
    taps = config.get(schema.taps_key)
    if taps is not None:
        if not (isinstance(taps, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in taps)):
            raise BadInput(where, f"'{schema.taps_key}' is {brief(taps)}, not a list of integers")
        _put(built, schema.taps_into, [i + schema.taps_offset for i in taps])
    for key in schema.block_keys:
        if key in built:
            _put(built, f"{kind.config_block}.{key}", built.pop(key))
    return built, Verifier(name, tuple(archs)), kind


def write(config: dict[str, Any], drafter: DrafterConfig, block_size: int, verifier: Verifier) -> dict[str, Any]:
    """A drafter's config in the speculators format: `config` its own config.json, `drafter` what specpair read
    from it (taps as "output of layer k"), `block_size` the tokens a round verifies, `verifier` its target."""
    kind = DRAFTER_KINDS[drafter.kind]
    schema, block = kind.speculators, kind.config_block
    own = {*schema.keys, *kind.config_markers, *kind.own_keys, schema.taps_key, "num_target_layers", "auto_map", block}
    layer = {k: v for k, v in config.items() if k not in own and k != "architectures"}
    out: dict[str, Any] = {k: v for k, v in config.items() if k != "auto_map"} if schema.native_beside else {}
    out.update(
        {
            "architectures": [schema.architecture],
            "speculators_model_type": schema.model_type,
            "transformer_layer_config": layer,
        }
    )
    values = {
        **dataclasses.asdict(drafter),
        "block_size": block_size,
        "draft_vocab_size": drafter.draft_vocab_size or layer.get("vocab_size"),
        **{key: key in drafter.eagle_norms for key in EAGLE_NORMS},
    }
    out.update({k: values[k] for k in schema.keys if values.get(k) is not None})
    out[schema.taps_key] = [k - TAP_SHIFT for k in drafter.target_layer_ids]
    out["speculators_config"] = {
        "algorithm": schema.model_type,
        "proposal_methods": [
            {
                "proposal_type": PROPOSAL,
                "speculative_tokens": block_size - 1,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "default_proposal_method": PROPOSAL,
        "verifier": {"name_or_path": verifier.name_or_path, "architectures": list(verifier.architectures)},
    }
    return out


def _put(config: dict[str, Any], path: str, value: object) -> None:
    """Set "block.key" (creating the block) or a top-level key."""
    block, _, key = path.rpartition(".")
    holder = config.setdefault(block, {}) if block else config
    holder[key] = value


def tensor_maps(
    kind: DrafterKind, shapes: dict[str, tuple[int, ...]], vocab_rows: int, where: str
) -> tuple[list[TensorMap], list[str]]:
    """Its tensors in the kind's own names (the row's renames), less the verifier's copies, which specpair takes
    from the target; and a note saying so. A reduced vocabulary on a kind that drafts over the target's own is
    refused: its head is then its own, not the verifier's; so is a copy whose rows are not the vocabulary's
    (`vocab_rows`, the verifier's), which would otherwise be dropped for the target's head unseen."""
    schema = kind.speculators
    if not kind.reduced_vocabulary and "d2t" in shapes:
        raise BadInput(
            where,
            f"is a reduced-vocabulary {kind.title} (d2t): specpair's {kind.title} drafts over the target's vocabulary",
        )
    for name in schema.verifier_tensors:
        shape = shapes.get(name)
        if shape is not None and len(shape) == 2 and shape[0] != vocab_rows:
            raise BadInput(
                where,
                f"ships {name} of {shape[0]} rows, not its vocabulary's {vocab_rows}: a head of its own, not the "
                f"verifier's copy, and specpair's {kind.title} drafts through the target's",
            )
    copies = [n for n in shapes if n in schema.verifier_tensors or (n == "t2d" and not kind.reduced_vocabulary)]
    maps = []
    for name, shape in shapes.items():
        if name in copies:
            continue
        renamed = next((new + name[len(old) :] for old, new in schema.renames if name.startswith(old)), name)
        maps.append(TensorMap(renamed, shape, (name,)))
    notes = (
        [f"speculators format: {', '.join(copies)} (the verifier's copies) not read: the target's own are used"]
        if copies
        else []
    )
    return maps, notes
