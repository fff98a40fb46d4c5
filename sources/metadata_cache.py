"""What `check` read from a local checkpoint, kept beside the HF cache so that reading the same files again costs
one small JSON file instead of ~25 MB of headers and tokenizer (a MoE export that stores every expert apart).

An entry lives in `<HF_HUB_CACHE>/specpair-metadata/local/<hash of the directory>.json` and holds the
Checkpoint and for every file of the directory its (device, inode, size, mtime) as the file system reports them
now. The tokenizer's token list (~250,000 strings, most of what reading an entry would cost) sits beside it in
`<hash>.tokens.json`, marked with the hash of the entry it belongs to, and is read only when a comparison of two
token lists needs it. It is used only when the directory lists exactly those files with
exactly those keys, and when specpair's reading code is the one that wrote it; any difference, or an entry that
does not parse, is a miss and the files are read again. Entries are data, never code.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Callable
from typing import Any

import orjson

from specpair.checkpoint import Checkpoint

SCHEMA = "specpair.local-metadata/2"
FOLDER = os.path.join("specpair-metadata", "local")
CODE_DIRECTORIES = ("checkpoint", "formats", "sources")  # the code that turns files into a Checkpoint


def cached(
    root: str,
    listed: list[str],
    gguf_file: str | None,
    ref: str,
    read: Callable[[], Checkpoint],
    named_file: bool = False,
) -> Checkpoint:
    """The Checkpoint of the directory `root` (files `listed`, relative): from the cache when every file is as it
    was, else `read()`, then kept for next time. `named_file`: one .gguf file named on the command line, read by
    other rules than a checkpoint directory's files (its symlinks followed), so never the same entry."""
    from specpair.sources.settings import settings_from_env, write_atomic

    real = os.path.realpath(root)
    keys = _file_keys(real, listed)
    if keys is None:
        return read()
    key = f"{real}\0{gguf_file}\0{named_file}".encode("utf-8", "surrogatepass")
    path = os.path.join(settings_from_env(None).cache_dir, FOLDER, hashlib.sha256(key).hexdigest() + ".json")
    identity = {
        "schema": SCHEMA,
        "root": real,
        "gguf_file": gguf_file,
        "named_file": named_file,
        "code": _code_key(),
        "files": keys,
    }
    tokens_path = path.removesuffix(".json") + ".tokens.json"
    found = _load(path, identity)
    if found is not None:
        found.ref = ref
        if found.tokenizer is not None:
            found.tokenizer.load_tokens = functools.partial(
                _tokens, tokens_path, identity, found.tokenizer.length, read
            )
        return found
    checkpoint = read()
    tokens = checkpoint.tokenizer.token_list_json() if checkpoint.tokenizer else None
    with contextlib.suppress(OSError, TypeError):  # a cache that cannot be written only costs the next run a read
        if tokens is not None:  # before the entry: an entry found always has its tokens written
            kept = {"entry": _identity_hash(identity), "tokens": orjson.Fragment(tokens)}
            write_atomic(tokens_path, orjson.dumps(kept))
        write_atomic(path, orjson.dumps({**identity, "checkpoint": checkpoint.to_json()}))
    return checkpoint


def _load(path: str, identity: dict[str, Any]) -> Checkpoint | None:
    try:
        with open(path, "rb") as f:
            entry = orjson.loads(f.read())
        if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in identity.items()):
            return None
        return Checkpoint.from_json(entry["checkpoint"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _tokens(path: str, identity: dict[str, Any], length: int, read: Callable[[], Checkpoint]) -> list[str] | None:
    """The token list kept for the entry of `identity`; when that file is gone, damaged or another entry's, the
    checkpoint's files are read again."""
    try:
        with open(path, "rb") as f:
            kept = orjson.loads(f.read())
        tokens = kept["tokens"]
        if kept["entry"] == _identity_hash(identity) and len(tokens) == length and not set(map(type, tokens)) - {str}:
            return tokens
    except (OSError, ValueError, TypeError, KeyError):
        pass
    tokenizer = read().tokenizer
    return tokenizer.token_list() if tokenizer else None


def _identity_hash(identity: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(identity)).hexdigest()


def _file_keys(root: str, listed: list[str]) -> dict[str, list[int]] | None:
    keys = {}
    for name in listed:
        try:
            st = os.stat(os.path.join(root, name))
        except (OSError, ValueError):
            return None  # a file that cannot be looked at is one the reader will name in its error
        keys[name] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
    return keys


def _code_key() -> list[list[Any]]:
    """Size and mtime of every module of the reading code: an entry from another version (or an edited checkout)
    is a miss."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    key = []
    for directory in CODE_DIRECTORIES:
        folder = os.path.join(package, directory)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                st = os.stat(os.path.join(folder, name))
                key.append([directory, name, st.st_size, st.st_mtime_ns])
    return key
