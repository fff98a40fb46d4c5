"""Where the checkpoints came from: pinned revisions, custom code, pickle files, catalog data."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.compat.pair import Pair
from specpair.compat.rules import ALL_KINDS, ALL_STACKS, SEPARATE_DRAFTERS, Values, rule

REMOTE_SOURCES = ("hub", "hf-cache", "catalog")


@rule(
    "revision.pinned", "warn", ALL_STACKS, SEPARATE_DRAFTERS,
    title="Hub drafters are pinned to a commit (drafter configs changed between revisions of the same repo).",
    message="{draft} is not pinned to a commit{resolved}: z-lab changed layers, taps and the mask id between revisions of the same repo, and stacks have let a draft fall back to the target's revision (sglang#5255). Pin it as {pinned}.",
    example={"resolved": " (resolved to c69b185)", "pinned": "z-lab/Qwen3.6-35B-A3B-DFlash@c69b185"},
)
def _pinned(p: Pair, stack: str) -> Iterable[Values]:
    if p.draft.source in REMOTE_SOURCES and "@" not in p.draft.ref:
        revision = p.draft.revision
        yield {"resolved": f" (resolved to {revision})" if revision else "",
               "pinned": f"{p.draft.ref}@{revision or '<commit>'}"}


@rule(
    "revision.tensorfold", "warn", ("tensorfold",), ALL_KINDS,
    title="TensorFold has no --revision: it serves whatever the default branch holds.",
    message="TensorFold has no --revision flag and serves {name} from its default branch (or the first cached snapshot): download the pinned revision first and pass the local directory.",
    example={"name": "z-lab/Qwen3.8-27B-DFlash2"},
)
def _tensorfold_revision(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint in {id(p.target): p.target, id(p.draft): p.draft}.values():
        if checkpoint.source in REMOTE_SOURCES and "@" in checkpoint.ref:
            yield {"name": checkpoint.ref}


@rule(
    "trust.remote_code", "info", ALL_STACKS, ALL_KINDS,
    title="Custom code named by auto_map is reported, never run.",
    message="{name}: {note}; no serving stack needs it to load safetensors or GGUF weights.",
    example={"name": "z-lab/Qwen3.6-35B-A3B-DFlash",
             "note": "auto_map names custom code (AutoModel=dflash.DFlashDraftModel): reported, never run"},
)
def _remote_code(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint in {id(p.target): p.target, id(p.draft): p.draft}.values():
        for note in checkpoint.notes:
            if note.startswith("auto_map"):
                yield {"name": checkpoint.ref, "note": note}


@rule(
    "trust.pickle", "warn", ALL_STACKS, ALL_KINDS,
    title="Pickle files (.bin, .pt, .pth) are reported, never loaded.",
    message="{name}: {note}; a pickle can run code when loaded — {consequence}.",
    example={"name": "org/drafter", "note": "pickle file mask_embedding.pt: reported, never loaded",
             "consequence": "SGLang and vLLM load mask_embedding.pt with torch.load; only serve it from a source you trust"},
)
def _pickle(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint in {id(p.target): p.target, id(p.draft): p.draft}.values():
        for note in checkpoint.notes:
            if note.startswith("pickle file"):
                loads = stack in ("sglang", "vllm") and "mask_embedding.pt" in note
                consequence = (f"{stack} loads mask_embedding.pt with torch.load; only serve it from a source you trust"
                               if loads else f"{stack} does not need it when safetensors weights are present")
                yield {"name": checkpoint.ref, "note": note, "consequence": consequence}


@rule(
    "catalog.source", "info", ALL_STACKS, ALL_KINDS,
    title="Facts that come from the built-in catalog, and how sure they are.",
    message="{name}: metadata from the built-in catalog ({provenance}); verify against the real files before a big download.",
    example={"name": "z-lab/Qwen3.6-35B-A3B-DFlash",
             "provenance": "reconstructed from secondary sources (SGLang test tables, model card)"},
)
def _catalog(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint in {id(p.target): p.target, id(p.draft): p.draft}.values():
        if checkpoint.source == "catalog":
            yield {"name": checkpoint.ref, "provenance": checkpoint.provenance or "provenance not recorded"}
