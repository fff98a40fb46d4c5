"""Hub source: metadata over HTTP from real servers on 127.0.0.1, never tensor data.

`olah` (a Hub mirror serving local git repos) covers the normal path; `hubserver.FakeHub` covers
what olah lacks: file sizes and LFS hashes, Range requests, and the Hub's error answers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hubserver import FakeHub, git_blob_id, olah_cli, start_olah
from safetensors.numpy import save as safetensors_bytes

from specpair.checkpoint import Checkpoint
from specpair.errors import BadInput
from specpair.sources import MAX_CONFIG_BYTES, open_checkpoint
from specpair.sources.hub import GGUF_FIRST_READ, SAFETENSORS_FIRST_READ

HF_VARIABLES = (
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_TOKEN",
    "XDG_CACHE_HOME",
)
MIB = 1 << 20

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "intermediate_size": 1024,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


# ---------------------------------------------------------------- tiny checkpoints


def tokenizer_json() -> bytes:
    vocab = {"a": 0, "b": 1, "ab": 2}
    added = [{"id": 3, "content": "<|endoftext|>", "special": True}]
    return json.dumps(
        {"version": "1.0", "model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]}, "added_tokens": added}
    ).encode()


def tiny_checkpoint() -> dict[str, bytes]:
    """config.json, tokenizer.json and one small model.safetensors."""
    tensors = {
        "model.embed_tokens.weight": np.zeros((128, 64), np.float16),
        "model.layers.0.self_attn.q_proj.weight": np.ones((64, 64), np.float16),
        "lm_head.weight": np.zeros((128, 64), np.float16),
    }
    return {
        "config.json": json.dumps(CONFIG).encode(),
        "tokenizer.json": tokenizer_json(),
        "model.safetensors": safetensors_bytes(tensors),
    }


def sharded_checkpoint() -> dict[str, bytes]:
    """Two shards with an index, each carrying 4 MiB of tensor data behind a small header."""
    shards = {
        "model-00001-of-00002.safetensors": {
            "model.embed_tokens.weight": np.zeros((128, 64), np.float16),
            "model.layers.0.mlp.up_proj.weight": np.zeros((1024, 1024), np.float32),
        },
        "model-00002-of-00002.safetensors": {
            "lm_head.weight": np.zeros((128, 64), np.float16),
            "model.layers.1.mlp.up_proj.weight": np.zeros((1024, 1024), np.float32),
        },
    }
    weight_map = {name: shard for shard, tensors in shards.items() for name in tensors}
    files = {shard: safetensors_bytes(tensors) for shard, tensors in shards.items()}
    files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    files["config.json"] = json.dumps(CONFIG).encode()
    return files


def gguf_checkpoint(path: Path, tokens: int) -> bytes:
    """A qwen3 GGUF whose header (token list) and data section (token_embd, f32) both grow with `tokens`."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_block_count(2)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(16)
    writer.add_value_length(16)
    writer.add_rope_freq_base(1e6)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i:07d}" for i in range(tokens)])
    writer.add_token_types([1] * tokens)
    writer.add_tensor("token_embd.weight", np.zeros((tokens, 64), np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def comparable(checkpoint: Checkpoint) -> dict:
    """Checkpoint fields that must not depend on where the files were read from."""
    data = checkpoint.to_json()
    for key in ("ref", "source", "revision", "files", "notes"):
        data.pop(key)
    return data


# ---------------------------------------------------------------- servers and environment


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_hub: FakeHub) -> Path:
    """A fresh HF_HOME, HF_ENDPOINT on the fake Hub, no token, online."""
    for name in HF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specpair", *args], env=env, capture_output=True, text=True, timeout=60
    )


def cli_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in HF_VARIABLES}
    return {**env, **values}


# ---------------------------------------------------------------- online: the fake Hub


def test_hub_checkpoint_equals_local_copy_with_file_hashes(fake_hub: FakeHub, hf_home: Path, tmp_path: Path) -> None:
    files = tiny_checkpoint()
    repo = fake_hub.add("org/tiny-fake", files)
    local = open_checkpoint(str(write_files(tmp_path / "local", files)))

    remote = open_checkpoint("org/tiny-fake")

    assert remote.source == "hub" and remote.revision == repo.commit
    assert comparable(remote) == comparable(local)
    assert remote.tokenizer is not None and remote.tokenizer.tokens == local.tokenizer.tokens
    by_path = {f.path: f for f in remote.files}
    assert sorted(by_path) == sorted(files)
    shard = by_path["model.safetensors"]
    assert shard.size == len(files["model.safetensors"])
    assert shard.sha256 == hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert by_path["config.json"].blob_id == git_blob_id(files["config.json"])
    assert by_path["config.json"].sha256 is None  # a plain git file has no LFS hash


