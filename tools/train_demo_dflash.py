"""Train the demo's DFlash drafter for SmolLM2-135M-Instruct from nothing but the target's GGUF. Dev tool, not
packaged; it wrote demo/SmolLM2-135M-Instruct-DFlash/ (its figures: that folder's training.json).

    PYTHONPATH=<a directory holding the repository as specpair> python3 tools/train_demo_dflash.py \
        SmolLM2-135M-Instruct.Q4_1.gguf OUT [--device cuda] [--sweep] [--seed 0]

1. Prompts, written here: templates of chat, code, math, explanations and stories filled from word lists by a
   seeded generator, split into training and validation prompts; HELD_OUT (hand-written, the gate's built-in
   prompts among them) is never trained on and never used to choose anything. With --questions N, self-instruct
   widens them: N prompts ask the target to write a question or request some person might send about some
   subject, and what it writes (sampled at temperature 1, top-p 0.95; kept when it stopped on its own and is one
   paragraph of 16-400 characters) joins the training prompts. The templates alone teach their own wording: a
   drafter trained on them reached a validation tau of 2.0 but 1.45 on HELD_OUT.
2. Self-distillation data: the target's own greedy replies to the chat-wrapped prompts (with --sampled-replies N,
   N more per training prompt sampled at --reply-temperature, whose labels are the target's greedy choice at
   each position), generated in batches by `FastTarget` (the target in plain torch: cuBLAS and SDPA at a
   thousand rows a step, where the runtime's batch-invariant kernels are built for a few); each training batch's
   taps (the residual stream after layer k, as the DFlash drafter reads it, dflash.md §3.1) come from one
   forward of its sequences when it is drawn, so the data is token ids alone.
3. Training: `DFlashModel` is z-lab's DFlash forward as a plain torch module (dflash.md §3): taps -> fc ->
   hidden_norm give the context vectors, whose k/v every layer attends to; a block [anchor, mask x (B - 1)] at
   positions s .. s+B-1 of the target's embedding rows attends to the context before s and, bidirectionally, to
   itself; the final norm's rows 1..B-1 are read out by the target's head. Many blocks of a sequence train in
   one forward, each with its own mask (`block_mask`). Anchors are drawn where the replies are (the first is the
   prompt's last token, as specpair's loop drafts its first round); the loss is the cross-entropy of rows
   1..B-1 against the target's greedy tokens (with --soft, partly against its whole distribution there), row k
   weighted exp(-(k - 1) / γ), γ = B / 2 unless --position-decay sets it (z-lab's decay: a draft only counts when
   every draft before it was accepted, so the first rows count most towards τ; run O measured γ 1.5 against 4).
   The curve's tau is the loop's, teacher-forced (`chain_tau`), on validation and on HELD_OUT.
4. The drafter is written in z-lab's published layout (config.json with dflash_config, one bf16
   model.safetensors), loaded back through specpair's DFlash loader and run by specpair's speculative loop:
   tau (tokens per round) on the validation prompts (the sweep) and on HELD_OUT (the figure reported).
5. At the end, for training, validation, people's validation and HELD_OUT sequences: how often a block's first draft
   is the target's token, overall and by the target's own probability of that token (`first_draft_by_confidence`):
   whether the drafter lacks a kind of reply or the target makes it unpredictable.

--human FILE [FILE ...] adds prompts written for the project in people's wording, none a held-out task:
tools/demo_prompts.json (1,680 requests in four groups, code, writing, knowledge and everyday life) and
tools/demo_prompts_more.json (7,711 more in five: code and tech help, writing, knowledge, everyday life, math and
reasoning; none in the first file). --human-validation of the first file's join the validation prompts (the record's
people_validation is the loop's tau on them alone; the same split whatever files follow) and the rest train, each
greedy reply drawn --human-weight times as often as another sequence. --human-sampled-replies N gives each of them N
sampled replies more instead, each drawn as often as any other sequence: the weight repeats one reply (run M drew
each about 40 times), where sampled replies widen what the drafter sees of people's prompts.

--init DIR goes on training a drafter written before (the shipped one, say) instead of starting from random
weights: its config must be the recipe's (block, taps, mask token, layers, FFN width).

--target-layers K,... starts the drafter from the target's own decoder layers K (one a draft layer, the first right
after a tap: fc passes that tap through as the context, the stream the layer was trained to read; the FFN keeps its
largest neurons where the recipe's is narrower) instead of from random weights: what the target learnt in
pretraining, for a drafter that sees few million tokens. --lr sets the peak learning rate.

--data DIR keeps the data (prompts.json, sequences.safetensors: token ids) for a later run, which reads it instead of
making it; with --data-only the run stops there. A device call lasts at most 10 minutes: one call makes the data,
the next trains for the whole of its time. A schedule longer than a call (--steps N, no budget) runs over calls of
one machine: --stop-after-s S --state FILE stops it after S s and writes its state to FILE (on the machine: the
optimiser's state is twice the drafter's, in float32), and the same command in the next call goes on from it.

--sweep trains each candidate of SWEEP (one choice changed at a time from the first) for SWEEP_STEPS and picks
the best value of each choice by validation tau, then trains the chosen drafter for STEPS. Seeded: prompts,
initialisation and anchors come from --seed; on CUDA, deterministic algorithms are asked for (warn only).
Writes OUT/drafter/{config.json,model.safetensors} and OUT/training.json (curve, sweep, tau, timings).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from specpair.formats.packed import Packed
from specpair.runtime import loading
from specpair.runtime.drafters.loading import load_drafter
from specpair.runtime.generate import generate
from specpair.runtime.kernels.norm import rms_norm_reference
from specpair.runtime.model import Transformer
from specpair.runtime.sampling import Sampling
from specpair.runtime.speculative import acceptance_by_position, speculative_generate, step_times
from specpair.sources.model import Model, open_model

# ------------------------------------------------------------------------------------------------ prompts

# Never trained on, never used to choose: the gate's built-in prompts (cli/_gate.py), then prompts written apart
# from the templates below, in other words.
HELD_OUT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain to a ten-year-old why the sky is blue and sunsets are red.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and a unit test.",
    "Write a C function that reverses a singly linked list in place, and explain each step.",
    "My houseplants keep dying even though I water them every day. What am I doing wrong?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "Write a haiku about the first snow of winter.",
    "How do vaccines train the immune system?",
    "Write a JavaScript function that debounces another function.",
    "A shop sells pencils at 3 for 2 dollars. How much do 12 pencils cost?",
    "What are the pros and cons of working from home?",
    "Write a bash script that counts the lines in every .txt file in a folder.",
    "Tell me a bedtime story about a dragon who is afraid of the dark.",
    "Why do we have leap years?",
    "Write a SQL query that finds the three customers who spent the most last month.",
    "What is the difference between weather and climate?",
)

_TOPICS = (
    "photosynthesis",
    "black holes",
    "the water cycle",
    "plate tectonics",
    "the French Revolution",
    "inflation",
    "machine learning",
    "the immune system",
    "volcanoes",
    "the internet",
    "electricity",
    "gravity",
    "DNA",
    "the Roman Empire",
    "climate change",
    "supply and demand",
    "the human heart",
    "rainbows",
    "earthquakes",
    "compound interest",
    "the printing press",
    "solar panels",
    "tides",
    "the moon landing",
    "bees",
    "recycling",
    "antibiotics",
    "the stock market",
    "democracy",
    "coral reefs",
    "sleep",
    "memory",
    "the speed of light",
    "magnets",
    "nuclear energy",
    "the pyramids of Egypt",
    "evolution",
    "clouds",
    "cryptography",
    "the Industrial Revolution",
    "blood types",
    "batteries",
    "the ozone layer",
    "glaciers",
    "languages",
    "jet engines",
    "wind turbines",
    "the Silk Road",
    "vaccines",
    "operating systems",
)
_AUDIENCES = (
    "",
    " to a child",
    " to a beginner",
    " in simple terms",
    " in three paragraphs",
    " in one paragraph",
    " to a high school student",
    " with an example",
)
_EXPLAIN = (
    "Explain {t}{a}.",
    "What is {t}?",
    "How does {t} work?",
    "Describe {t}{a}.",
    "Give me a short overview of {t}.",
    "Why is {t} important?",
    "What are three facts about {t}?",
    "Write a paragraph about {t}.",
)
_LANGUAGES = ("Python", "JavaScript", "C", "Java", "Rust", "Go", "C++", "TypeScript")
_CODE_TASKS = (
    "checks whether a string is a palindrome",
    "sorts a list of numbers with bubble sort",
    "computes the factorial of a number",
    "finds the largest element in an array",
    "counts the vowels in a string",
    "merges two sorted lists",
    "checks whether a number is prime",
    "reverses the words in a sentence",
    "computes the greatest common divisor of two numbers",
    "removes duplicates from a list",
    "converts Celsius to Fahrenheit",
    "finds the second smallest number",
    "implements binary search",
    "counts how often each word appears in a text",
    "flattens a nested list",
    "checks whether two strings are anagrams",
    "computes the sum of the digits of a number",
    "returns the n-th prime number",
    "validates an email address",
    "transposes a matrix",
    "implements a stack with push and pop",
    "reads a file and prints its lines",
    "computes the mean of a list",
    "finds the longest word in a sentence",
    "converts a number to binary",
    "rotates an array by k positions",
)
_CODE = (
    "Write a {l} function that {k}.",
    "How do I write a {l} program that {k}?",
    "Show me {l} code that {k}, with comments.",
    "Write a {l} function that {k} and explain how it works.",
)
_CONCEPTS = (
    "a closure",
    "recursion",
    "a hash table",
    "a linked list",
    "big O notation",
    "a race condition",
    "object-oriented programming",
    "a REST API",
    "garbage collection",
    "a binary tree",
    "unit testing",
    "version control",
    "a compiler",
    "dynamic programming",
    "a regular expression",
    "a database index",
)
_CODE_EXPLAIN = ("Explain {c} in programming.", "What is {c}? Give an example in {l}.", "When should I use {c}?")
_NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kofi", "Lena")
_ITEMS = ("apples", "books", "marbles", "stickers", "cookies", "pencils", "coins", "cards", "shells", "stamps")
_PLACES = (
    "a baker",
    "a wizard",
    "a robot",
    "a young girl",
    "an old fisherman",
    "a cat",
    "a detective",
    "a knight",
    "a farmer",
    "an astronaut",
    "a painter",
    "a little fox",
    "a teacher",
    "a pirate captain",
    "a musician",
    "a shy giant",
    "a clockmaker",
    "a mountain guide",
)
_EVENTS = (
    "discovers a hidden door",
    "loses something precious",
    "meets a talking animal",
    "has to save the village",
    "finds a mysterious map",
    "learns to fly",
    "makes an unlikely friend",
    "travels back in time",
    "wins a strange contest",
    "gets lost in a forest",
    "opens a magic shop",
    "builds a machine",
    "hears a song nobody else can hear",
    "receives a letter from the future",
)
_SETTINGS = (
    "",
    " in a big city",
    " on a faraway planet",
    " in a snowy village",
    " under the sea",
    " in an old castle",
    " on a train",
    " in the desert",
)
_STORY = (
    "Write a short story about {p} who {e}{s}.",
    "Tell me a story about {p} who {e}{s}.",
    "Write a fairy tale about {p} who {e}.",
    "Write the opening paragraph of a story about {p} who {e}{s}.",
)
_ACTIVITIES = (
    "learning a new language",
    "staying focused while studying",
    "saving money",
    "sleeping better",
    "running a first marathon",
    "cooking for a family",
    "starting a vegetable garden",
    "making friends in a new city",
    "preparing for a job interview",
    "reducing stress",
    "traveling on a budget",
    "keeping a clean kitchen",
    "learning to play the guitar",
    "writing a good essay",
    "taking care of a puppy",
    "public speaking",
)
_CHAT = (
    "Give me {n} tips for {v}.",
    "What is the best way to get started with {v}?",
    "I need advice on {v}. Where should I begin?",
    "Make a checklist for {v}.",
)
_SUBJECTS = (
    "the ocean",
    "autumn leaves",
    "a city at night",
    "friendship",
    "the mountains",
    "a rainy day",
    "coffee",
    "the stars",
    "an old tree",
    "the first day of school",
    "a quiet morning",
    "time",
)
_WRITING = (
    "Write a poem about {o}.",
    "Write a short poem about {o} that rhymes.",
    "Write a limerick about {o}.",
    "Describe {o} in vivid detail.",
)
_RECIPIENTS = ("my manager", "a teacher", "a landlord", "a friend", "a customer", "my neighbor", "a colleague")
_REASONS = (
    "asking for a day off",
    "thanking them for their help",
    "reporting a broken heater",
    "inviting them to a party",
    "apologizing for a late reply",
    "asking for feedback on a project",
)
_EMAIL = ("Write an email to {r} {w}.", "Write a polite message to {r} {w}.")


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
    n, it = rng.choice(_NAMES), rng.choice(_ITEMS)
    return rng.choice(
        (
            f"What is {a} times {b}?",
            f"What is {a * 10 + b} plus {b * 7 + a}?",
            f"Solve for x: {c}x + {a} = {a + c * b}.",
            f"{n} has {a + b} {it} and gives {b} of them away. How many {it} does {n} have left?",
            f"A train travels {a * c} kilometers in {c} hours. What is its average speed?",
            f"What is {c * 5} percent of {a * 20}?",
            f"Is {a * 2 + 1} a prime number? Explain.",
            f"{n} buys {c} {it} for {a} dollars each. How much does {n} pay in total?",
            f"What is the area of a rectangle that is {a} meters long and {c} meters wide?",
            f"Find the average of {a}, {b} and {c}.",
            f"A recipe needs {c} eggs for {a % 6 + 2} people. How many eggs are needed for {a % 6 + 2 + c} people?",
            f"Convert {a * 3} minutes into hours and minutes.",
        )
    )


def _one_prompt(rng: random.Random) -> str:
    kind = rng.choice(
        (
            "explain",
            "explain",
            "code",
            "code",
            "code_concept",
            "math",
            "math",
            "story",
            "story",
            "chat",
            "writing",
            "email",
        )
    )
    if kind == "explain":
        return rng.choice(_EXPLAIN).format(t=rng.choice(_TOPICS), a=rng.choice(_AUDIENCES))
    if kind == "code":
        return rng.choice(_CODE).format(l=rng.choice(_LANGUAGES), k=rng.choice(_CODE_TASKS))
    if kind == "code_concept":
        return rng.choice(_CODE_EXPLAIN).format(c=rng.choice(_CONCEPTS), l=rng.choice(_LANGUAGES))
    if kind == "math":
        return _math(rng)
    if kind == "story":
        return rng.choice(_STORY).format(p=rng.choice(_PLACES), e=rng.choice(_EVENTS), s=rng.choice(_SETTINGS))
    if kind == "chat":
        return rng.choice(_CHAT).format(n=rng.choice(("three", "five", "some")), v=rng.choice(_ACTIVITIES))
    if kind == "writing":
        return rng.choice(_WRITING).format(o=rng.choice(_SUBJECTS))
    return rng.choice(_EMAIL).format(r=rng.choice(_RECIPIENTS), w=rng.choice(_REASONS))


_PERSONAS = (
    "a student",
    "a parent",
    "a retired teacher",
    "a software developer",
    "a nurse",
    "a small business owner",
    "a curious child",
    "a gardener",
    "a traveller",
    "a beginner programmer",
    "a chef",
    "a history lover",
    "a musician",
    "a journalist",
    "a farmer",
    "an artist",
    "a data analyst",
    "a new employee",
    "a high school teacher",
    "a college student",
    "a grandparent",
    "a personal trainer",
    "a librarian",
    "a game designer",
    "a photographer",
    "a shop assistant",
    "a scientist",
    "a writer",
    "a mechanic",
    "a lawyer",
    "a doctor",
    "a startup founder",
    "a teenager",
    "a tourist",
)
_ASKING = (
    "Write one question that {p} might ask an AI assistant about {s}. Write only the question.",
    "Write a request that {p} could send to a chatbot about {s}. Write only the request.",
    "What might {p} ask a helpful assistant about {s}? Reply with the question only.",
    "Write a task that {p} could give an AI assistant, related to {s}. Write only the task.",
    "Write a short message in which {p} asks for help with {s}. Write only the message.",
    "Write an instruction that {p} might give a writing assistant about {s}. Write only the instruction.",
    "What would {p} want to know about {s}? Write it as one question.",
    "Imagine {p} is chatting with an assistant about {s}. Write their first message only.",
)


def asking_prompts(count: int, seed: int) -> list[str]:
    """`count` distinct prompts asking the target to write a user's question or request (self-instruct): its
    sampled answers become training prompts in wordings no template here has."""
    rng = random.Random(seed + 1)
    subjects = (
        _TOPICS
        + _SUBJECTS
        + _CONCEPTS
        + _ACTIVITIES
        + tuple(f"a {lang} function that {t}" for lang in _LANGUAGES for t in _CODE_TASKS)
    )
    drawn: dict[str, None] = {}
    for _ in range(50 * count):
        drawn[rng.choice(_ASKING).format(p=rng.choice(_PERSONAS), s=rng.choice(subjects))] = None
        if len(drawn) == count:
            break
    return list(drawn)


def written_prompt(reply: str, excluded: set[str]) -> str | None:
    """The question or request a reply to an `asking_prompts` prompt holds, or None where it holds none usable
    (too short or long, several paragraphs, or one of `excluded`)."""
    text = reply.strip().strip('"').strip()
    head, _, rest = text.partition(":")
    if head.lower() in ("question", "request", "task") and rest:
        text = rest.strip().strip('"').strip()
    if not 16 <= len(text) <= 400 or "\n\n" in text or text in excluded:
        return None
    return text


def human_prompt_sets(paths: list[Path], validation: int, seed: int) -> tuple[list[str], list[str]]:
    """The prompts written for the project in people's wording (`paths`: JSON arrays of strings), distinct and none
    in HELD_OUT: the first file's split by a generator seeded by `seed` into training prompts and `validation` others
    (the same split whatever files follow it), every other file's all training prompts."""
    first, *more = paths
    written = [p for p in dict.fromkeys(json.loads(first.read_text())) if p not in set(HELD_OUT)]
    if validation >= len(written):
        raise ValueError(f"{first} holds {len(written)} usable prompts: too few to keep {validation} for validation")
    random.Random(seed + 2).shuffle(written)
    kept = set(written) | set(HELD_OUT)
    added = [p for p in dict.fromkeys(p for path in more for p in json.loads(path.read_text())) if p not in kept]
    return written[validation:] + added, written[:validation]


