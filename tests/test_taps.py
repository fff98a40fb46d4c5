"""EAGLE-3 drafters are fed the target features their training framework captured (TAP_LAYOUTS, docs/taps.md):
the runtime's features against transformers' hidden states on a tiny Llama target, per layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from drafting import eagle3_checkpoint
from fixtures import save, tiny_model, write_json

from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.loading import load, plan_load
from specpair.sources.model import open_model

TOLERANCE = 1e-4
LAYOUTS = {
    # name: (config change, outputs of target layers the drafter must be fed)
    "specforge": ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 0]}}, [1, 2, 0]),
    "vllm": ({"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}, [0, 1, 2]),
    "eagle": ({}, [1, 1, 0]),  # no ids: the EAGLE repository's inputs of layers 2, L//2, L-3 with L = 4
}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> tuple[object, object, Path]:
    hf = tiny_model("llama")
    assert hf.config.num_hidden_layers == 4
    path = save(hf, tmp_path_factory.mktemp("target") / "hf", "llama3")
    model = open_model(str(path))
    return hf, model, load(plan_load(model, "cpu"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eagle3_is_fed_the_layers_its_framework_captured(target, tmp_path: Path, layout: str) -> None:
    hf, model, runtime = target
    change, expected = LAYOUTS[layout]
    directory = eagle3_checkpoint(tmp_path / layout, runtime.config)
    config = json.loads((directory / "config.json").read_text())
    config.pop("eagle_aux_hidden_state_layer_ids")
    write_json(directory / "config.json", {**config, **change})
    draft = open_model(str(directory))
    assert draft.config.drafter.tap_layout == layout
    drafter = load_drafter(draft, model, runtime)
    assert list(drafter.taps) == expected
    ids = torch.randint(0, hf.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        fed = runtime.forward(ids, torch.arange(12)[None], runtime.new_cache(1, 12), taps=drafter.taps).taps
        states = hf(ids, output_hidden_states=True).hidden_states  # [k + 1]: the output of decoder layer k
    by_hand = torch.cat([states[k + 1] for k in expected], dim=-1)
    assert fed.shape == by_hand.shape
    assert (fed - by_hand).abs().max() <= TOLERANCE
