"""`specpair run TARGET`: one undrafted generation on specpair's runtime, its text streamed as it grows."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specpair.app.device import place_runtime
from specpair.app.models import LoadedTarget, layouts, load_target, revision
from specpair.app.progress import SILENT, Progress
from specpair.app.prompts import chat_by_default, encode_prompt
from specpair.errors import BadInput

if TYPE_CHECKING:
    import torch

    from specpair.runtime.generate import Timing

SCHEMA = "specpair.run/1"
MAX_TOKENS = 128  # when --max-tokens is not given
SamplingArgs = tuple[float, int, float, int]  # (temperature, top_k, top_p, seed)


@dataclass
class Generation:
    target: LoadedTarget
    device: torch.device
    tensor_parallel: int  # ranks the target is split over
    prompt: str  # as given, before any chat template
    prompt_tokens: int
    chat: bool
    chat_kwargs: dict[str, Any]  # the chat template's variables (--chat-template-kwargs)
    sampling: SamplingArgs
    text: str  # a final stop token not shown
    tokens: list[int]  # a final stop id included
    stopped: bool
    timing: Timing

    def to_json(self) -> dict[str, Any]:
        temperature, top_k, top_p, seed = self.sampling
        model, timing = self.target.model, self.timing
        return {
            "schema": SCHEMA,
            "target": {
                "ref": model.ref,
                "revision": revision(model),
                "family": model.config.family,
                "layouts": layouts(self.target.plan),
            },
            "device": str(self.device),
            "dtype": self.target.dtype,
            "tensor_parallel": self.tensor_parallel,
            "prompt": {
                "sha256": hashlib.sha256(self.prompt.encode("utf-8")).hexdigest(),
                "tokens": self.prompt_tokens,
                "chat": self.chat,
                "chat_template_kwargs": self.chat_kwargs,
            },
            "sampling": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed},
            "text": self.text,
            "tokens": self.tokens,
            "stopped": self.stopped,
            "tokens_per_s": timing.tokens_per_s,
            "decode_tokens_per_s": timing.decode_tokens_per_s,
            "prefill_tokens_per_s": timing.prefill_tokens_per_s,
            "seconds": {"load": self.target.seconds, "prefill": timing.prefill_s, "decode": timing.decode_s},
        }


def generate_text(
    target: str,
    prompt: str,
    *,
    max_tokens: int,
    sampling: SamplingArgs = (0.0, 0, 1.0, 0),
    chat: bool | None = None,
    chat_kwargs: dict[str, Any] | None = None,
    device: str | None = None,
    threads: int | None = None,
    dtype: str | None = None,
    gguf_file: str | None = None,
    graphs: bool | None = None,
    on_text: Callable[[str], None] | None = None,
    progress: Progress = SILENT,
) -> Generation:
    """Generate from `target` after `prompt` (through its chat template unless `chat` is False; None: when it has
    one; rendered with `chat_kwargs`); `on_text` gets the text as it grows (a final newline last)."""
    import torch

    from specpair.app.memory import out_of_memory
    from specpair.runtime import loading
    from specpair.runtime.generate import generate
    from specpair.runtime.sampling import Sampling
    from specpair.sources.model import open_model

    placed = place_runtime(device, threads, dtype)
    where, parallel = placed.device, placed.parallel
    if sampling[2] == 0:
        raise BadInput("--top-p", "0 keeps no token; give a value in (0, 1]")
    model = open_model(target, gguf_file)
    plan = loading.plan_load(model, where, placed.dtype, parallel=parallel)
    tokenizer = model.tokenizer()
    chat = chat_by_default(tokenizer, chat)
    ids = encode_prompt(tokenizer, prompt, chat, variables=chat_kwargs)
    context = len(ids) + max_tokens
    loaded = load_target(plan, progress, context)
    stops = sorted(set(tokenizer.stop_ids) | set(model.config.eos_token_ids))
    stream = TextStream(tokenizer, stops, on_text) if on_text else None
    try:
        (generated,), timing = generate(
            loaded.runtime,
            [ids],
            max_tokens,
            Sampling(*sampling),
            stops,
            on_token=(lambda row, token: stream.add(token)) if stream else None,
            graphs=graphs,
        )
    except torch.cuda.OutOfMemoryError:
        raise out_of_memory(plan, context, "while generating") from None
    text = tokenizer.decode(generated.tokens[:-1] if generated.stopped else generated.tokens)
    if stream:
        stream.finish(text)
    return Generation(
        loaded,
        where,
        parallel.size,
        prompt,
        len(ids),
        chat,
        chat_kwargs or {},
        sampling,
        text,
        generated.tokens,
        generated.stopped,
        timing,
    )


class TextStream:
    """Hands on the generated text as tokens arrive: each time, what the decoded text has gained, held back while
    it ends inside a UTF-8 sequence (decode shows those bytes as U+FFFD)."""

    def __init__(self, tokenizer: Any, stops: list[int], write: Callable[[str], None]) -> None:
        self.tokenizer, self.stops, self.write = tokenizer, set(stops), write
        self.tokens: list[int] = []
        self.written = ""

    def add(self, token: int) -> None:
        if token in self.stops:
            return
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens)
        if text.startswith(self.written) and not text.endswith("\ufffd"):
            self.write(text[len(self.written) :])
            self.written = text

    def finish(self, text: str) -> None:
        """The final text (stop token dropped): what is still missing, then a newline."""
        self.write((text[len(self.written) :] if text.startswith(self.written) else "\n" + text) + "\n")