def prompt_sets(count: int, validation: int, seed: int) -> tuple[list[str], list[str]]:
    """`count` distinct training prompts and `validation` others, drawn from the templates; none is in HELD_OUT."""
    rng = random.Random(seed)
    seen, drawn = set(HELD_OUT), []
    for _ in range(100 * (count + validation)):
        prompt = _one_prompt(rng)
        if prompt not in seen:
            seen.add(prompt)
            drawn.append(prompt)
            if len(drawn) == count + validation:
                break
    if len(drawn) < count + validation:
        raise ValueError(f"the templates give only {len(drawn)} distinct prompts, not {count + validation}")
    return drawn[validation:], drawn[:validation]


# ------------------------------------------------------------------------------------------------ data


def written_prompts(
    target: FastTarget, tokenizer, count: int, tokens: int, stops: list[int], batch: int, seed: int, log=print
) -> list[str]:
    """The usable questions and requests the target writes, sampled (temperature 1, top-p 0.95, `seed`), when
    `count` `asking_prompts` ask it for one; none is in HELD_OUT."""
    asking = asking_prompts(count, seed)
    ids = chat_ids(tokenizer, asking)
    written: dict[str, None] = {}
    excluded = set(HELD_OUT)
    clock = time.perf_counter()
    for first in range(0, len(ids), batch):
        out = target.generate(ids[first : first + batch], tokens, stops, 1.0, 0.95, seed + first)
        for reply, stopped in out:
            if stopped:  # a question cut by the token limit is not one
                text = written_prompt(tokenizer.decode(reply[:-1]), excluded)
                if text is not None:
                    written[text] = None
        log(
            f"  asked {first + len(out)}/{len(ids)}: {len(written)} usable so far ({time.perf_counter() - clock:.0f} s)"
        )
    return list(written)


