"""The built-in catalog as a source: known published checkpoints, answered with no network.

`lookup` reads the one small JSON file of the asked repo (never the whole catalog), because
`specpair check` falls back to it inside a 0.3 s budget. Repo ids compare case-insensitively, as
the Hub does; revisions compare as hex commit ids, full or abbreviated.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

from specpair.checkpoint import Checkpoint

SCHEMA = "specpair.catalog/1"
MIN_REVISION_PREFIX = 7  # git's shortest default abbreviation
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
HEX = re.compile(r"^[0-9a-f]+$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
NAME_SEPARATORS = re.compile(r"[\s_-]+")


def file_name(repo: str) -> str:
    """Data file of one repo: `Qwen/Qwen3-8B` -> `qwen__qwen3-8b.json`."""
    return repo.lower().replace("/", "__") + ".json"


def lookup(repo: str, revision: str | None, ref: str, gguf_file: str | None = None) -> Checkpoint | None:
    """The catalog's Checkpoint of `repo` at `revision` (None: the default entry), or None if not known; with
    `gguf_file`, the entry of that file of the repo."""
    if not REPO_ID.match(repo):
        return None
    stored = _read(file_name(repo))
    if stored is None:
        return None
    # A branch or tag (not hex) cannot be resolved offline: the newest recorded entry stands in for it.
    branch = revision is not None and not HEX.match(revision.lower())
    for data in stored["entries"]:  # default (newest) first
        if gguf_file is not None and gguf_file not in (f.get("path") for f in data.get("files", [])):
            continue
        if revision is None or branch or same_revision(revision, data.get("revision")):
            checkpoint = Checkpoint.from_json(data)
            checkpoint.ref = ref
            at = f"at revision {checkpoint.revision}" if checkpoint.revision else "(revision not recorded)"
            note = f"metadata from the built-in catalog {at} (no network)"
            if branch:
                note += f"; its newest entry stands in for {revision!r}, which cannot be resolved offline"
            checkpoint.notes.append(note)
            return checkpoint
    return None


@functools.cache  # the catalog is package data: `check` asks once per stack the rule judges, and reads it once
def drafters_named(names: tuple[str, ...]) -> tuple[Checkpoint, ...]:
    """The drafters as trained (HF checkpoints, not GGUF conversions), every revision, of the repos these names give:
    "org/name" one repo, a bare name every repo of that name. Case and runs of spaces, '-' and '_' are ignored, as
    llama.cpp's converter writes a repo's name into general.name title-cased with spaces ("Qwen3.6 35B A3B
    DFlash")."""
    wanted = {tuple(_name_key(part) for part in name.rpartition("/")[::2]) for name in names}
    found = []
    for item in sorted(resources.files("specpair.catalog").iterdir(), key=lambda i: i.name):
        org, _, name = item.name.removesuffix(".json").partition("__")
        if item.name.endswith(".json") and {(_name_key(org), _name_key(name)), ("", _name_key(name))} & wanted:
            stored = json.loads(item.read_text("utf-8"))["entries"]
            found += [Checkpoint.from_json(d) for d in stored if d["role"] == "drafter" and d["format"] != "gguf"]
    return tuple(found)


def _name_key(name: str) -> str:
    return NAME_SEPARATORS.sub("-", name.strip().lower())


def entries() -> list[Checkpoint]:
    """Every catalog entry, repos in (case-folded) name order, each repo's default entry first."""
    folder = resources.files("specpair.catalog")
    found = []
    for item in sorted(folder.iterdir(), key=lambda i: i.name.removesuffix(".json")):
        if item.name.endswith(".json"):
            found += [Checkpoint.from_json(data) for data in json.loads(item.read_text("utf-8"))["entries"]]
    return found


def is_reconstructed(checkpoint: Checkpoint) -> bool:
    """Whether an entry was rebuilt from published facts rather than parsed from a copy of its config: the catalog
    builder starts every such provenance with this word."""
    return (checkpoint.provenance or "").startswith("Reconstructed")


def is_pinned(checkpoint: Checkpoint) -> bool:
    """Whether an entry describes one commit: a full 40-hex revision. An abbreviated commit (what published facts
    often give) or none is not a pin: the Hub's files at it cannot be told from another commit's."""
    return bool(checkpoint.revision and COMMIT.match(checkpoint.revision.lower()))


def revision_label(checkpoint: Checkpoint) -> str:
    """An entry's revision as the catalog lists it: the commit when pinned, else what is recorded, said unpinned."""
    if is_pinned(checkpoint):
        return checkpoint.revision
    return f"{checkpoint.revision} (unpinned)" if checkpoint.revision else "unpinned"


def same_revision(asked: str, recorded: str | None) -> bool:
    """Equal commit ids, or one an abbreviation (at least 7 hex digits) of the other."""
    if recorded is None:
        return False
    asked, recorded = asked.lower(), recorded.lower()
    shorter, longer = sorted((asked, recorded), key=len)
    return len(shorter) >= MIN_REVISION_PREFIX and bool(HEX.match(longer)) and longer.startswith(shorter)


def _read(name: str) -> dict[str, Any] | None:
    item = resources.files("specpair.catalog").joinpath(name)
    if not item.is_file():
        return None
    return json.loads(item.read_text("utf-8"))
