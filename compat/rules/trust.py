"""What to trust in a checkpoint's files: custom code, pickles, interrupted downloads, catalog facts."""

from __future__ import annotations

from collections.abc import Iterable

from specpair.checkpoint import Checkpoint
from specpair.checkpoint.families import MASK_PICKLE, OWN_STACK
from specpair.checkpoint.hf import PICKLE_WEIGHTS_NOTE, from_pickle_command
from specpair.compat.field_reports import FIELD_REPORTS
from specpair.compat.pair import Pair
from specpair.compat.rules.table import (
    ALL_KINDS,
    ALL_STACKS,
    Values,
    rule,
)
from specpair.compat.stacks import fetch_step


def _notes(p: Pair, prefix: str) -> Iterable[tuple[Checkpoint, str]]:
    """(checkpoint, note) for the reading notes that start with `prefix` (notes come from checkpoint/hf.py)."""
    for checkpoint in p.checkpoints:
        for note in checkpoint.notes:
            if note.startswith(prefix):
                yield checkpoint, note


@rule(
    "trust.remote_code",
    "info",
    ALL_STACKS,
    ALL_KINDS,
    title="Custom code named by auto_map is reported, never run.",
    message="{name}: {note}; no serving stack needs it to load safetensors or GGUF weights.",
    example={
        "name": "z-lab/Qwen3.6-35B-A3B-DFlash",
        "note": "auto_map names custom code (AutoModel=dflash.DFlashDraftModel): reported, never run",
    },
)
def _remote_code(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint, note in _notes(p, "auto_map"):
        yield {"name": checkpoint.ref, "note": note}


@rule(
    "trust.pickle",
    "warn",
    ALL_STACKS,
    ALL_KINDS,
    title="Pickle files (.bin, .pt, .pth) are reported, never loaded.",
    message="{name}: {note}; a pickle can run code when loaded — {consequence}.",
    example={
        "name": "org/drafter",
        "note": "pickle file mask_embedding.pt: reported, never loaded",
        "consequence": "SGLang and vLLM load mask_embedding.pt with torch.load; only serve it from a source you trust",
    },
)
def _pickle(p: Pair, stack: str) -> Iterable[Values]:
    row, serves = p.kind_row.mask_embedding, p.serves(stack)
    for checkpoint, note in _notes(p, "pickle file"):
        mask = row is not None and checkpoint is p.draft and note.startswith(f"pickle file {row.pickle}:")
        if mask and serves and MASK_PICKLE in serves.mask_embedding:
            consequence = f"{stack} loads {row.pickle} with torch.load; only serve it from a source you trust"
        elif mask:
            consequence = f"{stack} never loads it (mask.embedding_unread says what that costs)"
        elif any(n.startswith(PICKLE_WEIGHTS_NOTE) for n in checkpoint.notes):
            consequence = (
                f"its weights are pickles only: `{from_pickle_command(checkpoint.ref)}` makes a safetensors copy "
                "through torch's weights-only loader"
            )
        else:
            consequence = f"{stack} does not need it when safetensors weights are present"
        yield {"name": checkpoint.ref, "note": note, "consequence": consequence}


def _pickle_weights_fix(p: Pair, stack: str) -> list[str] | None:
    """A Hub drafter downloaded first (convert reads local files), then copied to safetensors."""
    steps = []
    for checkpoint, _ in _notes(p, PICKLE_WEIGHTS_NOTE):
        steps += [step for step in (fetch_step(checkpoint), from_pickle_command(checkpoint.ref)) if step]
    return steps or None


@rule(
    "trust.pickle_weights",
    "error",
    (OWN_STACK,),
    ALL_KINDS,
    title="Weights are in safetensors files: specpair never unpickles a checkpoint on its own.",
    message="{name}: {note}; specpair loads safetensors only and unpickles nothing unless asked: make a safetensors copy with `{command}` (torch's weights-only loader: tensors only, anything else refused) and use the copy.",
    example={
        "name": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "note": "pickle weights only (pytorch_model.bin): no .safetensors weights",
        "command": "specpair convert yuhuili/EAGLE3-LLaMA3.1-Instruct-8B EAGLE3-LLaMA3.1-Instruct-8B-safetensors --from-pickle",
    },
    fix=_pickle_weights_fix,
)
def _pickle_weights(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint, note in _notes(p, PICKLE_WEIGHTS_NOTE):
        yield {"name": checkpoint.ref, "note": note, "command": from_pickle_command(checkpoint.ref)}


@rule(
    "trust.incomplete",
    "warn",
    ALL_STACKS,
    ALL_KINDS,
    title="No interrupted-download leftovers (*.incomplete) sit in a checkpoint directory.",
    message="{name}: {note}; the download did not finish (hf download can exit 0 with incomplete blobs, hf_hub#4223): fetch it again and verify its hashes before serving.",
    example={
        "name": "./Qwen3.6-35B-A3B",
        "note": "incomplete download model-00003-of-00014.safetensors.incomplete: a transfer was interrupted here",
    },
)
def _incomplete(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint, note in _notes(p, "incomplete download"):
        yield {"name": checkpoint.ref, "note": note}


@rule(
    "trust.catalog",
    "info",
    ALL_STACKS,
    ALL_KINDS,
    title="Facts that come from the built-in catalog, and how sure they are.",
    message="{name}: metadata from the built-in catalog ({provenance}; `specpair catalog --json` has the details); verify against the real files before a big download.",
    example={
        "name": "z-lab/Qwen3.6-35B-A3B-DFlash",
        "provenance": "reconstructed from secondary sources (SGLang test tables, model card)",
    },
)
def _catalog(p: Pair, stack: str) -> Iterable[Values]:
    for checkpoint in p.checkpoints:
        if checkpoint.source == "catalog":
            first_sentence = (checkpoint.provenance or "provenance not recorded").split(". ")[0].rstrip(".")
            yield {"name": checkpoint.ref, "provenance": first_sentence}


@rule(
    "trust.field_report",
    "info",
    tuple(dict.fromkeys(r.stack for r in FIELD_REPORTS)),
    ALL_KINDS,
    title="Acceptance reported from the field for this published checkpoint on this stack.",
    message="{name} on {stack}: {finding} ({source}).",
    example={
        "name": "z-lab/Qwen3.5-122B-A10B-DFlash",
        "finding": "2-12 % of drafts accepted beside a UD-Q4_K_XL target",
        "source": "z-lab/dflash#152, open, no cause found as of 2026-08",
    },
)
def _field_report(p: Pair, stack: str) -> Iterable[Values]:
    repos = {c.ref.partition("@")[0].lower(): c.ref.partition("@")[0] for c in p.checkpoints}
    for report in (r for r in FIELD_REPORTS if r.stack == stack):
        for name in (repos[repo.lower()] for repo in report.repos if repo.lower() in repos):
            yield {"name": name, "finding": report.finding, "source": report.source}