class FastTarget:
    """The target's decoder in plain torch over its dense weights (cuBLAS products, SDPA attention): the data's
    replies and the taps each training batch reads, at the throughput training needs. The runtime's kernels are
    batch-invariant weight streamers built for a few rows a step: at a thousand rows a step they generated at
    ~48K tok/s on an H200, which held the data to ~4 M reply tokens, and the taps of every sequence held on the
    GPU ran an H100 out of memory at 30,000 sequences. This is not the runtime's arithmetic (where two logits
    nearly tie its greedy token may differ from the runtime's), so the labels are its own tokens and the drafter
    trains on its taps, which agree with the runtime's to rounding (tests/test_demo_dflash.py). Llama-shaped
    targets only (SmolLM2's): full attention, no q/k norm, no biases."""

    def __init__(self, target: Transformer) -> None:
        c = target.config
        odd = c.qk_norm or c.attention_bias or c.mlp_bias or c.attn_output_gate
        if odd or set(c.layer_types) != {"full"} or c.is_moe:
            raise SystemExit(f"FastTarget runs Llama-shaped targets (SmolLM2's); this one is a {c.family}")
        self.embed, self.head = target.embed_tokens, _dense([target.lm_head])
        self.norm, self.rope = target.norm.weight, target.rope
        self.eps, self.zero_centred = c.rms_norm_eps, c.zero_centred_norms
        self.heads, self.kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.layers = [
            (
                layer.input_norm.weight,
                _dense([w for w, _ in layer.mixer.qkv.groups]),
                _dense([layer.mixer.o_proj]),
                layer.post_norm.weight,
                _dense([w for w, _ in layer.mlp.gate_up.groups]),
                _dense([layer.mlp.down_proj]),
            )
            for layer in target.layers
        ]

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def _rms(self, x: Tensor, weight: Tensor) -> Tensor:
        return rms_norm_reference(x, weight, self.eps, self.zero_centred)  # plain torch, any device

    def _layers(self, tokens: Tensor, positions: Tensor, attend, taps: tuple[int, ...], upto: int):
        """The stream after layer upto - 1 and {k: the stream after layer k} for k in `taps`; `attend(i, q, k, v)`
        ([B, T, heads, D] each) gives layer i's attention output [B, T, heads * D]."""
        x = self.embed[tokens]
        b, t = tokens.shape
        cos, sin = self.rope.tables(positions)
        sizes = [self.heads * self.head_dim, *[self.kv_heads * self.head_dim] * 2]
        kept = {}
        for i, (before, qkv, o, after, gate_up, down) in enumerate(self.layers[:upto]):
            q, k, v = (self._rms(x, before) @ qkv.T).split(sizes, dim=-1)
            q = self.rope.rotate(q.view(b, t, -1, self.head_dim), cos, sin)
            k = self.rope.rotate(k.view(b, t, -1, self.head_dim), cos, sin)
            x = x + attend(i, q, k, v.view(b, t, -1, self.head_dim)) @ o.T
            gate, up = (self._rms(x, after) @ gate_up.T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ down.T
            if i in taps:
                kept[i] = x
        return x, kept

    @torch.no_grad()
    def taps(self, tokens: Tensor, layers: tuple[int, ...], final: bool = False) -> tuple[Tensor, Tensor | None]:
        """Over right-padded sequences [b, L] from position 0: the streams after `layers` [b, L, len, H] and, with
        `final`, the final normed hidden state [b, L, H] (the head's input: the target's distribution)."""
        groups = self.heads // self.kv_heads

        def causal(_: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            keys, values = (z.transpose(1, 2).repeat_interleave(groups, dim=1) for z in (k, v))
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=True)
            return out.transpose(1, 2).flatten(2)

        positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        upto = len(self.layers) if final else max(layers) + 1
        x, kept = self._layers(tokens, positions, causal, tuple(layers), upto)
        return torch.stack([kept[k] for k in layers], dim=2), self._rms(x, self.norm) if final else None

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        new_tokens: int,
        stops: list[int],
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[tuple[list[int], bool]]:
        """Each prompt's reply (greedy, or sampled at `temperature` within `top_p` of the TOP_K most likely tokens,
        seeded) of up to `new_tokens` tokens, cut after its first stop token, and whether it stopped. The prompts
        are left-padded into one batch over a cache of slots: a query sees the slots from its prompt's first to its
        own. A decode step has one shape whatever its slot (it attends to every slot, masked), so on CUDA it is
        one graph replayed: eager, ~1,500 launches a step held a thousand rows to 13.5K tok/s on an H100."""
        device, b = self.device, len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        width = int(lengths.max())
        slots = torch.arange(width + new_tokens, device=device)
        pads = width - lengths
        tokens = torch.zeros(b, width, dtype=torch.int64, device=device)
        for i, p in enumerate(prompts):
            tokens[i, width - len(p) :] = torch.tensor(p, device=device)
        real = slots[None] >= pads[:, None]  # [b, slots]: holds a token of the sequence
        shape = (len(self.layers), b, self.kv_heads, len(slots), self.head_dim)
        keys = torch.zeros(shape, dtype=self.embed.dtype, device=device)
        values = torch.zeros_like(keys)
        groups = self.heads // self.kv_heads

        def cached(first: Tensor, t: int):
            """Attention for the t tokens written at slots first.. over every slot (unwritten ones masked)."""
            own = (first + torch.arange(t, device=device))[:, None]
            # a padding slot's query sees itself alone: a row with nothing to see is NaN, and NaN keys poison
            sees = (real[:, None] & (slots <= own)[None]) | (slots == own)[None]
            sees = sees[:, None, None].expand(-1, 1, groups, -1, -1).reshape(b, 1, groups * t, len(slots))
            written = own[:, 0]

            def attend(i: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                keys[i].index_copy_(2, written, k.transpose(1, 2))
                values[i].index_copy_(2, written, v.transpose(1, 2))
                grouped = q.transpose(1, 2).reshape(b, self.kv_heads, groups * t, self.head_dim)
                out = F.scaled_dot_product_attention(grouped, keys[i], values[i], attn_mask=sees)
                return out.view(b, self.kv_heads, groups, t, self.head_dim).flatten(1, 2).transpose(1, 2).flatten(2)

            return attend

        def scores_of(x: Tensor) -> Tensor:
            return (self._rms(x[:, -1], self.norm) @ self.head.T).float()

        positions = (torch.arange(width, device=device)[None] - pads[:, None]).clamp(min=0)
        scores = scores_of(
            self._layers(
                tokens,
                positions,
                cached(torch.zeros((), dtype=torch.int64, device=device), width),
                (),
                len(self.layers),
            )[0]
        )
        token, slot = (
            torch.zeros(b, dtype=torch.int64, device=device),
            torch.zeros((), dtype=torch.int64, device=device),
        )

        def step() -> Tensor:
            out, _ = self._layers(
                token[:, None], (lengths + slot - width)[:, None], cached(slot, 1), (), len(self.layers)
            )
            return scores_of(out)

        decode = step
        if device.type == "cuda" and new_tokens > 1:
            slot.fill_(width)  # warmed up and captured writing the first slot the loop writes
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                graphed = step()

            def decode() -> Tensor:
                graph.replay()
                return graphed

        generator = torch.Generator(device=device).manual_seed(seed)
        chosen = torch.zeros(b, new_tokens, dtype=torch.int64, device=device)
        ends = torch.full((b,), new_tokens, device=device)
        stopped = torch.zeros(b, dtype=torch.bool, device=device)
        stop_ids = torch.tensor(stops, dtype=torch.int64, device=device)
        for t in range(new_tokens):
            token.copy_(self._choose(scores, temperature, top_p, generator))
            chosen[:, t] = token
            now = torch.isin(token, stop_ids) & ~stopped
            ends = torch.where(now, t + 1, ends)
            stopped |= now
            if t == new_tokens - 1 or (t % 16 == 15 and bool(stopped.all())):
                break
            slot.fill_(width + t)
            scores = decode()
        return [(row[:end].tolist(), s) for row, end, s in zip(chosen.cpu(), ends.tolist(), stopped.tolist())]

    @staticmethod
    def _choose(scores: Tensor, temperature: float, top_p: float, generator: torch.Generator) -> Tensor:
        if temperature == 0:
            return scores.argmax(-1)
        ranked, order = (scores / temperature).topk(TOP_K, dim=-1)  # sorted: a sort of the vocabulary costs more
        probs = ranked.softmax(-1)
        probs[probs.cumsum(-1) - probs > top_p] = 0  # the smallest head of the ranking that reaches top_p
        return order.gather(-1, torch.multinomial(probs, 1, generator=generator)).squeeze(-1)


TOP_K = 256  # FastTarget samples among these many most likely tokens


@dataclass
class Data:
    """Self-distillation sequences, right-padded: tokens [N, L], the first reply token's index and the length of
    each. A batch's taps are computed when it is selected, by one forward of `target` (no sequence's taps are
    held), and with `final` the target's final normed hidden state too, which its head turns into its
    distribution and its greedy choice of every token (a sampled reply's labels)."""

    tokens: Tensor
    starts: Tensor
    lengths: Tensor
    target: FastTarget
    final: bool = False

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def join(self, other: Data) -> Data:
        """These sequences, then `other`'s."""
        width = max(self.tokens.shape[1], other.tokens.shape[1])
        tokens = torch.cat([F.pad(d.tokens, (0, width - d.tokens.shape[1])) for d in (self, other)])
        starts, lengths = (torch.cat(pair) for pair in ((self.starts, other.starts), (self.lengths, other.lengths)))
        return Data(tokens, starts, lengths, self.target, self.final or other.final)

    def select(self, rows: Tensor, layers: tuple[int, ...]) -> Batch:
        """Sequences `rows`, cut to the longest of them, with the taps of `layers` concatenated [n, L, len * H];
        zeros past each sequence's end (blocks near an end read rows there, weighted 0 but still multiplied).
        Labels: the sequence's own tokens, or with `final` the target's greedy choice at each position."""
        rows = rows.to(self.device)
        lengths = self.lengths[rows]
        tokens = self.tokens[rows, : int(lengths.max())]
        taps, final = self.target.taps(tokens, layers, self.final)
        inside = (torch.arange(tokens.shape[1], device=self.device) < lengths[:, None])[:, :, None]
        labels = tokens
        if final is not None:
            final = final * inside
            # a sequence at a time: the whole batch's logits [n, L, V] would take gigabytes
            greedy = torch.stack([(f @ self.target.head.T).argmax(-1) for f in final[:, :-1]])
            labels = torch.cat((tokens[:, :1], greedy), dim=1)
        return Batch(tokens, self.starts[rows], lengths, taps.flatten(2) * inside, final, labels)


@dataclass
class Batch:
    """Some sequences of `Data`, cut to the longest of them by `cut`; labels [n, L]: the target's greedy choice of
    each token (the token itself in a greedy reply)."""

    tokens: Tensor
    starts: Tensor
    lengths: Tensor
    taps: Tensor
    final: Tensor | None
    labels: Tensor

    def cut(self, width: int) -> Batch:
        final = None if self.final is None else self.final[:, :width]
        return Batch(
            self.tokens[:, :width], self.starts, self.lengths, self.taps[:, :width], final, self.labels[:, :width]
        )

    def part(self, rows: slice, width: int | None = None) -> Batch:
        """Sequences `rows` of these, cut to `width` (None: the longest of them)."""
        final = None if self.final is None else self.final[rows]
        part = Batch(
            self.tokens[rows], self.starts[rows], self.lengths[rows], self.taps[rows], final, self.labels[rows]
        )
        return part.cut(int(part.lengths.max()) if width is None else width)

    def parts(self, count: int) -> list[Batch]:
        """These sequences in `count` equal parts in order, each cut to the longest of it. The widths are read to
        the host once: a read a part would wait for the GPU to finish the step before, every step."""
        size = len(self.lengths) // count
        widths = self.lengths[: size * count].view(count, size).amax(1).tolist()
        return [self.part(slice(i * size, (i + 1) * size), width) for i, width in enumerate(widths)]


def chat_ids(tokenizer, prompts: list[str]) -> list[list[int]]:
    """The prompts wrapped in the target's chat template as a user message, as `specpair run --chat` does."""
    return [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False)
        for p in prompts
    ]


def self_distil(
    target: FastTarget,
    prompts: list[list[int]],
    new_tokens: int,
    stops: list[int],
    batch: int,
    log=print,
    temperature: float = 0.0,
    seed: int = 0,
) -> Data:
    """The target's replies to `prompts`, greedy or sampled at `temperature` (seeded), generated `batch` prompts at a
    time (by length, so that little is padding)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    sequences: list[list[int]] = [[]] * len(prompts)
    clock = time.perf_counter()
    for first in range(0, len(order), batch):
        group = order[first : first + batch]
        replies = target.generate([prompts[i] for i in group], new_tokens, stops, temperature, 1.0, seed + first)
        for i, (reply, _) in zip(group, replies):
            sequences[i] = prompts[i] + reply
        replied = sum(len(sequences[i]) - len(prompts[i]) for i in order[: first + len(group)])
        rate = replied / (time.perf_counter() - clock)
        log(f"  generated {first + len(group)}/{len(prompts)} replies ({rate:.0f} tok/s)")
    tokens = torch.zeros(len(prompts), max(len(s) for s in sequences), dtype=torch.int64)
    for i, s in enumerate(sequences):
        tokens[i, : len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in sequences])
    starts = torch.tensor([len(p) for p in prompts])
    log(f"  {int(lengths.sum())} tokens ({int((lengths - starts).sum())} replied)")
    device = target.device
    return Data(tokens.to(device), starts.to(device), lengths.to(device), target)


# ------------------------------------------------------------------------------------------------ the drafter


@dataclass(frozen=True)
class Recipe:
    """One drafter and how it trains."""

    block_size: int = 8
    layers: int = 1
    intermediate: int = 1536
    taps: tuple[int, ...] = (1, 14, 27)
    mask_token_id: int = 16  # SmolLM2's <empty_output>: a special token chat text never contains
    heads: int = 9  # the target's attention shape: 9 query heads and 3 KV heads of 64
    kv_heads: int = 3
    head_dim: int = 64
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-6
    steps: int = 4000
    sequences: int = 32  # per step
    blocks: int = 16  # anchors per sequence per step
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    soft: float = 0.0  # the loss's share on the target's whole distribution (the rest: its greedy token)
    position_decay: float | None = None  # γ of row k's loss weight exp(-(k - 1) / γ); None: B / 2, z-lab's

    def describe(self) -> str:
        return (
            f"block {self.block_size}, {self.layers} layer(s) x FFN {self.intermediate}, taps {list(self.taps)}, "
            f"mask {self.mask_token_id}"
        )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * h).to(x.dtype)


def rotate(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotary embedding, split-half (neox) over the whole head: x [b, T, heads, d], positions [b, T]."""
    d = x.shape[-1]
    inverse = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.float()[..., None] * inverse
    cos, sin = torch.cat((angles, angles), -1).cos()[:, :, None], torch.cat((angles, angles), -1).sin()[:, :, None]
    half = x.float()
    rotated = torch.cat((-half[..., d // 2 :], half[..., : d // 2]), -1)
    return (half * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, hidden: int, r: Recipe) -> None:
        super().__init__()
        self.r = r
        self.q_proj = nn.Linear(hidden, r.heads * r.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, r.kv_heads * r.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, r.kv_heads * r.head_dim, bias=False)
        self.o_proj = nn.Linear(r.heads * r.head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(r.head_dim, r.rms_norm_eps)
        self.k_norm = RMSNorm(r.head_dim, r.rms_norm_eps)

    def forward(self, x: Tensor, context: Tensor, positions: Tensor, context_positions: Tensor, mask: Tensor) -> Tensor:
        """x [b, Q, H] block rows at `positions`; context [b, L, H] (hidden_norm(fc(taps))) at `context_positions`;
        mask [b, Q, L + Q]: which context and block keys each block row sees."""
        r, (b, q_rows, _), width = self.r, x.shape, context.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, q_rows, r.heads, r.head_dim))
        k = torch.cat((self.k_proj(context), self.k_proj(x)), 1).view(b, width + q_rows, r.kv_heads, r.head_dim)
        v = torch.cat((self.v_proj(context), self.v_proj(x)), 1).view(b, width + q_rows, r.kv_heads, r.head_dim)
        q = rotate(q, positions, r.rope_theta)
        k = rotate(self.k_norm(k), torch.cat((context_positions, positions), 1), r.rope_theta)
        group = r.heads // r.kv_heads
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None]
        )
        return self.o_proj(o.transpose(1, 2).reshape(b, q_rows, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, hidden: int, r: Recipe) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, r.rms_norm_eps)
        self.self_attn = Attention(hidden, r)
        self.post_attention_layernorm = RMSNorm(hidden, r.rms_norm_eps)
        self.mlp = MLP(hidden, r.intermediate)

    def forward(self, h: Tensor, context: Tensor, positions: Tensor, context_positions: Tensor, mask: Tensor) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), context, positions, context_positions, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashModel(nn.Module):
    """z-lab's DFlashDraftModel forward (full-attention layers, bidirectional within the block); its parameter
    names are the published layout's."""

    def __init__(self, hidden: int, r: Recipe) -> None:
        super().__init__()
        self.fc = nn.Linear(len(r.taps) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, r.rms_norm_eps)
        self.layers = nn.ModuleList(Layer(hidden, r) for _ in range(r.layers))
        self.norm = RMSNorm(hidden, r.rms_norm_eps)

    def forward(self, taps: Tensor, block: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        """taps [b, L, n * H] at positions 0..L-1; block [b, Q, H] embeddings at `positions` [b, Q]."""
        context = self.hidden_norm(self.fc(taps))
        context_positions = torch.arange(taps.shape[1], device=taps.device).expand(taps.shape[0], -1)
        h = block
        for layer in self.layers:
            h = layer(h, context, positions, context_positions, mask)
        return self.norm(h)


def block_mask(anchors: Tensor, width: int, block: int) -> Tensor:
    """[b, n * block, width + n * block] for the n blocks of each sequence anchored at `anchors` [b, n]: a row of
    the block at s sees the context positions < s and every row of its own block (z-lab's full-attention rule)."""
    b, n = anchors.shape
    device = anchors.device
    row_anchor = anchors.repeat_interleave(block, dim=1)  # [b, n * block]
    context = torch.arange(width, device=device)[None, None, :] < row_anchor[:, :, None]
    which = torch.arange(n, device=device).repeat_interleave(block)
    own = (which[:, None] == which[None, :]).expand(b, -1, -1)
    return torch.cat((context, own), dim=2)


def draw_anchors(starts: Tensor, lengths: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """[b, count] anchors, uniform over start - 1 .. length - 2 of each sequence: the prompt's last token, then
    every reply token that has a token after it."""
    u = torch.rand(starts.shape[0], count, generator=generator, device=generator.device)
    span = (lengths - starts).clamp(min=1)
    return (starts - 1)[:, None] + (u * span[:, None]).long().clamp(max=(span - 1)[:, None])


def block_logits(
    model: DFlashModel, embed: Tensor, head: Tensor, tokens: Tensor, taps: Tensor, anchors: Tensor, r: Recipe
) -> Tensor:
    """[b, n, B - 1, V] float32: the head's logits of rows 1..B-1 of the blocks [anchor, mask x (B - 1)] anchored
    at `anchors` [b, n], each over the context before its anchor."""
    b, n = anchors.shape
    B = r.block_size
    positions = (anchors[:, :, None] + torch.arange(B, device=tokens.device)).reshape(b, n * B)
    ids = torch.full_like(positions, r.mask_token_id)
    ids[:, ::B] = tokens.gather(1, anchors)
    out = model(taps, embed[ids], positions, block_mask(anchors, taps.shape[1], B))
    rows = out.view(b, n, B, -1)[:, :, 1:]
    return (rows @ head.T.to(rows.dtype)).float()


def block_labels(batch: Batch, anchors: Tensor, r: Recipe) -> tuple[Tensor, Tensor, Tensor]:
    """For rows 1..B-1 of the blocks anchored at `anchors` [b, n]: the positions of their tokens, their labels and
    whether they count, each [b, n, B - 1]. A row counts inside its sequence and where every row before it in the
    block holds the target's greedy token: the loop drafts row k only after rows 1..k-1 were accepted, and a
    sampled reply may leave the greedy path inside a block."""
    b, n = anchors.shape
    offsets = torch.arange(1, r.block_size, device=anchors.device)
    following = (anchors[:, :, None] + offsets).clamp(max=batch.tokens.shape[1] - 1)
    labels = batch.labels.gather(1, following.view(b, -1)).view(b, n, -1)
    greedy = (batch.tokens.gather(1, following.view(b, -1)).view(b, n, -1) == labels).long()
    on_path = torch.cat((torch.ones_like(greedy[..., :1]), greedy[..., :-1].cumprod(-1)), dim=-1).bool()
    return following, labels, (anchors[:, :, None] + offsets < batch.lengths[:, None, None]) & on_path


def block_loss(
    model: DFlashModel, embed: Tensor, head: Tensor, batch: Batch, anchors: Tensor, r: Recipe
) -> tuple[Tensor, Tensor]:
    """(the weighted loss of every block's rows 1..B-1, and the drafts each block would have had accepted,
    [b, n]: its leading rows whose argmax is the label). A row's loss is the cross-entropy against its label (the
    target's greedy choice of that token) and, with `r.soft`, that share of it against the target's whole
    distribution there (its head over the final hidden state one position before); a row after one whose token
    is not the target's greedy choice (in a sampled reply) counts for nothing: the loop never drafts there."""
    b, n = anchors.shape
    offsets = torch.arange(1, r.block_size, device=anchors.device)
    logits = block_logits(model, embed, head, batch.tokens, batch.taps, anchors, r)
    following, labels, valid = block_labels(batch, anchors, r)
    weights = valid * torch.exp(-(offsets.float() - 1) / (r.position_decay or r.block_size / 2))
    flat = logits.reshape(-1, logits.shape[-1])
    losses = F.cross_entropy(flat, labels.reshape(-1), reduction="none")
    if r.soft:
        before = batch.final.gather(1, (following - 1).view(b, -1, 1).expand(-1, -1, batch.final.shape[-1]))
        teacher = (before @ head.T.to(before.dtype)).float().softmax(-1).reshape_as(flat)
        losses = (1 - r.soft) * losses + r.soft * F.cross_entropy(flat, teacher, reduction="none")
    loss = (losses.view_as(weights) * weights).sum() / weights.sum()
    hits = (logits.argmax(-1) == labels) & valid
    return loss, hits.long().cumprod(-1).sum(-1)


def span_anchors(batch: Batch, span: int) -> tuple[Tensor, Tensor, Tensor]:
    """The anchors of the first `span` reply tokens of each sequence of `batch`, [b, span]: the prompt's last token
    and every reply token before the span's end (clamped there: `drafted` says which are its own), with the span's
    ends [b] (its last token at end - 1)."""
    ends = torch.minimum(batch.lengths, batch.starts + span)
    anchors = (batch.starts - 1)[:, None] + torch.arange(span, device=ends.device)
    drafted = anchors + 1 < ends[:, None]  # the anchor's first draft is a reply token of the span
    return anchors.clamp(max=(ends - 2)[:, None]), drafted, ends


@torch.no_grad()
def chain_tau(model: DFlashModel, data: Data, rows: Tensor, embed: Tensor, head: Tensor, r: Recipe, span: int) -> float:
    """Tokens per round of specpair's greedy loop over the first `span` reply tokens of sequences `rows`,
    teacher-forced: the loop's first round is anchored at the prompt's last token, and a round anchored at a that
    has k drafts accepted commits k + 1 tokens and anchors the next round at a + k + 1; with greedy replies the
    context before every anchor is the one the loop has, so this is the loop's tau. Drafting at every anchor of
    the span is one forward; only the loop's walk is sequential. (An average over all anchors counts each easy
    token of a long accepted run as an anchor of its own and says more: for run C's drafter, 2.05 over
    HELD_OUT's first 64 reply tokens at block 8, where the loop's tau is 1.77.)"""
    autocast = torch.autocast(embed.device.type, dtype=torch.bfloat16, enabled=embed.device.type == "cuda")
    committed = rounds = 0
    for first in range(0, len(rows), 8):
        batch = data.select(rows[first : first + 8], r.taps)
        anchors, _, ends = span_anchors(batch, span)  # the loop's last token is at end - 1
        with autocast:
            _, hits = block_loss(model, embed, head, replace(batch, lengths=ends).cut(int(ends.max())), anchors, r)
        for start, end, accepted in zip(batch.starts.tolist(), ends.tolist(), hits.tolist()):
            anchor = start - 1
            while anchor < end - 1:
                commit = min(accepted[anchor - start + 1] + 1, end - 1 - anchor)
                committed, rounds, anchor = committed + commit, rounds + 1, anchor + commit
    return committed / max(rounds, 1)


# Bins of the target's probability of its greedy token for `first_draft_by_confidence`: [0, 0.3), ..., [0.9, 1]
CONFIDENCE_EDGES = (0.3, 0.5, 0.7, 0.9)


@torch.no_grad()
def first_draft_by_confidence(
    model: DFlashModel, data: Data, rows: Tensor, embed: Tensor, head: Tensor, r: Recipe, span: int
) -> dict:
    """How often a block's first draft is the target's greedy token, over every anchor of the first `span` reply
    tokens of the greedy sequences `rows` (teacher-forced), overall and by the target's own probability of that
    token (its head over the final hidden state before it), binned at CONFIDENCE_EDGES. It tells a drafter that has
    not learnt a kind of reply from a reply the target itself makes unpredictable: where the target is sure, a
    drafter that has learnt its replies drafts its token (the shipped drafter: 0.95 on validation prompts, 0.70 on
    HELD_OUT, whose shares of sure tokens are the same)."""
    autocast = torch.autocast(embed.device.type, dtype=torch.bfloat16, enabled=embed.device.type == "cuda")
    with_final = replace(data, final=True)  # the target's final hidden states: its probabilities
    hits, sure = [], []
    for first in range(0, len(rows), 8):
        batch = with_final.select(rows[first : first + 8], r.taps)
        anchors, drafted, _ = span_anchors(batch, span)
        with autocast:
            logits = block_logits(model, embed, head, batch.tokens, batch.taps, anchors, r)[:, :, 0]
        labels = batch.labels.gather(1, anchors + 1)
        before = batch.final.gather(1, anchors[..., None].expand(-1, -1, batch.final.shape[-1]))
        probability = (before @ head.T.to(before.dtype)).float().softmax(-1).amax(-1)
        hits.append((logits.argmax(-1) == labels)[drafted])
        sure.append(probability[drafted])
    hit, top = torch.cat(hits).float(), torch.cat(sure)
    bins = torch.bucketize(top, torch.tensor(CONFIDENCE_EDGES, device=top.device), right=True)
    edges = (0.0, *CONFIDENCE_EDGES, 1.0)
    by_bin = []
    for k in range(len(edges) - 1):
        inside = bins == k
        by_bin.append(
            {
                "target_probability": [edges[k], edges[k + 1]],
                "share": float(inside.float().mean()),
                "first_draft": float(hit[inside].mean()) if inside.any() else None,
            }
        )
    return {
        "anchors": len(hit),
        "first_draft": float(hit.mean()),
        "target_probability": float(top.mean()),
        "bins": by_bin,
    }


# A step's sequences come from a chunk drawn for CHUNK_STEPS steps, whose taps one forward of the target gives: a
# forward a step (launch-bound at 40 sequences) held an H100 to 13 steps a second, against 31 with the taps held.
CHUNK_STEPS = 25

# With a time budget the schedule's length is set at CALIBRATION_STEPS from the pace after PACED_FROM: the first
# steps and the first curve point pay for kernel choice, allocation and their shapes (on the H200, 100 steps from the
# start said 5.6 steps/s and the run then went at 23; on an H100, steps 50-300 said 10.7 and the run went at 17,
# ending after 366 s of a 532 s budget), so the window starts after the first point and holds the second.
PACED_FROM, CALIBRATION_STEPS = 300, 550


def train(
    data: Data,
    rows: Tensor,
    held: Tensor,
    embed: Tensor,
    head: Tensor,
    final_norm: Tensor,
    r: Recipe,
    seed: int,
    log=print,
    every: int = 250,
    keep=None,
    span: int = 64,
    reported: Tensor | None = None,
    budget_s: float | None = None,
    init: dict[str, Tensor] | None = None,
    state: Path | None = None,
    stop_s: float | None = None,
) -> tuple[DFlashModel, list[dict]]:
    """Train a drafter of recipe `r` on sequences `rows` of `data`; every `every` steps (and at the end) the
    curve records the training loss and, on sequences `held` (validation), the loss, the drafts a block
    would have had accepted (teacher-forced: the target's own tokens before each block) and the loop's tau
    over the first `span` reply tokens (`chain_tau`); on sequences `reported` (HELD_OUT: reported, never used
    to choose), that tau too. With `budget_s`, the schedule's length is fixed after CALIBRATION_STEPS to the steps
    that fit in it at their pace (at most r.steps; the curve's last step says how many: --steps N repeats it). Matrices start as
    N(0, 0.02), norms at 1 but the final one, at the target's own final norm (the head then starts at the
    target's logit scale); with `init` (a written drafter's `initial_weights`, or `target_layer_weights`), those
    weights instead. `keep(model)`, if given, is called at every point of the curve (a run cut short leaves its latest
    drafter). With `stop_s`, the run stops at the first chunk after that many seconds of this call (past the
    calibration) and writes its state to `state` (the drafter, optimiser, schedule, generator and curve so far;
    keep(model) is called); given a `state` that exists, the run goes on from it as if it had never stopped, and
    removes it when the schedule ends: the file exists while the run is unfinished. So one schedule can outlast a
    device call."""
    device = data.device
    if stop_s is not None and state is None:
        raise SystemExit("--stop-after-s needs --state: where the cut run's state goes")
    resumed = read_progress(state, device) if state and state.exists() else None
    torch.manual_seed(seed)
    model = DFlashModel(embed.shape[1], r).to(device)
    for p in model.parameters():
        if p.ndim == 2:
            nn.init.normal_(p, std=0.02)
    with torch.no_grad():
        model.norm.weight.copy_(final_norm.float())
        if init is not None:
            model.load_state_dict({n: t.float() for n, t in init.items()})
    deterministic = device.type == "cuda"  # only here: the runtime's own steps are left as they are
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    decay = [p for p in model.parameters() if p.ndim == 2]
    flat = [p for p in model.parameters() if p.ndim < 2]
    optimiser = torch.optim.AdamW(
        [{"params": decay, "weight_decay": r.weight_decay}, {"params": flat, "weight_decay": 0.0}],
        lr=r.lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",  # one kernel for every parameter's update instead of a few per group
    )
    steps, step = r.steps, 0  # `steps` may be cut by budget_s: the schedule reads it at every step
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser,
        lambda step: min(1.0, (step + 1) / r.warmup) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps)),
    )
    generator = torch.Generator(device=device).manual_seed(seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    curve, running, earlier_s = [], [], 0.0
    if resumed is not None:
        shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        if {name: tuple(t.shape) for name, t in resumed["model"].items()} != shapes:
            raise SystemExit(f"{state}: not this recipe's run (another drafter's shape): remove it or change --state")
        model.load_state_dict(resumed["model"])
        optimiser.load_state_dict(resumed["optimiser"])
        schedule.load_state_dict(resumed["schedule"])
        generator.set_state(resumed["generator"].cpu())
        steps, step, curve, earlier_s = resumed["steps"], resumed["step"], resumed["curve"], resumed["seconds"]
        running = list(resumed["running"])
        log(f"    went on from {state}: step {step} of {steps}")
    begun = time.perf_counter()
    start, cut = begun - earlier_s, False
    while step < steps:
        if step % CHUNK_STEPS == 0:
            cut = stop_s is not None and step >= CALIBRATION_STEPS and time.perf_counter() - begun > stop_s
            if cut:
                break
            drawn = rows[torch.randint(len(rows), (r.sequences * CHUNK_STEPS,), generator=generator, device=device)]
            parts = data.select(drawn, r.taps).parts(CHUNK_STEPS)
        batch = parts[step % CHUNK_STEPS]
        step += 1
        anchors = draw_anchors(batch.starts, batch.lengths, r.blocks, generator)
        with autocast:
            loss, _ = block_loss(model, embed, head, batch, anchors, r)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        running.append(loss.detach())
        if step == PACED_FROM:
            paced = time.perf_counter()
        if budget_s is not None and step == CALIBRATION_STEPS:
            now = time.perf_counter()
            pace = (now - paced) / (CALIBRATION_STEPS - PACED_FROM)
            steps = max(step, min(r.steps, step + int((budget_s - (now - start)) / pace)))
            log(f"    {budget_s:.0f} s of training: {steps} steps")
        if step % every == 0 or step == steps:
            point = {"step": step, "loss": float(torch.stack(running).mean()), "seconds": time.perf_counter() - start}
            point.update(evaluate_blocks(model, data, held, embed, head, r, seed))
            point["validation_tau"] = chain_tau(model, data, held, embed, head, r, span)
            if reported is not None:
                point["held_out_tau"] = chain_tau(model, data, reported, embed, head, r, span)
            curve.append(point)
            running = []
            if keep is not None:
                keep(model)
            log(
                f"    step {step}: loss {point['loss']:.3f} · validation loss {point['validation_loss']:.3f}, "
                f"accepted drafts per block {point['validation_accepted']:.2f}, tau {point['validation_tau']:.2f}"
                + (f" · held-out tau {point['held_out_tau']:.2f}" if "held_out_tau" in point else "")
                + f" · {point['seconds']:.0f} s"
            )
    if deterministic:
        torch.use_deterministic_algorithms(False)
    if cut:
        save_progress(state, model, optimiser, schedule, generator, steps, step, curve, running, start)
        log(f"    stopped at step {step} of {steps}: its state in {state}")
        if keep is not None:
            keep(model)
    elif state is not None:
        state.unlink(missing_ok=True)
    return model, curve


def read_progress(state: Path, device: torch.device) -> dict:
    """What `save_progress` wrote, read with torch's weights-only loader (the file is named by an explicit flag);
    anything else is refused in one line."""
    try:
        return torch.load(state, map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as error:
        raise SystemExit(f"{state}: not a run's state ({type(error).__name__}): remove it or change --state") from None


def save_progress(
    state: Path,
    model: DFlashModel,
    optimiser: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    generator: torch.Generator,
    steps: int,
    step: int,
    curve: list[dict],
    running: list[Tensor],
    start: float,
) -> None:
    """A cut run's state in `state`, under a temporary name and then renamed (a call killed while writing leaves the
    state before it, or none)."""
    progress = {
        "model": model.state_dict(),
        "optimiser": optimiser.state_dict(),
        "schedule": schedule.state_dict(),
        "generator": generator.get_state(),
        "steps": steps,
        "step": step,
        "curve": curve,
        "running": torch.stack(running) if running else torch.zeros(0),
        "seconds": time.perf_counter() - start,
    }
    state.parent.mkdir(parents=True, exist_ok=True)
    partial = state.with_name(state.name + ".tmp")
    torch.save(progress, partial)
    partial.replace(state)


@torch.no_grad()
def evaluate_blocks(
    model: DFlashModel, data: Data, held: Tensor, embed: Tensor, head: Tensor, r: Recipe, seed: int
) -> dict:
    device = data.device
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    losses, accepted = [], []
    for first in range(0, len(held), r.sequences):
        batch = data.select(held[first : first + r.sequences], r.taps)
        anchors = draw_anchors(batch.starts, batch.lengths, r.blocks, generator)
        with autocast:
            loss, hits = block_loss(model, embed, head, batch, anchors, r)
        losses.append(float(loss))
        accepted.append(hits.float().mean())
    return {"validation_loss": sum(losses) / len(losses), "validation_accepted": float(torch.stack(accepted).mean())}


# ------------------------------------------------------------------------------------------------ the layout


def target_layer_weights(
    target: Transformer, data: Data, rows: Tensor, r: Recipe, layers: tuple[int, ...]
) -> dict[str, Tensor]:
    """A drafter's starting weights taken from the target's own decoder layers `layers` (one a drafter layer, z-lab's
    names), so that it starts from what the target learnt in pretraining rather than from noise: attention and
    norms as they are; the FFN's `r.intermediate` neurons of the largest |gate row| · |up row| · |down column|,
    in their order; fc passes the tap after layer `layers[0]` - 1 through (the residual stream that layer reads,
    which its k/v projections were trained on; the other taps' columns start at zero) and hidden_norm is that
    layer's input norm. The target has no q/k norm: each starts at the mean RMS of a head's query (key) over the
    first of `rows`' tokens, so a head's scores start at the target's scale (the second layer's from the same
    tap, a layer before its own input)."""
    tap = layers[0] - 1
    if tap not in r.taps or len(layers) != r.layers:
        raise SystemExit(
            f"--target-layers {list(layers)}: needs {r.layers} layers, the first after a tap of {list(r.taps)}"
        )
    hidden = target.config.hidden_size
    weights: dict[str, Tensor] = {
        "fc.weight": torch.cat([torch.eye(hidden) if k == tap else torch.zeros(hidden, hidden) for k in r.taps], dim=1),
        "norm.weight": target.norm.weight.float().cpu(),
    }
    sample = data.select(rows[:64], (tap,))
    inside = torch.arange(sample.taps.shape[1], device=sample.taps.device) < sample.lengths[:, None]
    stream = sample.taps[inside].float()  # [tokens, H]: the residual stream after layer `tap`
    stream = stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + r.rms_norm_eps)
    for i, k in enumerate(layers):
        layer = target.layers[k]
        attention, mlp = layer.mixer, layer.mlp
        q, kk, v = (
            w.float().cpu()
            for w in _dense([w for w, _ in attention.qkv.groups]).split(
                [r.heads * r.head_dim, *[r.kv_heads * r.head_dim] * 2]
            )
        )
        gate, up = _dense([w for w, _ in mlp.gate_up.groups]).float().cpu().chunk(2)
        down = _dense([mlp.down_proj]).float().cpu()
        if gate.shape[0] < r.intermediate:
            raise SystemExit(
                f"--target-layers: the target's FFN has {gate.shape[0]} neurons, the recipe {r.intermediate}"
            )
        importance = gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)
        kept = importance.topk(r.intermediate).indices.sort().values
        x = (stream * layer.input_norm.weight.float()).cpu()
        scales = {
            name: float((x @ w.T).view(len(x), -1, r.head_dim).pow(2).mean(-1).sqrt().mean())
            for name, w in (("q", q), ("k", kk))
        }
        p = f"layers.{i}."
        weights |= {
            p + "input_layernorm.weight": layer.input_norm.weight.float().cpu(),
            p + "post_attention_layernorm.weight": layer.post_norm.weight.float().cpu(),
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": kk,
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": _dense([attention.o_proj]).float().cpu(),
            p + "self_attn.q_norm.weight": torch.full((r.head_dim,), scales["q"]),
            p + "self_attn.k_norm.weight": torch.full((r.head_dim,), scales["k"]),
            p + "mlp.gate_proj.weight": gate[kept],
            p + "mlp.up_proj.weight": up[kept],
            p + "mlp.down_proj.weight": down[:, kept],
        }
        if i == 0:
            weights["hidden_norm.weight"] = layer.input_norm.weight.float().cpu()
    return weights


