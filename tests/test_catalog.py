"""The built-in catalog: lookup contract, data integrity, derived sizes against the spec, the CLI listing."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from specpair.checkpoint import Checkpoint
from specpair.cli.catalog import layout_summary
from specpair.sources.catalog import SCHEMA, drafters_named, entries, file_name, lookup, same_revision

REPO_ROOT = Path(__file__).resolve().parents[1]
CATALOG_DIR = REPO_ROOT / "catalog"
DFLASH_35B = "z-lab/Qwen3.6-35B-A3B-DFlash"
JUNE_SHA = "c69b185" + "0" * 33
LEGACY_SHA = "42d3b34" + "f" * 33


def load_builder():
    """tools/build_catalog.py is a script, not a module of the package: load it from its path."""
    if "build_catalog" not in sys.modules:
        spec = importlib.util.spec_from_file_location("build_catalog", REPO_ROOT / "tools" / "build_catalog.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses resolve annotations through sys.modules
        spec.loader.exec_module(module)
    return sys.modules["build_catalog"]


def stored_files() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text("utf-8")) for p in sorted(CATALOG_DIR.glob("*.json"))}


def by_repo() -> dict[tuple[str, str | None], Checkpoint]:
    return {(c.ref, c.revision): c for c in entries()}


def params(c: Checkpoint, *groups: str) -> float:
    """Parameters (billions) of a BF16 checkpoint's groups; all groups except MTP and vision when none named."""
    assert c.layouts_of() == {"bf16"}, c.ref
    chosen = [g for g in c.groups if (g.group in groups if groups else g.group not in ("mtp", "vision"))]
    return sum(g.bytes for g in chosen) / 2 / 1e9


# --- lookup contract -------------------------------------------------------------------------------


def test_lookup_without_revision_gives_the_newest_entry_marked_as_catalog_data() -> None:
    c = lookup(DFLASH_35B, None, "my-ref")
    assert c is not None
    assert (c.ref, c.source, c.revision) == ("my-ref", "catalog", "c69b185")
    assert c.drafter.mask_token_id == 248077
    assert "metadata from the built-in catalog at revision c69b185 (no network)" in c.notes
    assert c.provenance.startswith("Reconstructed from secondary sources")


def test_lookup_pinned_revision_by_full_sha_or_prefix() -> None:
    legacy = lookup(DFLASH_35B, LEGACY_SHA, f"{DFLASH_35B}@{LEGACY_SHA}")
    assert (legacy.revision, legacy.drafter.mask_token_id, legacy.shapes.num_layers) == ("42d3b34", 248070, 8)
    assert lookup(DFLASH_35B, "42D3B34", DFLASH_35B).revision == "42d3b34"
    assert lookup(DFLASH_35B, JUNE_SHA[:12], DFLASH_35B).revision == "c69b185"
    assert lookup("nvidia/Qwen3.6-35B-A3B-NVFP4", "1355db6", "x").revision == "1355db6"


def test_lookup_unknown_revision_is_none() -> None:
    assert lookup(DFLASH_35B, "0123456789abcdef0123456789abcdef01234567", DFLASH_35B) is None
    assert lookup(DFLASH_35B, "c69b18", DFLASH_35B) is None  # 6 digits: too short to identify a commit


def test_lookup_branch_uses_the_newest_entry_and_says_so() -> None:
    checkpoint = lookup(DFLASH_35B, "main", f"{DFLASH_35B}@main")
    assert checkpoint is not None and checkpoint.revision == lookup(DFLASH_35B, None, DFLASH_35B).revision
    assert any("stands in for 'main'" in note for note in checkpoint.notes)
    assert lookup("Qwen/Qwen3-8B", "abc1234", "Qwen/Qwen3-8B@abc1234") is None  # no revision recorded


def test_lookup_repo_ids_compare_case_insensitively() -> None:
    c = lookup("qwen/QWEN3.6-35b-a3b", None, "qwen/QWEN3.6-35b-a3b")
    assert (c.ref, c.family, c.revision) == ("qwen/QWEN3.6-35b-a3b", "qwen3_5_moe", None)
    assert "metadata from the built-in catalog (revision not recorded) (no network)" in c.notes
    assert lookup("Z-LAB/qwen3.6-35b-a3b-dflash", "C69B185", "r").revision == "c69b185"


