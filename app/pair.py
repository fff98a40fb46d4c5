"""Which pair the gate runs: TARGET DRAFT, TARGET --mtp (its own MTP head), a specpair.lock (the pair it pins),
or the built-in demo pair."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specpair.app.progress import SILENT, Progress
from specpair.errors import BadInput

if TYPE_CHECKING:
    from specpair.checkpoint import Checkpoint
    from specpair.sources.lockfile import LockedRepo
    from specpair.sources.model import Model

# --demo on a CPU: six settings at 18-60 tok/s on 2 cores (bf16), under a minute in all; 16 let the prefill (shared by
# both ways) hold a third of each run
DEMO_CPU_MAX_TOKENS = 32


@dataclass
class GatePair:
    target: str | Model  # a checkpoint's ref, or one opened already (sources/model.open_files)
    draft: str | Model | None  # None: the target's own MTP head
    locked: dict[str, LockedRepo] = field(default_factory=dict)  # role -> what a specpair.lock pins
    tile_block: int | None = None  # the demo drafter's: on a CPU, its block fills a product tile (convert/demo.py)


def gate_pair(
    target: str | Model | None,
    draft: str | Model | None,
    *,
    mtp: bool = False,
    demo: bool = False,
    progress: Progress = SILENT,
) -> GatePair:
    """The refs the gate opens, refused with a one-line BadInput when the arguments do not name one pair."""
    if demo:
        return demo_pair(target, draft, mtp, progress)
    if target is None:
        raise BadInput("TARGET", "give a target checkpoint (or --demo for the built-in pair)")
    locked = {}
    if isinstance(target, str) and target.endswith(".lock") and draft is None:
        from specpair.sources.lockfile import read_lock

        locked = {r.role: r for r in read_lock(target)}
        target = locked["target"].directory
        draft = locked["draft"].directory if "draft" in locked else None
    if mtp and draft is not None:
        raise BadInput("--mtp", "drafts with the target's own MTP head: give no DRAFT with it")
    if draft is None and not mtp:
        raise BadInput("DRAFT", "give a drafter or draft model, or --mtp for the target's own MTP head")
    return GatePair(target, draft, locked)


def opened(ref: str | Model, gguf_file: str | None = None) -> Model:
    """The checkpoint as the runtime reads it: `ref` opened, or the Model given."""
    from specpair.sources.model import open_model

    return open_model(ref, gguf_file) if isinstance(ref, str) else ref


def metadata(ref: str | Model, gguf_file: str | None = None) -> Checkpoint:
    """The checkpoint as `specpair check` judges it (offline), from what `ref` names or from the Model's files."""
    from specpair.sources import open_checkpoint

    return open_checkpoint(ref, gguf_file, True) if isinstance(ref, str) else ref.checkpoint()


def demo_pair(name: str | None, draft: str | None, mtp: bool, progress: Progress) -> GatePair:
    """The built-in pair: SmolLM2-135M-Instruct and the demo drafter `name` (`--demo NAME`: NAME arrives as TARGET;
    None: the DFlash drafter shipped in demo/), a converted one written once."""
    from specpair.convert.demo import demo_pair as demo_files
    from specpair.convert.demo import drafter

    if draft or mtp:
        raise BadInput("--demo", "runs the built-in SmolLM2 pair: give no TARGET, DRAFT or --mtp with it")
    chosen = drafter(name)
    progress.stage(f"setting up the demo pair (SmolLM2-135M-Instruct, {chosen.describe})")
    target, draft = demo_files(name)
    return GatePair(target, draft, tile_block=chosen.tile_block)