def _dense(weights: list[Tensor | Packed]) -> Tensor:
    """A projection's weights (fused or not) as one dense matrix of their rows (of a target loaded unpacked)."""
    if not all(isinstance(w, Tensor) for w in weights):
        raise ValueError("the target's weights are kept packed: load it with packed=False")
    return torch.cat(weights)


def initial_weights(directory: Path, r: Recipe) -> dict[str, Tensor]:
    """A written drafter's tensors, to go on training it: its config's block, taps, mask token and shape must be
    the recipe's (a drafter of other taps reads other hidden states with the same weights' shapes)."""
    config = json.loads((directory / "config.json").read_text())
    wanted = {
        "block_size": r.block_size,
        "target_layer_ids": list(r.taps),
        "mask_token_id": r.mask_token_id,
        "num_hidden_layers": r.layers,
        "intermediate_size": r.intermediate,
    }
    found = {**config["dflash_config"], **config}
    odd = [f"{k} {found.get(k)} (the recipe's {v})" for k, v in wanted.items() if found.get(k) != v]
    if odd:
        raise SystemExit(f"{directory / 'config.json'}: not this recipe's drafter: {', '.join(odd)}")
    return load_file(str(directory / "model.safetensors"))


def config_json(r: Recipe, target: Transformer) -> dict:
    """z-lab's DFlashDraftModel config.json (a Qwen3 config with dflash_config), for this target."""
    t = target.config
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": t.bos_token_id,
        "dflash_config": {
            "block_size": r.block_size,
            "mask_token_id": r.mask_token_id,
            "target_layer_ids": list(r.taps),
        },
        "dtype": "bfloat16",
        "eos_token_id": t.eos_token_ids[0],
        "head_dim": r.head_dim,
        "hidden_act": "silu",
        "hidden_size": t.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": r.intermediate,
        "layer_types": ["full_attention"] * r.layers,
        "max_position_embeddings": t.max_position_embeddings,
        "max_window_layers": r.layers,
        "model_type": "qwen3",
        "num_attention_heads": r.heads,
        "num_hidden_layers": r.layers,
        "num_key_value_heads": r.kv_heads,
        "num_target_layers": t.num_layers,
        "rms_norm_eps": r.rms_norm_eps,
        "rope_parameters": {"rope_theta": r.rope_theta, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": t.vocab_size,
    }