def test_lookup_unknown_or_malformed_repo_is_none() -> None:
    assert lookup("Qwen/Qwen9-1B", None, "Qwen/Qwen9-1B") is None
    assert lookup("../catalog/__init__", None, "x") is None
    assert lookup("a/b/c", None, "x") is None


def test_drafters_named_as_gguf_converters_write_the_repo_name() -> None:
    """A GGUF names its source in general.name (llama.cpp title-cases the repo's name with spaces; specpair keeps it),
    under general.organization where set: each finds the trained drafters of that name, every revision, never a
    target or a GGUF conversion."""

    def found(*names: str) -> list[tuple[str, str | None]]:
        return [(c.ref, c.revision) for c in drafters_named(names)]

    z_lab = [(DFLASH_35B, "c69b185"), (DFLASH_35B, "42d3b34")]
    assert found("Qwen3.6 35B A3B DFlash") == [("modal-labs/Qwen3.6-35B-A3B-DFlash", None), *z_lab]
    assert found("Z Lab/Qwen3.6 35B A3B DFlash") == found("z-lab/qwen3.6-35b-a3b-dflash") == z_lab
    assert found("Qwen3 32B FP8 DFLASH") == [("chutesai/Qwen3-32B-FP8-DFLASH", None)]
    assert found("Qwen/Qwen3.6 35B A3B", "Qwen3.6 35B A3B DFlash GGUF", "Other/Qwen3.6 35B A3B DFlash") == []


def test_same_revision_matches_abbreviations_in_either_direction() -> None:
    assert same_revision("abcdef1", "abcdef1234567")
    assert same_revision("abcdef1234567", "abcdef1")
    assert not same_revision("abcdef", "abcdef1234567")
    assert not same_revision("abcdef2", "abcdef1234567")
    assert not same_revision("zzzzzzzz", "zzzzzzzz")
    assert not same_revision("abcdef1", None)