def test_safetensors_headers_read_without_tensor_data(fake_hub: FakeHub, hf_home: Path, tmp_path: Path) -> None:
    files = sharded_checkpoint()
    fake_hub.add("org/sharded", files)
    local = open_checkpoint(str(write_files(tmp_path / "local", files)))

    remote = open_checkpoint("org/sharded")

    assert comparable(remote) == comparable(local)
    assert remote.total_bytes == 2 * (4 * MIB + 128 * 64 * 2)
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        served = fake_hub.served[("org/sharded", shard)]
        assert 0 < served <= SAFETENSORS_FIRST_READ and served < len(files[shard]) // 16


def test_gguf_header_read_by_ranges(fake_hub: FakeHub, hf_home: Path, tmp_path: Path) -> None:
    # 80k tokens make a ~1.6 MB header (more than the first 1 MiB read) before ~20 MB of data.
    data = gguf_checkpoint(tmp_path / "model.gguf", tokens=80_000)
    fake_hub.add("org/gguf", {"model.gguf": data})
    local = open_checkpoint(str(tmp_path / "model.gguf"))

    remote = open_checkpoint("org/gguf")

    assert remote.format == "gguf" and remote.source == "hub"
    assert comparable(remote) == comparable(local)
    assert remote.tokenizer.tokens == local.tokenizer.tokens
    served = fake_hub.served[("org/gguf", "model.gguf")]
    assert GGUF_FIRST_READ < served <= 3 * GGUF_FIRST_READ < len(data) // 6
    file_route = f"/org/gguf/resolve/{remote.revision}/model.gguf"
    ranged = [path for method, path in fake_hub.requests if method == "GET" and path == file_route]
    assert len(ranged) == 2


def test_oversized_file_is_refused_before_download(fake_hub: FakeHub, hf_home: Path) -> None:
    files = tiny_checkpoint()
    files["config.json"] = files["config.json"] + b" " * MAX_CONFIG_BYTES
    fake_hub.add("org/huge-config", files)

    with pytest.raises(BadInput, match=r"org/huge-config/config.json: is \d+ bytes, over the \d+-byte limit"):
        open_checkpoint("org/huge-config")
    assert fake_hub.served[("org/huge-config", "config.json")] == 0


# ---------------------------------------------------------------- offline: HF cache, catalog