def write_drafter(model: DFlashModel, r: Recipe, target: Transformer, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {n: p.detach().to("cpu", torch.bfloat16).contiguous() for n, p in model.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config_json(r, target), indent=2, sort_keys=True) + "\n")
    return directory


def speculative_tau(
    target: Transformer,
    target_model: Model,
    directory: Path,
    prompts: list[list[int]],
    new_tokens: int,
    stops: list[int],
    blocks: tuple[int, ...],
    timed: bool = False,
) -> dict:
    """The drafter in `directory`, loaded by specpair's DFlash loader, in specpair's speculative loop (greedy, all
    prompts in one batch: a sequence's rounds do not depend on its neighbours'): per block size tau, acceptance
    by position, and whether every reply equals the undrafted one; with `timed`, each step's time alone and the
    speedup they predict (speculative.step_times)."""
    drafter = load_drafter(open_model(str(directory)), target_model, target)
    undrafted, _ = generate(target, prompts, new_tokens, Sampling(), stops)
    out = {}
    for block in blocks:
        results, _ = speculative_generate(target, drafter, prompts, new_tokens, Sampling(), stops, block_size=block)
        rounds = sum(len(r.committed) for r in results)
        figure = {
            "tau": sum(sum(r.committed) for r in results) / rounds,
            "acceptance_by_position": [round(a, 3) for a in acceptance_by_position(results, block - 1)],
            "identical": all(a.tokens == b.tokens for a, b in zip(undrafted, results)),
        }
        if timed:
            times = step_times(target, drafter, prompts[:1], block)
            figure["step_s"] = {"decode": times.decode_s, "verify": times.verify_s, "draft": times.draft_s}
            figure["predicted_speedup"] = times.predicted_speedup(figure["tau"])
        out[block] = figure
    return out