def test_lookup_imports_no_heavy_library() -> None:
    code = (
        "import sys; from specpair.sources.catalog import lookup; "
        "assert lookup('Qwen/Qwen3.6-35B-A3B', None, 'x') is not None; "
        "print(sorted(m for m in ('torch', 'numpy', 'huggingface_hub', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- data integrity --------------------------------------------------------------------------------


def test_every_entry_round_trips_through_checkpoint_json() -> None:
    for name, stored in stored_files().items():
        assert stored["schema"] == SCHEMA
        assert name == file_name(stored["repo"])
        for data in stored["entries"]:
            assert Checkpoint.from_json(data).to_json() == data, (name, data["revision"])


GGUF_REPOS = {
    "unsloth/Qwen3.6-35B-A3B-GGUF",
    "williamliao/Qwen3.6-35B-A3B-DFlash-GGUF",
    "Anbeeld/Qwen3.6-35B-A3B-DFlash-GGUF",
}


def test_entries_carry_source_provenance_and_derived_sizes() -> None:
    found = entries()
    assert len(found) == sum(len(s["entries"]) for s in stored_files().values()) == 33
    for c in found:
        assert c.source == "catalog" and c.groups, c.ref
        assert c.format == ("gguf" if c.ref in GGUF_REPOS else "safetensors"), c.ref
        assert "not read from tensor headers" in c.provenance, c.ref
        if c.role == "drafter":
            assert "Assumed, not sourced:" in c.provenance
            # DFlash drafters ship no tokenizer; an upstream-converted GGUF carries its target's
            assert (c.tokenizer is not None) == (c.ref == "williamliao/Qwen3.6-35B-A3B-DFlash-GGUF"), c.ref
        else:
            assert c.tokenizer.source == "catalog" and c.tokenizer.fingerprint is None
    pinned = {(c.ref, c.revision) for c in found if c.revision}
    assert pinned == {
        (DFLASH_35B, "c69b185"),
        (DFLASH_35B, "42d3b34"),
        ("nvidia/Qwen3.6-35B-A3B-NVFP4", "1355db6"),
        ("incoai/Qwen3.6-35B-A3B-DFlash2", "51ef7b6923ad6c14cb1bb41c37a9041446496ab6"),
        ("unsloth/Qwen3.6-35B-A3B-GGUF", "a483e9e6cbd595906af30beda3187c2663a1118c"),
    }


def test_the_pairs_users_arrive_with_are_in_the_catalog() -> None:
    catalog = by_repo()
    incoai = catalog[("incoai/Qwen3.6-35B-A3B-DFlash2", "51ef7b6923ad6c14cb1bb41c37a9041446496ab6")]
    assert (incoai.architecture, incoai.drafter.block_size, incoai.shapes.num_layers) == ("DFlash2DraftModel", 8, 6)
    assert incoai.shapes.count("sliding") == 6 and incoai.total_bytes / 1e9 == pytest.approx(
        1.0, abs=0.1
    )  # "~1 GB BF16"
    coral = catalog[("coral-bricks-ai/qwen35-122b-dflash2-drafter", None)]
    assert (coral.drafter.block_size, coral.drafter.mask_token_id, coral.rope.sliding_window) == (12, 248077, 8192)
    assert coral.drafter.taps.layers == [1, 7, 14, 20, 26, 32, 39, 45]
    assert coral.total_bytes / 2 / 1e9 == pytest.approx(0.93, rel=0.02)  # "~930 M parameters", "~1.86 GB"
    fp8 = catalog[("Qwen/Qwen3.5-122B-A10B-FP8", None)]
    assert {g.group for g in fp8.groups if g.layout == "fp8-block"} >= {"experts", "attention", "linear_attention"}
    assert fp8.layouts_of("router", "embedding", "lm_head", "norm") == {"bf16"}
    gguf = catalog[("unsloth/Qwen3.6-35B-A3B-GGUF", "a483e9e6cbd595906af30beda3187c2663a1118c")]
    assert (gguf.architecture, [f.path for f in gguf.files]) == ("qwen35moe", ["Qwen3.6-35B-A3B-UD-Q4_K_M.gguf"])
    assert gguf.total_bytes / 22_134_528_992 == pytest.approx(1, abs=0.02) and gguf.mtp is None
    upstream = catalog[("williamliao/Qwen3.6-35B-A3B-DFlash-GGUF", None)]
    assert (upstream.architecture, upstream.drafter.block_size, len(upstream.drafter.taps.layers)) == ("dflash", 16, 8)
    assert upstream.shapes.num_layers == 6 and upstream.total_bytes / 421_060_896 == pytest.approx(1, abs=0.05)
    fork = catalog[("Anbeeld/Qwen3.6-35B-A3B-DFlash-GGUF", None)]
    assert (fork.architecture, fork.tokenizer, fork.shapes.vocab_size) == ("dflash-draft", None, None)
    exl3 = catalog[("UnstableLlama/Qwen3.6-35B-A3B-exl3-4.00bpw", None)]
    assert exl3.layouts_of("experts") == {"exl3-4bpw"} and exl3.quantization.method == "exl3"
    draft = catalog[("UnstableLlama/Qwen3.6-35B-A3B-DFlash-exl3-2.50bpw", None)]
    assert draft.layouts_of("attention") == {"exl3-3bpw"} and draft.layouts_of("mlp") == {"exl3-2bpw"}
    modal = catalog[("modal-labs/Qwen3.6-35B-A3B-DFlash", None)]
    assert modal.drafter.taps.layers == catalog[(DFLASH_35B, "c69b185")].drafter.taps.layers


def test_recipes_pair_up_as_published() -> None:
    """The catalog's recipe pairs give the verdicts their recipes report: llama.cpp runs unsloth + williamliao and
    refuses the fork GGUF with a conversion fix; SGLang runs the NVFP4 target with incoai's DFlash2; ExLlamaV3 the
    EXL3 pair."""

    def verdicts(target: str, draft: str, stack: str) -> tuple[str, list[str], str | None]:
        from specpair.compat.pair import Deployment
        from specpair.compat.verdict import judge
        from specpair.sources.catalog import lookup

        t, d = lookup(target, None, target), lookup(draft, None, draft)
        v = judge(t, d, Deployment(), [stack])[1][stack]
        return v.status, [f.rule for f in v.reasons if f.severity == "error"], v.fix

    assert verdicts("unsloth/Qwen3.6-35B-A3B-GGUF", "williamliao/Qwen3.6-35B-A3B-DFlash-GGUF", "llama.cpp")[:2] == (
        "warn",
        [],
    )
    status, failed, fix = verdicts("unsloth/Qwen3.6-35B-A3B-GGUF", "Anbeeld/Qwen3.6-35B-A3B-DFlash-GGUF", "llama.cpp")
    assert (status, failed) == ("fail", ["drafter.arch", "gguf.draft_tokenizer"]) and "--to gguf:Q8_0" in fix
    assert "--target unsloth/Qwen3.6-35B-A3B-GGUF" in fix  # its mask token is read through the vocabulary it lacks
    assert verdicts("nvidia/Qwen3.6-35B-A3B-NVFP4", "incoai/Qwen3.6-35B-A3B-DFlash2", "sglang")[:2] == ("warn", [])
    assert verdicts("Qwen/Qwen3.5-122B-A10B-FP8", "coral-bricks-ai/qwen35-122b-dflash2-drafter", "sglang")[:2] == (
        "warn",
        [],
    )
    assert (
        verdicts(
            "UnstableLlama/Qwen3.6-35B-A3B-exl3-4.00bpw",
            "UnstableLlama/Qwen3.6-35B-A3B-DFlash-exl3-2.50bpw",
            "exllamav3",
        )[1]
        == []
    )


def test_every_published_target_config_copy_is_in_the_catalog() -> None:
    configs = load_builder().REAL_CONFIGS
    copies = {p.name.split(".json")[0].replace("__", "/") for p in configs.glob("*.json") if ".hf_quant" not in p.name}
    repos = {c.ref for c in entries()}
    assert copies <= repos
    assert {"Qwen/Qwen3.6-35B-A3B", "Qwen/Qwen3.6-27B"} <= repos


def test_checked_in_json_is_what_the_build_script_generates() -> None:
    builder = load_builder()
    generated = builder.render()
    assert generated == {p.name: p.read_text("utf-8") for p in CATALOG_DIR.glob("*.json")}


def test_catalog_files_ship_as_package_data() -> None:
    shipped = {item.name for item in resources.files("specpair.catalog").iterdir() if item.name.endswith(".json")}
    assert shipped == set(stored_files())


# --- derived sizes against targets.md §6 -----------------------------------------------------------

# repo: (LM params B, routed expert params B or None, MTP params B or None)
TARGETS_MD_SIZES = {
    "Qwen/Qwen3.6-35B-A3B": (34.661, 32.212, 0.845),
    "Qwen/Qwen3.5-35B-A3B": (34.661, 32.212, 0.845),
    "Qwen/Qwen3.5-122B-A10B": (122.112, 115.964, 2.524),
    "Qwen/Qwen3.5-397B-A17B": (396.346, 386.547, None),
    "Qwen/Qwen3.5-27B": (26.896, None, 0.425),
    "Qwen/Qwen3.6-27B": (26.896, None, 0.425),
    "Qwen/Qwen3-30B-A3B": (30.532, 28.991, None),
    "Qwen/Qwen3-8B": (8.191, None, None),
    "Qwen/Qwen3-32B": (32.762, None, None),
}


@pytest.mark.parametrize("repo", sorted(TARGETS_MD_SIZES))
def test_derived_parameter_counts_match_targets_md(repo: str) -> None:
    lm, experts, mtp = TARGETS_MD_SIZES[repo]
    c = by_repo()[(repo, None)]
    assert params(c) == pytest.approx(lm, rel=0.005)
    if experts is not None:
        assert params(c, "experts") == pytest.approx(experts, rel=0.005)
    if mtp is not None:
        assert params(c, "mtp") == pytest.approx(mtp, rel=0.005)
        assert c.mtp.bytes == c.bytes_of("mtp")


def test_qwen3_5_moe_tensor_count_and_vision_size() -> None:
    c = by_repo()[("Qwen/Qwen3.5-35B-A3B", None)]
    assert sum(g.tensors for g in c.groups) == 1811  # the count quoted for the BF16 repo (targets.md §4)
    assert c.mtp.tensors == 785 and c.shapes.embedding_rows == 248320
    assert params(c, "vision") == pytest.approx(0.45, rel=0.02)  # "≈0.45 B params"


def test_quantized_layouts_follow_their_quant_configs() -> None:
    catalog = by_repo()
    nvfp4 = catalog[("nvidia/Qwen3.6-35B-A3B-NVFP4", "1355db6")]
    layout = {g.group: g.layout for g in nvfp4.groups if g.group not in ("linear_attention",)}
    assert layout == {
        "attention": "fp8-tensor",
        "embedding": "bf16",
        "experts": "nvfp4-modelopt",
        "lm_head": "nvfp4-modelopt",
        "mtp": "bf16",
        "norm": "bf16",
        "router": "bf16",
        "shared_expert": "nvfp4-modelopt",
        "vision": "bf16",
    }
    assert nvfp4.layouts_of("linear_attention") == {"fp8-tensor", "bf16"}  # in_proj_a/b, conv, A_log stay BF16
    lm_bytes = nvfp4.total_bytes - nvfp4.bytes_of("mtp", "vision")
    assert lm_bytes / 1e9 == pytest.approx(20.8, rel=0.01)  # "NVFP4-mixed 20.8 GB" (targets.md §6)
    only_experts = catalog[("nvidia/Qwen3.5-122B-A10B-NVFP4", None)]
    assert {g.group for g in only_experts.groups if g.layout != "bf16"} == {"experts"}
    fp8 = catalog[("Qwen/Qwen3-30B-A3B-FP8", None)]
    fp8_groups = {g.group: g.layout for g in fp8.groups if g.layout != "bf16"}
    assert fp8_groups == {"attention": "fp8-block", "experts": "fp8-block"}
    assert fp8.bytes_of("lm_head") == 151936 * 2048 * 2


def test_tokenizer_facts_follow_targets_md() -> None:
    catalog = by_repo()
    qwen36 = catalog[("Qwen/Qwen3.6-35B-A3B", None)].tokenizer
    assert (qwen36.length, qwen36.family, qwen36.bos_id) == (248077, "qwen3_5", 248044)
    assert (qwen36.eos_ids, qwen36.pad_id) == ([248046, 248044], 248044)
    qwen3 = catalog[("Qwen/Qwen3-Next-80B-A3B-Thinking", None)].tokenizer
    assert (qwen3.length, qwen3.family, qwen3.bos_id, qwen3.eos_ids) == (151669, "qwen3", 151643, [151645])


# --- drafters against dflash.md §1.3 ---------------------------------------------------------------

# (repo, revision): layers, hidden, heads, kv heads, ffn, sliding layers, window, block, mask, taps, target
DFLASH_MD_TABLE = {
    ("z-lab/Qwen3.5-122B-A10B-DFlash", None): (
        6,
        3072,
        32,
        8,
        9216,
        5,
        4096,
        16,
        248077,
        [1, 7, 14, 20, 26, 32, 39, 45],
        "Qwen/Qwen3.5-122B-A10B",
    ),
    (DFLASH_35B, "c69b185"): (
        6,
        2048,
        32,
        8,
        6144,
        5,
        4096,
        16,
        248077,
        [1, 6, 11, 16, 22, 27, 32, 37],
        "Qwen/Qwen3.6-35B-A3B",
    ),
    (DFLASH_35B, "42d3b34"): (8, 2048, 32, 4, 6144, 0, None, 16, 248070, [1, 10, 19, 28, 37], "Qwen/Qwen3.6-35B-A3B"),
    ("z-lab/Qwen3.5-35B-A3B-DFlash", None): (
        6,
        2048,
        32,
        8,
        6144,
        5,
        4096,
        16,
        248077,
        [1, 6, 11, 16, 22, 27, 32, 37],
        "Qwen/Qwen3.5-35B-A3B",
    ),
    ("z-lab/Qwen3.5-27B-DFlash", None): (
        5,
        5120,
        32,
        8,
        17408,
        0,
        None,
        16,
        248070,
        [1, 16, 31, 46, 61],
        "Qwen/Qwen3.5-27B",
    ),
    ("z-lab/Qwen3.8-27B-DFlash2", None): (
        5,
        5120,
        32,
        8,
        17408,
        5,
        2048,
        8,
        248070,
        [5, 19, 33, 47, 61],
        "Qwen/Qwen3.6-27B",
    ),
    ("chutesai/Qwen3-32B-FP8-DFLASH", None): (
        5,
        5120,
        32,
        8,
        9728,
        0,
        None,
        16,
        None,
        [1, 16, 31, 46, 61],
        "Qwen/Qwen3-32B",
    ),
}


@pytest.mark.parametrize("key", sorted(DFLASH_MD_TABLE, key=str))
def test_drafter_facts_match_dflash_md(key: tuple[str, str | None]) -> None:
    layers, hidden, heads, kv, ffn, sliding, window, block, mask, taps, target_repo = DFLASH_MD_TABLE[key]
    catalog = by_repo()
    c, target = catalog[key], catalog[(target_repo, None)]
    s, d = c.shapes, c.drafter
    assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads) == (layers, hidden, heads, kv)
    assert s.intermediate_size == ffn
    assert (s.count("sliding"), c.rope.sliding_window, len(s.layer_types)) == (sliding, window, layers)
    assert (d.block_size, d.mask_token_id, d.taps.layers) == (block, mask, taps)
    assert d.fc_shape == [hidden, len(taps) * target.shapes.hidden_size]
    assert max(taps) < target.shapes.num_layers
    assert s.rows == target.shapes.rows and not d.has_embeddings and d.head_rows is None
    assert c.layouts_of() == {"bf16"} and c.bytes_of("embedding", "lm_head") == 0


