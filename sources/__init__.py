"""Where checkpoint metadata comes from: a local directory or GGUF file, a Hub repo, the built-in catalog.

`open_checkpoint` resolves what the user typed to one of them; every one is read by the same code
(sources/reading.py), so a local directory and the Hub repo it was downloaded from give the same answer.
"""

from __future__ import annotations

import os

from specpair.checkpoint import Checkpoint
from specpair.errors import BadInput
from specpair.sources.reading import MAX_CONFIG_BYTES, MAX_TOKENIZER_BYTES, REPO_ID, read_json

__all__ = ["MAX_CONFIG_BYTES", "MAX_TOKENIZER_BYTES", "REPO_ID", "open_checkpoint", "read_json"]


def open_checkpoint(ref: str, gguf_file: str | None = None, offline: bool | None = None) -> Checkpoint:
    """Resolve what the user typed: a local path first, then `org/name[@revision]` on the Hub."""
    from specpair.sources import local

    path = os.path.expanduser(ref)
    if os.path.exists(path):
        return local.open_local(path, ref, gguf_file)
    if ref.endswith(".gguf") or ref.startswith((".", "/", "~")):
        raise BadInput(ref, "no such file or directory")
    repo, _, revision = ref.partition("@")
    if not REPO_ID.match(repo) or (revision == "" and "@" in ref):
        raise BadInput(ref, "not a local path nor a Hub repo id of the form org/name[@revision]")
    from specpair.sources import hub

    return hub.open_repo(repo, revision or None, ref, gguf_file, offline)