# ------------------------------------------------------------------------------------------------ the run

BASE = Recipe()
SWEEP_STEPS = 600
SWEEP = (
    BASE,
    replace(BASE, taps=(15,)),  # z-lab's default for one draft layer: the middle layer
    replace(BASE, taps=(1, 7, 14, 20, 27)),
    replace(BASE, taps=(20, 24, 28)),
    replace(BASE, layers=2, intermediate=1024),  # two layers within 16 MB
    replace(BASE, mask_token_id=0),  # <|endoftext|>
    replace(BASE, block_size=16),
)


# Which figure decides each choice: tau where the candidates' rounds cost the same, the speedup that the steps'
# own times predict where they do not (falls back to tau without timings, on the CPU).
DECIDED_BY = {"taps": "tau", "mask_token_id": "tau", "layers": "predicted_speedup", "block_size": "predicted_speedup"}


def choose(results: list[tuple[Recipe, dict]]) -> Recipe:
    """Each choice takes the value of the best candidate that changed it from the first candidate, if that one
    beat the first by the choice's figure (DECIDED_BY); the rest stay as the first has them."""

    def score(figures: dict, field: str) -> float:
        return figures.get(DECIDED_BY[field], figures["tau"])

    base, base_figures = results[0]
    chosen = base
    for field in DECIDED_BY:
        changed = [(r, f) for r, f in results[1:] if getattr(r, field) != getattr(base, field)]
        if not changed:
            continue
        best, figures = max(changed, key=lambda x: score(x[1], field))
        if score(figures, field) > score(base_figures, field):
            chosen = replace(chosen, **{field: getattr(best, field)})
            if field == "layers":
                chosen = replace(chosen, intermediate=best.intermediate)
    return chosen