def test_drafter_schema_details_per_revision() -> None:
    catalog = by_repo()
    june, legacy = catalog[(DFLASH_35B, "c69b185")].drafter, catalog[(DFLASH_35B, "42d3b34")].drafter
    assert (june.block_size_source, june.num_target_layers) == ("dflash_config.block_size", 41)
    assert (legacy.block_size_source, legacy.num_target_layers) == ("block_size", 41)
    assert catalog[(DFLASH_35B, "42d3b34")].rope.schema == "rope_theta"
    dflash2 = catalog[("z-lab/Qwen3.8-27B-DFlash2", None)]
    assert (dflash2.drafter.kind, dflash2.drafter.is_causal, dflash2.drafter.selector_rank) == ("dflash2", False, 256)
    assert params(dflash2, *{g.group for g in dflash2.groups}) == pytest.approx(1.924, rel=0.005)
    assert round(params(catalog[(DFLASH_35B, "42d3b34")], "attention", "mlp", "norm", "drafter_io"), 1) == 0.5
    chutes = catalog[("chutesai/Qwen3-32B-FP8-DFLASH", None)].drafter
    assert chutes.missing_keys == ["dflash_config.mask_token_id"]  # no mask id is recorded: the real fact


# --- CLI -------------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "specpair", *args], capture_output=True, text=True, env=env)