def test_offline_runs_rebuild_the_checkpoint_from_the_hf_cache(
    fake_hub: FakeHub, hf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hub.add("org/cached", sharded_checkpoint())
    online = open_checkpoint("org/cached")
    requests_before = len(fake_hub.requests)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked = open_checkpoint("org/cached")
    assert len(fake_hub.requests) == requests_before  # nothing sent
    assert asked.source == "hf-cache" and asked.revision == online.revision
    assert comparable(asked) == comparable(online)  # tensor headers included
    assert asked.files == online.files
    assert asked.notes == online.notes

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    forced = open_checkpoint("org/cached")
    assert forced.source == "hf-cache" and comparable(forced) == comparable(online)
    assert len(forced.notes) == len(online.notes) + 1
    assert "was unreachable" in forced.notes[-1] and online.revision in forced.notes[-1]

    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    fake_hub.down = True
    try:
        down = open_checkpoint("org/cached")
    finally:
        fake_hub.down = False
    assert down.source == "hf-cache" and "HTTP 503" in down.notes[-1]


def test_offline_gguf_header_comes_from_the_metadata_cache(
    fake_hub: FakeHub, hf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = gguf_checkpoint(tmp_path / "model.gguf", tokens=1000)
    fake_hub.add("org/gguf-small", {"model.gguf": data})
    online = open_checkpoint("org/gguf-small")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = open_checkpoint("org/gguf-small")

    assert offline.source == "hf-cache" and comparable(offline) == comparable(online)
    assert offline.tokenizer.tokens == online.tokenizer.tokens
    assert not any((hf_home / "hub" / "models--org--gguf-small").rglob("*.gguf"))  # the GGUF was never downloaded


def test_offline_without_a_specpair_record_reads_the_hf_snapshot(
    fake_hub: FakeHub, hf_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import hf_hub_download

    files = sharded_checkpoint()
    fake_hub.add("org/downloaded", files)
    online = open_checkpoint("org/downloaded")
    shutil.rmtree(hf_home / "hub" / "specpair-headers")  # as if the snapshot came from `hf download`

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config_only = open_checkpoint("org/downloaded")
    assert config_only.source == "hf-cache" and config_only.format == "config-only" and config_only.groups == []
    assert config_only.shapes == dataclasses.replace(online.shapes, embedding_rows=None)

    for shard in (name for name in files if name.endswith(".safetensors")):
        hf_hub_download(
            "org/downloaded", shard, revision=online.revision, cache_dir=str(hf_home / "hub"), endpoint=fake_hub.url
        )
    with_shards = open_checkpoint("org/downloaded")
    assert with_shards.source == "hf-cache" and comparable(with_shards) == comparable(online)


def test_offline_falls_back_to_the_builtin_catalog(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    checkpoint = open_checkpoint("Qwen/Qwen3-8B")

    assert checkpoint.source == "catalog" and checkpoint.ref == "Qwen/Qwen3-8B"
    assert checkpoint.family == "qwen3"
    assert (checkpoint.shapes.hidden_size, checkpoint.shapes.num_layers) == (4096, 36)
    assert not (hf_home / "hub").exists() or not any((hf_home / "hub").iterdir())


def test_unreachable_hub_falls_back_to_the_catalog_with_a_note(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")

    checkpoint = open_checkpoint("Qwen/Qwen3-8B")

    assert checkpoint.source == "catalog"
    assert "was unreachable" in checkpoint.notes[-1] and "built-in catalog" in checkpoint.notes[-1]


def test_offline_repo_in_neither_cache_nor_catalog_is_bad_input(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    with pytest.raises(BadInput, match="not reachable offline: not in the HF cache nor in the built-in catalog"):
        open_checkpoint("org/never-seen")


# ---------------------------------------------------------------- errors through the CLI


@pytest.fixture(scope="module")
def error_repos(fake_hub: FakeHub) -> FakeHub:
    files = tiny_checkpoint()
    fake_hub.add("org/public", files)
    fake_hub.add("org/private", files, private=True, readers={"hf_reader"})
    fake_hub.add("org/gated", files, gated=True, readers={"hf_accepted"})
    fake_hub.add("org/unserved", files, unserved={"config.json"})  # listed, but the file route says EntryNotFound
    fake_hub.add("org/escape", {**files, "../escape.json": b"{}"})  # a hostile endpoint's file list
    return fake_hub


@pytest.mark.parametrize(
    ("ref", "token", "expected"),
    [
        ("org/missing", None, ["org/missing: repository not found on", "no token was given"]),
        ("org/private", None, ["org/private: repository not found on", "no token was given"]),
        ("org/private", "hf_other", ["org/private: repository not found on", "the token given cannot see it"]),
        ("org/public@v9", None, ["org/public@v9: revision 'v9' not found"]),
        ("org/gated", None, ["org/gated: gated repo and no token was given", "/org/gated, then set HF_TOKEN"]),
        ("org/gated", "hf_other", ["org/gated: gated repo and this token's account has no access"]),
        ("org/public", "hf_revoked", ["org/public: the Hub rejected the token (401 Unauthorized)"]),
        ("org/unserved", None, ["org/unserved/config.json: file not found on the Hub"]),
        ("org/escape", None, ["org/escape: the Hub lists an unsafe file name '../escape.json'"]),
    ],
)
def test_hub_errors_are_one_line_exit_2(
    error_repos: FakeHub, tmp_path: Path, ref: str, token: str | None, expected: list[str]
) -> None:
    env = cli_env(HF_ENDPOINT=error_repos.url, HF_HOME=str(tmp_path / "hf"), **({"HF_TOKEN": token} if token else {}))

    result = run_cli("inspect", ref, env=env)

    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    for fragment in expected:
        assert fragment in result.stderr


def test_readers_get_past_the_errors(error_repos: FakeHub, tmp_path: Path) -> None:
    for ref, token in (("org/private", "hf_reader"), ("org/gated", "hf_accepted")):
        env = cli_env(HF_ENDPOINT=error_repos.url, HF_HOME=str(tmp_path / token), HF_TOKEN=token)
        result = run_cli("inspect", ref, "--json", env=env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["checkpoint"]["source"] == "hub"


def test_unreachable_hub_with_nothing_offline_fails_fast(tmp_path: Path) -> None:
    env = cli_env(HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME=str(tmp_path / "hf"))

    started = time.monotonic()
    result = run_cli("inspect", "org/never-seen", env=env)

    assert time.monotonic() - started < 10
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "not reachable offline" in result.stderr and "is unreachable" in result.stderr


# ---------------------------------------------------------------- olah: a real Hub mirror over git


@pytest.fixture(scope="module")
def olah(tmp_path_factory: pytest.TempPathFactory):
    """olah serving one git repo `org/tiny` (the tiny checkpoint); yields (endpoint, commit, local copy)."""
    source = write_files(tmp_path_factory.mktemp("tiny") / "tiny", tiny_checkpoint())
    with start_olah(olah_cli(), tmp_path_factory.mktemp("olah"), {"org/tiny": source}) as (endpoint, commits):
        yield endpoint, commits["org/tiny"], source


def test_olah_mirror_gives_the_local_checkpoint(olah, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint, commit, repo_dir = olah
    for name in HF_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    local = open_checkpoint(str(repo_dir))  # the git work tree: .git is a hidden directory, skipped

    remote = open_checkpoint(f"org/tiny@{commit}")

    assert remote.source == "hub" and remote.revision == commit
    assert comparable(remote) == comparable(local)
    assert remote.format == "safetensors" and remote.shapes.embedding_rows == 128
    assert sorted(f.path for f in remote.files) == sorted(f.path for f in local.files)
    # The files read went through the HF cache at that commit.
    snapshot = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / commit
    assert (snapshot / "config.json").read_bytes() == (repo_dir / "config.json").read_bytes()
    assert not (snapshot / "model.safetensors").exists()
