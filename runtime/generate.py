"""The generation loop without a drafter: chunked prefill, then one token per step for every sequence.

Both loops start alike (`prefill_context`): each prompt but its last token runs as prompt rows, and the last token
runs as a generated row, the undrafted loop's first decode step as the speculative loop's first verify row (its
anchor). On the CPU a prompt row's products are tiled unlike a generated row's (cpu_rows.prompt_tiles) and differ
from them in the last bits: a loop that ran the last prompt token as a prompt row would choose its first token, and
keep that token's K/V, from other bits than the other loop (a bf16 tie between two tokens decided the demo's first
divergence).

Prompts of different lengths share a batch: a prefill chunk gives every sequence T tokens, the shorter ones
padded, and commits each sequence's real count (the cache's rollback drops the padding exactly), so every
sequence ends the prefill in the state of a prefill of its own prompt. Decode steps then run each sequence
at its own position. With batch-invariant kernels a prompt's tokens are the same bits alone or in a batch.

With `graphs` (the default on CUDA) the decode step is a CUDA graph (runtime/graphs.py), warmed up and captured
after the prefill, before decoding is timed; the tokens are the same bits either way.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specpair.runtime.cache import Cache
from specpair.runtime.drafters import Committed
from specpair.runtime.graphs import ForwardGraph
from specpair.runtime.kernels.cpu_rows import prompt_tiles
from specpair.runtime.model import Transformer
from specpair.runtime.sampling import Sampling

PREFILL_CHUNK = 512


@dataclass
class Generated:
    tokens: list[int]  # generated ids (the prompt excluded), a final stop id included
    stopped: bool  # ended on a stop id, not at max_tokens


@dataclass
class Timing:
    prefill_s: float
    decode_s: float
    prompt_tokens: int
    generated_tokens: int
    sequences: int = 1
    capture_s: float = 0.0  # warming up and capturing the decode graph: once per call, in neither figure

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over the whole generation, prefill included (gpt-fast's figure)."""
        total = self.prefill_s + self.decode_s
        return self.generated_tokens / total if total else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after each sequence's first per second of decoding (the first comes of the prompt's last token,
        a generated row timed with the prefill)."""
        return (self.generated_tokens - self.sequences) / self.decode_s if self.decode_s else None

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else None


def generate(
    model: Transformer,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    sampling: Sampling,
    stop_ids: Sequence[int] = (),
    *,
    chunk: int = PREFILL_CHUNK,
    on_token: Callable[[int, int], None] | None = None,
    graphs: bool | None = None,
) -> tuple[list[Generated], Timing]:
    """Up to `max_tokens` new tokens per prompt (each prompt at least one token); `on_token(row, id)` sees each
    token as it is chosen. `graphs`: decode through a ForwardGraph (default: on CUDA)."""
    if max_tokens < 1 or not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs max_tokens >= 1 and non-empty prompts")
    device, batch = model.device, len(prompts)
    graphs = device.type == "cuda" if graphs is None else graphs
    lengths = [len(p) for p in prompts]
    cache = model.new_cache(batch, max(lengths) + max_tokens)
    stops = set(stop_ids)
    start = time.perf_counter()
    prefill_context(model, cache, prompts, chunk, hidden=False)
    positions = torch.tensor(lengths, device=device)  # where the token each sequence chooses next goes
    last = torch.tensor([p[-1] for p in prompts], device=device)
    token = sampling.choose(model.forward(last[:, None], (positions - 1)[:, None], cache).logits[:, 0], positions)
    _sync(device)
    prefill_s = time.perf_counter() - start
    decode = functools.partial(model.forward, cache=cache)
    capture_s = 0.0
    if graphs and max_tokens > 1:
        start = time.perf_counter()
        decode = ForwardGraph(model, cache, batch, 1)
        decode.prepare(token[:, None], positions[:, None])
        _sync(device)
        capture_s = time.perf_counter() - start
    out = [Generated([], False) for _ in prompts]
    start = time.perf_counter()
    for step in range(max_tokens):
        chosen = token.tolist()
        for b, t in enumerate(chosen):
            if not out[b].stopped:
                out[b].tokens.append(t)
                out[b].stopped = t in stops
                if on_token:
                    on_token(b, t)
        if step == max_tokens - 1 or all(g.stopped for g in out):
            break
        logits = decode(token[:, None], positions[:, None]).logits[:, 0]
        token = sampling.choose(logits, positions + 1)
        positions = positions + 1
    _sync(device)
    decode_s = time.perf_counter() - start
    return out, Timing(prefill_s, decode_s, sum(lengths), sum(len(g.tokens) for g in out), batch, capture_s)


def prefill_context(
    model: Transformer,
    cache: Cache,
    prompts: Sequence[Sequence[int]],
    chunk: int = PREFILL_CHUNK,
    *,
    taps: Sequence[int] = (),
    hidden: bool = True,
    observe: Callable[[Committed], None] | None = None,
) -> None:
    """Each prompt but its last token into the cache as prompt rows (`prefill`): the start of both loops, whose next
    step runs the last prompt token as a generated row (module docstring)."""
    prefill(
        model, cache, prompts, chunk, lengths=[len(p) - 1 for p in prompts], taps=taps, hidden=hidden, observe=observe
    )


def prefill(
    model: Transformer,
    cache: Cache,
    prompts: Sequence[Sequence[int]],
    chunk: int = PREFILL_CHUNK,
    *,
    lengths: Sequence[int] | None = None,
    taps: Sequence[int] = (),
    hidden: bool = True,
    observe: Callable[[Committed], None] | None = None,
) -> Tensor | None:
    """Run the first lengths[b] tokens of each prompt (default: all of them) into the cache, in chunks of up to
    `chunk` tokens per sequence; the one prefill of both loops. `observe` sees each chunk as a drafter does
    (runtime/drafters: its rows, the tokens after them, how many each sequence kept, the `taps` and the final
    normed hidden when `hidden`). Returns, with `hidden`, the final normed hidden state of each prompt's last run
    token, [B, H] (None when a sequence ran none). Its products are prompt rows' (cpu_rows.prompt_tiles), the
    drafter's observation of them too."""
    device, batch = model.device, len(prompts)
    lengths = [len(p) for p in prompts] if lengths is None else list(lengths)
    done = [0] * batch
    last: list[Tensor | None] = [None] * batch
    with prompt_tiles():
        while any(d < n for d, n in zip(done, lengths)):
            steps = min(chunk, max(n - d for d, n in zip(done, lengths)))
            kept = [min(steps, n - d) for d, n in zip(done, lengths)]
            # padding repeats a valid id at positions past the prompt (kept inside the cache): committed away below
            tokens = [[p[d + t] if t < k else 0 for t in range(steps)] for p, d, k in zip(prompts, done, kept)]
            positions = [[min(d + t, cache.context - 1) for t in range(steps)] for d in done]
            padded = any(k < steps for k in kept)
            tokens_t, positions_t = torch.tensor(tokens, device=device), torch.tensor(positions, device=device)
            out = model.forward(tokens_t, positions_t, cache, taps=taps, hidden=hidden, logits=False, verify=padded)
            kept_t = torch.tensor(kept, device=device)
            if padded:
                out.pending.commit(kept_t, kept)
            if observe is not None:
                following = [
                    [p[d + t + 1] if t < k and d + t + 1 < len(p) else 0 for t in range(steps)]
                    for p, d, k in zip(prompts, done, kept)
                ]
                observe(
                    Committed(
                        tokens_t, positions_t, torch.tensor(following, device=device), kept_t, out.taps, out.hidden
                    )
                )
            for b, k in enumerate(kept):
                if hidden and k and done[b] + k == lengths[b]:
                    last[b] = out.hidden[b, k - 1]
                done[b] += k
    return torch.stack(last) if hidden and all(x is not None for x in last) else None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
