"""The tables are the one source of what specpair knows per drafter kind, family, layout and stack: the goal counts
of issue 22 (a name's string literal in few package files, measured by tools/literal_counts.py), and the
derivations the rest of the package makes from the rows."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from specpair import runtime
from specpair.checkpoint.families import (
    BLOCK,
    CHAIN,
    DRAFTER_KINDS,
    FAMILIES,
    HEAD_KIND,
    OWN_STACK,
    PLAIN_KIND,
    TAP_LAYOUTS,
    TAPS,
    drafter_kind,
    tap_layout,
)
from specpair.compat.stacks import STACK_NAMES, STACKS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import literal_counts  # noqa: E402

# At most this many package files hold one name as a string literal: a drafter kind in its row, the stack table, its
# runtime module and its converter map; a layout in its row, the stack table, its codec, its converter map and its
# kernel map; a family in its row and the runtime's family map.
GOALS = {"drafter kind": 4, "layout": 5, "family": 2}
# "gguf" also names the file format, the quantization method, the rope schema and a tokenizer source; the layout
# kind is formats/layouts.py GGUF.
NOT_COUNTED = {"gguf"}

# The same spelling naming something else there: (name, file) -> what it names.
HOMONYMS = {
    ("mtp", "checkpoint/__init__.py"): "the Checkpoint field `mtp` (the target's MTP layers), read back from JSON",
    ("llama", "checkpoint/gguf_tokenizer.py"): "GGUF's tokenizer.ggml.model for SentencePiece vocabularies",
    ("fp8", "convert/quant_configs.py"): "transformers' quant_method of a fine-grained FP8 config",
    ("affine", "convert/quant_configs.py"): "MLX's quantization mode, as mlx-lm writes it in config.json",
    ("exl3", "convert/quant_configs.py"): "ExLlamaV3's quant_format value in quantization_config.json",
}
# A rule's example values, which docs/check.md renders (the case that motivated the rule).
EXAMPLES = {("nvfp4-modelopt", "compat/rules/sglang.py"): "an NVFP4 target's quantized lm_head"}
EXEMPT = HOMONYMS | EXAMPLES


@pytest.fixture(scope="module")
def found() -> dict[str, dict[str, dict[str, list[int]]]]:
    return {group: literal_counts.occurrences(ROOT, names) for group, names in literal_counts.GROUPS.items()}


@pytest.mark.parametrize("group", list(GOALS))
def test_each_name_is_a_literal_in_few_package_files(found, group: str) -> None:
    over = {}
    for name, files in found[group].items():
        counted = [f for f in files if (name, f) not in EXEMPT]
        if name not in NOT_COUNTED and len(counted) > GOALS[group]:
            over[name] = counted
    assert not over, f"more than {GOALS[group]} files name a {group}: derive from its row instead ({over})"


def test_every_exemption_is_still_needed(found) -> None:
    """An exemption whose literal is gone must go too, so that the counts cannot grow back into it."""
    present = {(name, f) for by_name in found.values() for name, files in by_name.items() for f in files}
    assert set(EXEMPT) <= present, sorted(set(EXEMPT) - present)


def test_the_counts_see_literals_and_only_exact_ones(tmp_path: Path) -> None:
    (tmp_path / "compat").mkdir()
    (tmp_path / "compat" / "a.py").write_text('X = ("dflash2", "dflash2-ish")\n"""dflash docstring"""\n')
    (tmp_path / "compat" / "b.py").write_text("dflash2 = 1  # dflash2 as a name and in a comment\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "c.py").write_text('Y = "dflash2"\n')
    found = literal_counts.occurrences(tmp_path, ["dflash2", "dflash"])
    assert found == {"dflash2": {"compat/a.py": [1]}, "dflash": {}}


def test_what_the_runtime_runs_is_the_rows_that_list_its_stack() -> None:
    assert runtime.AVAILABLE.families == tuple(f.name for f in FAMILIES.values() if OWN_STACK in f.stacks)
    assert runtime.AVAILABLE.drafter_kinds == tuple(k.name for k in DRAFTER_KINDS.values() if OWN_STACK in k.serving)
    assert STACKS[OWN_STACK].kinds == runtime.AVAILABLE.drafter_kinds


@pytest.mark.parametrize("kind", list(DRAFTER_KINDS))
def test_each_row_names_the_runtime_class_that_loads_it(kind: str) -> None:
    """The row's "module:Class" imports (the runtime loads it from there), and a class that states its kind states
    this one."""
    module, _, name = DRAFTER_KINDS[kind].runtime.partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert callable(cls.load)
    assert getattr(cls, "kind", kind) == kind


def test_rows_name_only_stacks_of_the_stack_table() -> None:
    for family in FAMILIES.values():
        assert set(family.stacks) <= set(STACK_NAMES), family.name
    for kind in DRAFTER_KINDS.values():
        assert set(kind.serving) <= set(STACK_NAMES), kind.name
        assert kind.drafting in (BLOCK, CHAIN) and kind.family in (None, *FAMILIES), kind.name


def test_tap_conventions_are_stated_where_a_kind_reads_taps() -> None:
    """Every kind reading taps has a layout row per training framework (specpair feeds what it names); every other
    stack says how it reads the ids, or that it is not known (None)."""
    for kind in DRAFTER_KINDS.values():
        for stack, serves in kind.serving.items():
            if TAPS not in kind.reads or stack == OWN_STACK:
                assert serves.tap_shift is None, (kind.name, stack)
        assert any(kind.name in t.kinds for t in TAP_LAYOUTS.values()) == (TAPS in kind.reads), kind.name
    # today's facts: EAGLE-3 aux id j is the input of layer j for vLLM; SGLang adds 1 to a list starting at 1
    # (sglang#25454) and reads only eagle_config's ids; ExLlamaV3 reads DFlash taps one layer later than the others
    eagle3 = next(k for k in DRAFTER_KINDS.values() if k.drafting == CHAIN and TAPS in k.reads)
    vllm, sglang = eagle3.serving["vllm"].reading, eagle3.serving["sglang"].reading
    assert (vllm.layers([1, 46, 90]), vllm.layers([2, 47, 91])) == ([0, 45, 89], [1, 46, 90])
    assert (sglang.layers([1, 46, 90]), sglang.layers([2, 47, 91])) == ([1, 46, 90], [1, 46, 90])
    assert eagle3.serving["sglang"].tap_keys == ("eagle_config.eagle_aux_hidden_state_layer_ids",)
    shifted = {
        (k.name, s): v.tap_shift
        for k in DRAFTER_KINDS.values()
        if k.drafting == BLOCK
        for s, v in k.serving.items()
        if v.tap_shift not in (0, None)
    }
    assert shifted == {("dflash", "exllamav3"): 1}


def test_tap_layout_is_read_from_the_drafters_config() -> None:
    """The training framework's convention is told from the config: SpecForge's eagle_config ids name layer outputs
    (SGLang's capture adds 1 to a list starting at 1), vLLM's and speculators' top-level ids layer inputs, a config
    naming none the EAGLE repository's default; DFlash's target_layer_ids name outputs."""
    ids = [1, 46, 90]
    cases = {
        "specforge": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}},
        "speculators": {"eagle_aux_hidden_state_layer_ids": ids, "speculators_config": {"algorithm": "eagle3"}},
        "vllm": {"eagle_aux_hidden_state_layer_ids": ids},
        "eagle": {},
    }
    for name, config in cases.items():
        layout, key = tap_layout("eagle3", config)
        assert layout.name == name, (name, layout.name)
        assert (key is None) == (name == "eagle")
    assert TAP_LAYOUTS["specforge"].reading.layers(ids) == ids
    assert TAP_LAYOUTS["vllm"].reading.layers(ids) == [0, 45, 89]
    assert TAP_LAYOUTS["eagle"].reading.layers(TAP_LAYOUTS["eagle"].default_ids(94)) == [1, 46, 90]
    layout, key = tap_layout("dflash", {"dflash_config": {"target_layer_ids": [1, 6]}})
    assert (layout.name, key, layout.reading.layers([1, 6])) == (
        "zlab_dflash",
        "dflash_config.target_layer_ids",
        [1, 6],
    )
    assert tap_layout("dflash", {}) is None


def test_drafter_kind_is_the_head_the_plain_model_or_the_drafters_own() -> None:
    assert drafter_kind(None, separate=False) == HEAD_KIND.name
    assert drafter_kind(None, separate=True) == PLAIN_KIND.name
    own = next(k for k in DRAFTER_KINDS.values() if k.hf_architectures).name
    assert drafter_kind(own, separate=True) == own