def test_cli_catalog_json_lists_every_entry() -> None:
    result = run_cli("catalog", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema"] == SCHEMA
    listed = [(e["ref"], e["revision"]) for e in document["entries"]]
    assert listed == [(c.ref, c.revision) for c in entries()]
    assert listed.index((DFLASH_35B, "c69b185")) + 1 == listed.index((DFLASH_35B, "42d3b34"))


def test_cli_catalog_table() -> None:
    result = run_cli("catalog")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "nvidia/Qwen3.6-35B-A3B-NVFP4" in line)
    assert "1355db6" in row and "nvfp4-modelopt 79%, bf16 16%, fp8-tensor 5%" in row and "23.4" in row


def test_cli_catalog_into_a_narrow_pipe_is_a_line_per_entry() -> None:
    """COLUMNS=80 into a pipe: the table is as wide as its cells, never folded (a wrapped layouts column once put
    "f32 0%" on a line of its own)."""
    env = {**os.environ, "COLUMNS": "80"}
    result = subprocess.run([sys.executable, "-m", "specpair", "catalog"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    listed = entries()
    assert len(rows) == len(listed)  # one line per entry
    for entry, row in zip(listed, rows):
        assert f"│ {entry.ref} " in row and layout_summary(entry) in row


def test_cli_catalog_says_which_entries_are_reconstructed() -> None:
    from specpair.sources.catalog import is_reconstructed

    lines = run_cli("catalog").stdout.splitlines()
    listed = json.loads(run_cli("catalog", "--json").stdout)["entries"]
    for entry in listed:
        row = next(line for line in lines if f" {entry['ref']} " in line and (entry["revision"] or "unpinned") in line)
        expected = "reconstructed" if entry["reconstructed"] else "config copy"
        assert expected in row and entry["reconstructed"] == is_reconstructed(
            Checkpoint.from_json({k: v for k, v in entry.items() if k not in ("reconstructed", "pinned")})
        ), entry["ref"]
    assert {e["ref"] for e in listed if not e["reconstructed"]} == {
        "Qwen/Qwen3-0.6B",
        "Qwen/Qwen3-1.7B",
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-32B",
        "Qwen/Qwen3-30B-A3B",
        "Qwen/Qwen3-30B-A3B-FP8",
        "Qwen/Qwen3-235B-A22B",
        "Qwen/Qwen3-Next-80B-A3B-Thinking",
        "Qwen/Qwen3.5-27B",
        "Qwen/Qwen3.5-35B-A3B",
        "Qwen/Qwen3.5-122B-A10B",
        "Qwen/Qwen3.5-397B-A17B",
        "nvidia/Qwen3.5-122B-A10B-NVFP4",
        "nvidia/Qwen3.6-27B-NVFP4",
        "nvidia/Qwen3.6-35B-A3B-NVFP4",
    }


def test_cli_catalog_says_which_entries_are_pinned() -> None:
    """Only a full 40-hex revision is a pin: the two entries that have one say so, the abbreviated and unrecorded
    ones say they are unpinned, in the table, its legend and the JSON."""
    listed = json.loads(run_cli("catalog", "--json").stdout)["entries"]
    assert {(e["ref"], e["revision"]) for e in listed if e["pinned"]} == {
        ("incoai/Qwen3.6-35B-A3B-DFlash2", "51ef7b6923ad6c14cb1bb41c37a9041446496ab6"),
        ("unsloth/Qwen3.6-35B-A3B-GGUF", "a483e9e6cbd595906af30beda3187c2663a1118c"),
    }
    output = run_cli("catalog").stdout
    rows = output.splitlines()
    assert any(f" {DFLASH_35B} " in row and " c69b185 (unpinned) " in row for row in rows)
    assert any(" nvidia/Qwen3.6-35B-A3B-NVFP4 " in row and " 1355db6 (unpinned) " in row for row in rows)
    assert all(" unpinned " in row for row in rows if " Qwen/Qwen3-8B " in row)
    assert f"2 of {len(listed)} entries are pinned to a full commit" in " ".join(output.split())


REVISIONS_IN_LAUNCH = re.compile(
    r'--(?:speculative-draft-model-)?revision (\S+)|"revision":"([^"]*)"|[\w.-]+/[\w.-]+@(\S+)'
)


def test_every_launch_line_of_every_catalog_pair_names_a_full_commit_or_none() -> None:
    """Launch lines pass a revision only as a full 40-hex commit: the catalog's abbreviated ones (c69b185,
    1355db6) are left out, its full ones kept; so for every stack, every catalog target with every catalog
    checkpoint as its drafter (or its own MTP head), asked bare or at the catalog's revision."""
    from specpair.compat.pair import Deployment
    from specpair.compat.stacks import STACK_NAMES
    from specpair.compat.verdict import judge

    revisions, launches = [], 0
    targets = [c for c in entries() if c.role != "drafter"]
    for target in targets:
        for draft in [None, *entries()]:
            for asked in {None, draft.revision if draft else None}:
                drafter = draft
                if draft is not None and asked:
                    drafter = lookup(draft.ref, asked, f"{draft.ref}@{asked}")
                _, verdicts = judge(target, drafter, Deployment(), list(STACK_NAMES))
                for verdict in verdicts.values():
                    if verdict.launch:
                        launches += 1
                        revisions += [next(filter(None, m)) for m in REVISIONS_IN_LAUNCH.findall(verdict.launch)]
    assert launches > 100 and revisions, "some launch lines name a revision"
    assert "51ef7b6923ad6c14cb1bb41c37a9041446496ab6" in revisions  # incoai's, a full commit, is kept
    assert all(re.fullmatch(r"[0-9a-f]{40}", r) for r in revisions), sorted(set(revisions))
