"""What `check` read from a local checkpoint is kept beside the HF cache: the same files again give the same
Checkpoint from one small entry, the token list is read only for a comparison, and any change is a miss."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures import build_target

from specpair.checkpoint.tokenizer import shared_prefix_differences
from specpair.sources import local, open_checkpoint


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub" / "specpair-metadata" / "local"


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The roots whose files were read (not taken from the cache)."""
    seen: list[str] = []
    real = local.read_checkpoint

    def counting(files, *args, **kwargs):
        seen.append(files.root)
        return real(files, *args, **kwargs)

    monkeypatch.setattr(local, "read_checkpoint", counting)
    return seen


def test_the_same_files_give_the_same_checkpoint_without_reading_them(
    tmp_path: Path, cache: Path, reads: list[str]
) -> None:
    root = build_target(tmp_path / "t", "qwen3_5")
    cold = open_checkpoint(str(root))
    cached = open_checkpoint(str(root))
    assert reads == [str(root)]
    assert cached.to_json() == cold.to_json() and cached.tokenizer == cold.tokenizer
    assert cached.tokenizer.tokens is None  # not read until a comparison asks
    assert cached.tokenizer.token_list() == cold.tokenizer.tokens and reads == [str(root)]
    assert sorted(p.name.endswith(".tokens.json") for p in cache.iterdir()) == [False, True]


def test_token_comparisons_agree_cold_and_cached(tmp_path: Path, cache: Path) -> None:
    a, b = build_target(tmp_path / "a", "qwen3_5"), build_target(tmp_path / "b", "qwen3")
    cold = shared_prefix_differences(open_checkpoint(str(a)).tokenizer, open_checkpoint(str(b)).tokenizer)
    cached = shared_prefix_differences(open_checkpoint(str(a)).tokenizer, open_checkpoint(str(b)).tokenizer)
    assert cold == cached and cold > 0


@pytest.mark.parametrize("damage", ["removed", "truncated", "another entry's"])
def test_a_missing_or_foreign_token_file_reads_the_checkpoint_again(
    tmp_path: Path, cache: Path, reads: list[str], damage: str
) -> None:
    root = build_target(tmp_path / "t", "qwen3_5")
    other = build_target(tmp_path / "o", "qwen3_5")
    expected = open_checkpoint(str(root)).tokenizer.tokens
    (ours,) = cache.glob("*.tokens.json")
    open_checkpoint(str(other))
    (theirs,) = set(cache.glob("*.tokens.json")) - {ours}
    if damage == "removed":
        ours.unlink()
    elif damage == "truncated":
        ours.write_bytes(ours.read_bytes()[:100])
    else:
        ours.write_bytes(theirs.read_bytes())  # the same tokens, marked for the other checkpoint's entry
    cached = open_checkpoint(str(root))
    assert reads == [str(root), str(other)]
    assert cached.tokenizer.token_list() == expected and reads == [str(root), str(other), str(root)]


def test_a_changed_file_is_a_miss(tmp_path: Path, cache: Path, reads: list[str]) -> None:
    root = build_target(tmp_path / "t", "qwen3_5")
    open_checkpoint(str(root))
    config = root / "config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    open_checkpoint(str(root))
    assert reads == [str(root), str(root)]