@dataclass
class Prompts:
    """A run's prompts: training (templated, written by the target, people's), validation (templated, then
    people's), people's validation alone, people's training ones (drawn --human-weight times as often) and HELD_OUT's
    first --held-out; the data holds a greedy reply to each of train + validation + held_out, in that order."""

    train: list[str]
    validation: list[str]
    people: list[str]
    people_validation: list[str]
    held_out: list[str]
    written_examples: list[str]
    templated: int
    written: int

    @property
    def sequences(self) -> int:
        return len(self.train) + len(self.validation) + len(self.held_out)

    def counts(self) -> dict:
        return {
            "templated": self.templated,
            "written_by_the_target": self.written,
            "written_by_people": len(self.people),
            "people_validation": len(self.people_validation),
            "train": len(self.train),
            "validation": len(self.validation),
            "held_out": len(self.held_out),
        }


def make_prompts(args: argparse.Namespace, fast: FastTarget, tokenizer, stops: list[int], log) -> Prompts:
    templated, validation = prompt_sets(args.prompts, args.validation, args.seed)
    written = []
    if args.questions:
        log(f"self-instruct: {args.questions} prompts ask the target for a question")
        written = written_prompts(
            fast, tokenizer, args.questions, args.question_tokens, stops, args.batch, args.seed, log
        )
    people, people_validation = (
        human_prompt_sets([Path(p) for p in args.human], args.human_validation, args.seed) if args.human else ([], [])
    )
    validation += people_validation
    train = [p for p in dict.fromkeys(templated + written + people) if p not in set(validation)]
    examples = written[:: max(1, len(written) // 24)][:24]
    held_out = list(HELD_OUT[: args.held_out])
    return Prompts(train, validation, people, people_validation, held_out, examples, len(templated), len(written))


def make_data(
    args: argparse.Namespace, fast: FastTarget, tokenizer, stops: list[int], prompts: Prompts, log, clock: float
) -> Data:
    """The greedy replies to every prompt, then --sampled-replies more per training prompt and after them
    --human-sampled-replies more per people's training prompt, while --data-budget-s (counted from `clock`) lasts.
    Each round of sampled replies has its own seed, counted on from the last round's."""
    everything = chat_ids(tokenizer, prompts.train + prompts.validation + prompts.held_out)
    log(f"self-distillation: {len(everything)} prompts, {args.new_tokens} reply tokens each")
    data = self_distil(fast, everything, args.new_tokens, stops, args.batch, log)
    train_ids = chat_ids(tokenizer, prompts.train) if args.sampled_replies else []
    people_ids = chat_ids(tokenizer, prompts.people) if args.human_sampled_replies else []
    rounds = [("training prompt", train_ids)] * args.sampled_replies
    rounds += [("people's training prompt", people_ids)] * args.human_sampled_replies
    for k, (asked, ids) in enumerate(rounds):
        if args.data_budget_s is not None and time.perf_counter() - clock > args.data_budget_s:
            log(f"  --data-budget-s spent after {k} of {len(rounds)} rounds of sampled replies")
            break
        log(f"  sampled replies {k + 1}/{len(rounds)}, one a {asked} (temperature {args.reply_temperature})")
        seed = args.seed + 1_000_000 * (k + 1)
        data = data.join(self_distil(fast, ids, args.new_tokens, stops, args.batch, log, args.reply_temperature, seed))
    return data


PROMPTS_FILE, SEQUENCES_FILE = "prompts.json", "sequences.safetensors"


def save_data(directory: Path, prompts: Prompts, data: Data) -> None:
    """The prompts and the sequences in `directory`, for a later run's --data (each file under a temporary name,
    then renamed: a cut run leaves no half-written data that a later one would read)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {"tokens": data.tokens.int(), "starts": data.starts.int(), "lengths": data.lengths.int()}
    save_file({k: v.cpu().contiguous() for k, v in tensors.items()}, str(directory / (SEQUENCES_FILE + ".tmp")))
    (directory / (PROMPTS_FILE + ".tmp")).write_text(json.dumps(asdict(prompts)))
    (directory / (SEQUENCES_FILE + ".tmp")).replace(directory / SEQUENCES_FILE)
    (directory / (PROMPTS_FILE + ".tmp")).replace(directory / PROMPTS_FILE)  # last: its presence says both are whole


def load_data(directory: Path, fast: FastTarget) -> tuple[Prompts, Data]:
    tensors = {k: v.long().to(fast.device) for k, v in load_file(str(directory / SEQUENCES_FILE)).items()}
    prompts = Prompts(**json.loads((directory / PROMPTS_FILE).read_text()))
    return prompts, Data(tensors["tokens"], tensors["starts"], tensors["lengths"], fast)


EVALUATION_S = 30.0  # the final loop at blocks 4 and 8 on validation and HELD_OUT: 10 s on an H100 (run H)


def training_budget(train_budget_s: float | None, budget_s: float | None, elapsed_s: float) -> float | None:
    """The final drafter's training time: --train-budget-s, or what --budget-s leaves after `elapsed_s` and the last
    evaluation, whichever is less."""
    left = None if budget_s is None else max(0.0, budget_s - elapsed_s - EVALUATION_S)
    return min((b for b in (train_budget_s, left) if b is not None), default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("out", help="where drafter/ and training.json go")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=3072, help="training prompts from the templates")
    parser.add_argument(
        "--questions", type=int, default=0, help="prompts asking the target to write a question (self-instruct)"
    )
    parser.add_argument(
        "--human",
        nargs="+",
        default=None,
        help="JSON arrays of prompts in people's wording (tools/demo_prompts.json, then tools/demo_prompts_more.json)",
    )
    parser.add_argument(
        "--human-validation", type=int, default=64, help="of the first --human file's prompts, kept for validation"
    )
    parser.add_argument(
        "--human-weight", type=int, default=1, help="times each --human prompt's sequence is drawn per templated one"
    )
    parser.add_argument("--question-tokens", type=int, default=64, help="tokens the target may write a question in")
    parser.add_argument("--validation", type=int, default=64, help="validation prompts (the sweep's choice)")
    parser.add_argument("--new-tokens", type=int, default=192, help="reply tokens generated per prompt")
    parser.add_argument("--eval-tokens", type=int, default=64, help="tokens per prompt in the speculative runs")
    parser.add_argument("--batch", type=int, default=256, help="prompts per generation batch")
    parser.add_argument("--steps", type=int, default=Recipe.steps, help="training steps of the final drafter")
    parser.add_argument("--sweep", action="store_true", help="choose taps, layers, mask and block by SWEEP first")
    parser.add_argument("--sweep-steps", type=int, default=SWEEP_STEPS)
    parser.add_argument(
        "--sweep-budget-s", type=float, default=None, help="skip the candidates left once the sweep took this long"
    )
    parser.add_argument("--held-out", type=int, default=len(HELD_OUT), help="the first N of HELD_OUT (tests: few)")
    parser.add_argument("--scale", type=float, default=1.0, help="sequences and blocks per step (tests: small)")
    parser.add_argument("--layers", type=int, default=BASE.layers, help="draft layers of the base recipe")
    parser.add_argument("--intermediate", type=int, default=BASE.intermediate, help="FFN width of the base recipe")
    parser.add_argument(
        "--train-budget-s", type=float, default=None, help="fit the final drafter's schedule (at most --steps) in this"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="the whole run in this: training gets what the data left, less EVALUATION_S (with --train-budget-s, the less)",
    )
    parser.add_argument(
        "--soft", type=float, default=BASE.soft, help="the loss's share on the target's distribution (0: its token)"
    )
    parser.add_argument(
        "--sampled-replies", type=int, default=0, help="replies sampled per training prompt beside the greedy one"
    )
    parser.add_argument(
        "--human-sampled-replies",
        type=int,
        default=0,
        help="replies sampled per people's training prompt after --sampled-replies (unlike --human-weight, not repeated)",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="the data is read from this directory when there, else made and written there (a run longer than one "
        "device call makes it in one call and trains in the next)",
    )
    parser.add_argument("--data-only", action="store_true", help="make and write --data, then stop")
    parser.add_argument(
        "--data-budget-s", type=float, default=None, help="no more sampled replies once the run took this long"
    )
    parser.add_argument("--reply-temperature", type=float, default=0.8, help="the sampled replies' temperature")
    parser.add_argument("--lr", type=float, default=BASE.lr, help="the peak learning rate (AdamW, cosine)")
    parser.add_argument(
        "--position-decay",
        type=float,
        default=None,
        help="γ of a block's row k loss weight exp(-(k - 1) / γ) (default: half the block, z-lab's)",
    )
    parser.add_argument(
        "--stop-after-s",
        type=float,
        default=None,
        help="stop the drafter's training at the first chunk after this long (past the calibration), its state in --state",
    )
    parser.add_argument(
        "--state",
        default=None,
        help="a run stopped by --stop-after-s writes its state here; a run given one that exists goes on from it "
        "(one schedule over device calls of one machine; read with torch's weights-only loader)",
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--init", default=None, help="go on training this drafter (write_drafter's layout, the same recipe)"
    )
    start.add_argument(
        "--target-layers",
        default=None,
        help="start the drafter from these target layers (comma-separated, one a draft layer; the first after a tap)",
    )
    args = parser.parse_args()
    if args.data_only and not args.data:
        parser.error("--data-only needs --data")
    if args.stop_after_s is not None and not args.state:
        parser.error("--stop-after-s needs --state")
    if args.position_decay is not None and args.position_decay <= 0:
        parser.error("--position-decay must be above 0")

    if args.device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: training asks for it
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    record: dict = {"args": vars(args), "stages": {}}
    clock = time.perf_counter()

    def log(line: str) -> None:
        print(line, flush=True)

    def stage(name: str) -> None:
        record["stages"][name] = round(time.perf_counter() - clock, 1)
        (out_dir / "training.json").write_text(json.dumps(record, indent=1) + "\n")

    def sized(r: Recipe, steps: int) -> Recipe:
        return replace(
            r,
            steps=steps,
            sequences=max(1, round(r.sequences * args.scale)),
            blocks=max(1, round(r.blocks * args.scale)),
        )

    log(f"loading {args.gguf} onto {args.device}")
    target_model = open_model(args.gguf)
    packed = torch.device(args.device).type == "cuda"  # as the runtime serves it; FastTarget reads dense weights
    target = loading.load(loading.plan_load(target_model, args.device, packed=packed))
    dense = loading.load(loading.plan_load(target_model, args.device, packed=False)) if packed else target
    fast = FastTarget(dense)
    tokenizer = target_model.tokenizer()
    stops = sorted(set(tokenizer.stop_ids) | set(target_model.config.eos_token_ids))
    base = replace(
        BASE,
        layers=args.layers,
        intermediate=args.intermediate,
        soft=args.soft,
        lr=args.lr,
        position_decay=args.position_decay,
    )
    made = Path(args.data) if args.data else None
    if made is not None and (made / PROMPTS_FILE).exists():
        prompts, data = load_data(made, fast)
        log(f"data read from {made}: {len(data.tokens)} sequences")
    else:
        prompts = make_prompts(args, fast, tokenizer, stops, log)
        stage("prompts")
        data = make_data(args, fast, tokenizer, stops, prompts, log, clock)
        if made is not None:
            save_data(made, prompts, data)
    data.final = args.soft > 0 or len(data.tokens) > prompts.sequences
    record["prompts"] = prompts.counts()
    record["written_examples"] = prompts.written_examples
    record["data"] = {
        "sequences": len(data.tokens),
        "tokens": int(data.lengths.sum()),
        "replied": int((data.lengths - data.starts).sum()),
        "sampled_sequences": len(data.tokens) - prompts.sequences,
    }
    stage("data")
    if args.data_only:
        log(f"data in {made}")
        return
    device = data.device
    train_prompts, validation_prompts, held_out_prompts = prompts.train, prompts.validation, prompts.held_out
    # a --human prompt's sequence is drawn --human-weight times as often as another: few, but worded as people word
    index = {p: i for i, p in enumerate(train_prompts)}
    weighted = [index[p] for p in prompts.people if p in index] * (args.human_weight - 1)
    sampled_rows = list(range(prompts.sequences, len(data.tokens)))
    rows = torch.tensor(list(range(len(train_prompts))) + weighted + sampled_rows, device=device)
    held = torch.arange(len(train_prompts), len(train_prompts) + len(validation_prompts), device=device)
    reported = torch.arange(prompts.sequences - len(held_out_prompts), prompts.sequences, device=device)
    embed, head = fast.embed, fast.head
    validation_ids = chat_ids(tokenizer, validation_prompts)
    held_out_ids = chat_ids(tokenizer, held_out_prompts)

    chosen = base
    if args.sweep:
        results, record["sweep"] = [], []
        sweep_start = time.perf_counter()
        for i, candidate in enumerate(SWEEP):
            r = sized(candidate, args.sweep_steps)
            if i and args.sweep_budget_s is not None and time.perf_counter() - sweep_start > args.sweep_budget_s:
                log(f"sweep {i + 1}/{len(SWEEP)}: skipped, the sweep's {args.sweep_budget_s:.0f} s are spent")
                record["sweep"].append({"recipe": asdict(r), "skipped": True})
                continue
            log(f"sweep {i + 1}/{len(SWEEP)}: {r.describe()}")
            model, curve = train(
                data,
                rows,
                held,
                embed,
                head,
                target.norm.weight,
                r,
                args.seed,
                log,
                args.sweep_steps,
                span=args.eval_tokens,
            )
            where = write_drafter(model, r, target, out_dir / "sweep" / str(i))
            figures = speculative_tau(
                target,
                target_model,
                where,
                validation_ids,
                args.eval_tokens,
                stops,
                (r.block_size,),
                timed=args.device.startswith("cuda"),
            )
            figure = figures[r.block_size]
            log(
                f"  validation tau {figure['tau']:.2f} at block {r.block_size}"
                + (f", predicted speedup {figure['predicted_speedup']:.2f}x" if "predicted_speedup" in figure else "")
            )
            results.append((candidate, figure))
            record["sweep"].append({"recipe": asdict(r), "curve": curve, "validation": figures})
            stage(f"sweep {i + 1}")
        chosen = choose(results)
        log(f"chosen: {chosen.describe()}")
    final = sized(chosen, args.steps)
    record["recipe"] = asdict(final)
    initial = None
    if args.init:
        initial = initial_weights(Path(args.init), final)
    elif args.target_layers:
        initial = target_layer_weights(dense, data, rows, final, tuple(int(k) for k in args.target_layers.split(",")))
    log(f"training {final.describe()} for {final.steps} steps")
    drafter_dir = out_dir / "drafter"
    model, record["curve"] = train(
        data,
        rows,
        held,
        embed,
        head,
        target.norm.weight,
        final,
        args.seed,
        log,
        keep=lambda m: write_drafter(m, final, target, drafter_dir),
        span=args.eval_tokens,
        reported=reported,
        budget_s=training_budget(args.train_budget_s, args.budget_s, time.perf_counter() - clock),
        init=initial,
        state=Path(args.state) if args.state else None,
        stop_s=args.stop_after_s,
    )
    if args.state and Path(args.state).exists():
        record["stopped"] = f"by --stop-after-s, its state in {args.state}: the same command goes on from it"
        stage("train")
        log(f"wrote {drafter_dir}; run the same command again to go on")
        return
    record["recipe"]["steps"] = record["curve"][-1]["step"]  # what --train-budget-s left of --steps
    stage("train")
    log(f"wrote {drafter_dir} ({(drafter_dir / 'model.safetensors').stat().st_size / 1e6:.1f} MB)")
    blocks = tuple(b for b in (4, 8, 16) if b <= final.block_size)
    timed = args.device.startswith("cuda")
    record["validation"] = speculative_tau(
        target, target_model, drafter_dir, validation_ids, args.eval_tokens, stops, blocks, timed
    )
    if prompts.people_validation:
        record["people_validation"] = speculative_tau(
            target,
            target_model,
            drafter_dir,
            chat_ids(tokenizer, prompts.people_validation),
            args.eval_tokens,
            stops,
            blocks,
            timed,
        )
    record["held_out"] = speculative_tau(
        target, target_model, drafter_dir, held_out_ids, args.eval_tokens, stops, blocks, timed
    )
    for block, figure in record["held_out"].items():
        log(
            f"held-out tau {figure['tau']:.2f} at block {block} (identical: {figure['identical']}), acceptance by "
            f"position {figure['acceptance_by_position']}"
            + (f", predicted speedup {figure['predicted_speedup']:.2f}x" if timed else "")
        )
    people = len(prompts.people_validation)
    groups = {  # "validation": the templated ones
        "train": torch.arange(0, len(train_prompts), max(1, len(train_prompts) // 64), device=device)[:64],
        "validation": held[: len(held) - people],
        "people_validation": held[len(held) - people :],
        "held_out": reported,
    }
    record["first_draft_by_confidence"] = {
        name: first_draft_by_confidence(model, data, group, embed, head, final, args.eval_tokens)
        for name, group in groups.items()
        if len(group)
    }
    for name, figure in record["first_draft_by_confidence"].items():
        sure = figure["bins"][-1]
        log(
            f"first draft {figure['first_draft']:.2f} of {figure['anchors']} anchors ({name}), "
            + (f"{sure['first_draft']:.2f}" if sure["first_draft"] is not None else "-")
            + f" where the target's probability is {CONFIDENCE_EDGES[-1]} or more ({sure['share']:.2f} of them)"
        )
    stage("evaluate")
    log(f"done in {time.perf_counter() - clock:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
