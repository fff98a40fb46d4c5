"""`specpair run TARGET [DRAFT]`: generate with specpair's own runtime (PyTorch + Triton); with a drafter, the gate
(cli/_gate.py): the same prompts undrafted and drafted, compared token by token."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Annotated

import typer

from specpair.cli import app
from specpair.cli._options import GgufFileOpt, JsonOpt
from specpair.cli._output import print_json

SCHEMA = "specpair.run/1"
EXAMPLES = """\b
Examples:
  specpair run ./SmolLM2-135M-Instruct.Q4_1.gguf --prompt "The capital of France is" --max-tokens 16
  specpair run Qwen/Qwen3.6-35B-A3B --chat --prompt "Write a haiku about GPUs" --temperature 0.6 --seed 1
  specpair run ./Qwen3-8B-fp8 --prompt-file prompt.txt --device cuda --json
  specpair run --demo                                         # SmolLM2-135M with its DFlash drafter: the gate
  specpair run --demo draft-model                             # ... with its Q8_0 copy as draft model
  specpair run Qwen/Qwen3.6-35B-A3B z-lab/Qwen3.6-35B-A3B-DFlash --block-size 8 --json
  specpair run Qwen/Qwen3.6-35B-A3B --mtp --temperature 0.7 --seed 1

\b
Exit codes: 0 generated (with a drafter: every drafted reply identical to the undrafted one); 1 a drafted
reply differed (its first diverging position and both tokens are reported); 2 bad input (a family or layout
the runtime cannot run, a pair `specpair check` refuses, a model too big for the GPU)."""
GATE_MAX_TOKENS = 64  # per prompt and setting when the gate runs and --max-tokens is not given
# --demo on a CPU: the exact row-by-row CPU kernels run SmolLM2 at a few tok/s, and the gate has six settings
DEMO_CPU_MAX_TOKENS = 16
SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})(/|$)")
DEVICE = re.compile(r"cpu|cuda(:\d+)?")


@app.command(epilog=EXAMPLES)
def run(
    ctx: typer.Context,
    target: Annotated[
        str | None,
        typer.Argument(
            help="Checkpoint: local directory, .gguf file, a Hub repo org/name[@revision] already in the HF cache, or a specpair.lock (its pair)."
        ),
    ] = None,
    draft: Annotated[
        str | None,
        typer.Argument(
            help="Drafter (DFlash, DFlash2, EAGLE-3) or a draft model sharing the tokenizer: runs the gate."
        ),
    ] = None,
    prompt: Annotated[str | None, typer.Option("--prompt", help="The prompt text.")] = None,
    prompt_file: Annotated[
        str | None, typer.Option("--prompt-file", help="Read the prompt from this UTF-8 file.")
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Most tokens to generate.")] = 128,
    temperature: Annotated[
        float, typer.Option("--temperature", min=0.0, help="0 picks the most likely token (greedy).")
    ] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, help="Sample among the k most likely tokens (0: all).")] = 0,
    top_p: Annotated[
        float,
        typer.Option(
            "--top-p", min=0.0, max=1.0, help="Sample among the most likely tokens holding this much probability."
        ),
    ] = 1.0,
    seed: Annotated[
        int,
        typer.Option("--seed", help="Seed of the sampler's draws (keyed by position: the same seed, the same text)."),
    ] = 0,
    chat: Annotated[
        bool, typer.Option("--chat", help="Wrap the prompt in the model's chat template as a user message.")
    ] = False,
    device: Annotated[str | None, typer.Option("--device", help="cuda or cpu (default: cuda when present).")] = None,
    gguf_file: GgufFileOpt = None,
    mtp: Annotated[bool, typer.Option("--mtp", help="Draft with the target's own MTP head (runs the gate).")] = False,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="The built-in pair: SmolLM2-135M-Instruct and the DFlash drafter trained for it (TARGET draft-model: "
            "its Q8_0 copy as draft model).",
        ),
    ] = False,
    block_size: Annotated[
        int | None,
        typer.Option(
            "--block-size",
            min=1,
            help="Tokens verified per round, the anchor and block-1 drafts (default: the drafter's).",
        ),
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option("--batch", min=1, help="Run the gate at this concurrency only (default: solo and 4 concurrent)."),
    ] = None,
    draft_gguf_file: Annotated[
        str | None, typer.Option("--draft-gguf-file", help="Which .gguf file of DRAFT to read.")
    ] = None,
    draft_bits: Annotated[
        int,
        typer.Option(
            "--draft-bits", help="4: quantize the drafter to affine-4 at load, as TensorFold does; 0: as stored."
        ),
    ] = 0,
    rule: Annotated[
        str,
        typer.Option(
            "--rule",
            help="exact: drafted output is the undrafted output at every temperature; rejection: Leviathan's rule, equal in distribution only.",
        ),
    ] = "exact",
    graphs: Annotated[
        bool | None,
        typer.Option(
            "--graphs/--no-graphs",
            help="Decode and verify steps as CUDA graphs (default: on CUDA); --no-graphs runs them eagerly, for debugging.",
        ),
    ] = None,
    json_output: JsonOpt = False,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="Print only the generated text (with a drafter: only the summary line)."),
    ] = False,
) -> None:
    """Generate text from TARGET with specpair's runtime, streamed as it comes, then the speed. With DRAFT, --mtp or
    --demo: the gate, undrafted and drafted on the same prompts (built-in prose and code, or --prompt), greedy
    and two seeded temperatures (or --temperature/--seed), solo and 4 concurrent (or --batch)."""
    if draft is not None or mtp or demo or (target or "").endswith(".lock"):
        _gate(
            ctx,
            target,
            draft,
            mtp=mtp,
            demo=demo,
            prompt=prompt,
            prompt_file=prompt_file,
            max_tokens=max_tokens,
            sampling=(temperature, top_k, top_p, seed),
            chat=chat,
            device=device,
            gguf_file=gguf_file,
            draft_gguf_file=draft_gguf_file,
            block_size=block_size,
            batch=batch,
            draft_bits=draft_bits,
            rule=rule,
            graphs=graphs,
            json_output=json_output,
            quiet=quiet,
        )
        return
    if target is None:
        from specpair.errors import BadInput

        raise BadInput("TARGET", "give a checkpoint to run (or --demo for the built-in pair)")
    import torch

    from specpair.errors import BadInput
    from specpair.runtime import loading
    from specpair.runtime.generate import generate
    from specpair.runtime.sampling import Sampling
    from specpair.sources.model import open_model

    text = _prompt(prompt, prompt_file)
    if device is not None and not DEVICE.fullmatch(device):
        raise BadInput("--device", f"{device!r} is not cuda, cuda:N or cpu")
    where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if where.type == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device", "cuda asked, but torch sees no CUDA GPU here")
    if top_p == 0:
        raise BadInput("--top-p", "0 keeps no token; give a value in (0, 1]")
    model = open_model(target, gguf_file)
    plan = loading.plan_load(model, where)
    tokenizer = model.tokenizer()
    prompt_text = tokenizer.apply_chat_template([{"role": "user", "content": text}]) if chat else text
    ids = tokenizer.encode(prompt_text, add_special_tokens=not chat)
    if not ids:
        raise BadInput("--prompt", "the prompt encodes to no tokens")
    context = len(ids) + max_tokens
    if where.type == "cuda":
        _check_fits(plan, context)
    bar = not quiet and sys.stderr.isatty()
    stages = _Stages(not quiet, bar)
    with _progress(plan.stored_bytes, bar) as advance:
        start = time.perf_counter()
        stages.begin(f"loading {_size(plan.stored_bytes)} from {target} onto {where} ({_dtype(plan)})")
        try:
            runtime_model = loading.load(plan, advance)
        except torch.cuda.OutOfMemoryError:
            raise BadInput(target, _out_of_memory(plan, context, "while loading")) from None
        load_s = time.perf_counter() - start
    stages.end(f"loaded in {load_s:.1f} s ({plan.stored_bytes / load_s / 1e9:.2f} GB/s)" if load_s else "loaded")
    sampling = Sampling(temperature, top_k, top_p, seed)
    stops = sorted(set(tokenizer.stop_ids) | set(model.config.eos_token_ids))
    stream = _TextStream(tokenizer, stops) if not json_output else None
    try:
        (generated,), timing = generate(
            runtime_model,
            [ids],
            max_tokens,
            sampling,
            stops,
            on_token=(lambda row, token: stream.add(token)) if stream else None,
            graphs=graphs,
        )
    except torch.cuda.OutOfMemoryError:
        raise BadInput(target, _out_of_memory(plan, context, "while generating")) from None
    kept = generated.tokens[:-1] if generated.stopped else generated.tokens
    output = tokenizer.decode(kept)
    if not json_output:
        stream.finish(output)
        if not quiet:
            sys.stderr.write(
                f"{len(generated.tokens)} tokens in {timing.prefill_s + timing.decode_s:.2f} s: "
                f"{timing.tokens_per_s:.1f} tok/s (prompt {len(ids)} tokens in {timing.prefill_s:.2f} s) "
                f"· {where} {_dtype(plan)} · {model.config.family}\n"
            )
        return
    print_json(
        {
            "schema": SCHEMA,
            "target": {
                "ref": target,
                "revision": _revision(model),
                "family": model.config.family,
                "layouts": _layouts(plan),
            },
            "device": str(where),
            "dtype": _dtype(plan),
            "prompt": {"sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "tokens": len(ids), "chat": chat},
            "sampling": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed},
            "text": output,
            "tokens": generated.tokens,
            "stopped": generated.stopped,
            "tokens_per_s": timing.tokens_per_s,
            "decode_tokens_per_s": timing.decode_tokens_per_s,
            "prefill_tokens_per_s": timing.prefill_tokens_per_s,
            "seconds": {"load": load_s, "prefill": timing.prefill_s, "decode": timing.decode_s},
        }
    )


def _on_cpu(device: str | None) -> bool:
    if device is not None:
        return device == "cpu"
    import torch

    return not torch.cuda.is_available()


def _gate(
    ctx: typer.Context,
    target: str | None,
    draft: str | None,
    *,
    prompt: str | None,
    prompt_file: str | None,
    max_tokens: int,
    sampling: tuple,
    **options,
) -> None:
    """The drafted run: one sampling setting where one is given on the command line, else the gate's three."""
    from specpair.cli._gate import run_gate

    def typed(name: str) -> bool:  # ParameterSource by name: typer vendors click's enum in some versions
        source = ctx.get_parameter_source(name)
        return source is not None and source.name == "COMMANDLINE"

    given = any(typed(name) for name in ("temperature", "top_k", "top_p", "seed"))
    text = _prompt(prompt, prompt_file) if prompt is not None or prompt_file is not None else None
    if options["demo"]:
        from specpair.convert.demo import DEFAULT, drafter

        options["demo"], target = target or DEFAULT, None  # `--demo NAME`: NAME arrives as TARGET
        if options["block_size"] is None and _on_cpu(options["device"]):
            options["block_size"] = drafter(options["demo"]).cpu_block
    if not typed("max_tokens"):
        max_tokens = DEMO_CPU_MAX_TOKENS if options["demo"] and _on_cpu(options["device"]) else GATE_MAX_TOKENS
    code = run_gate(
        target,
        draft,
        prompt_text=text,
        max_tokens=max_tokens,
        sampling_given=sampling if given else None,
        draft_bits=options.pop("draft_bits") or None,
        **options,
    )
    raise typer.Exit(code)


def _prompt(prompt: str | None, prompt_file: str | None) -> str:
    from specpair.errors import BadInput

    if (prompt is None) == (prompt_file is None):
        raise BadInput("--prompt", "give the prompt with exactly one of --prompt TEXT and --prompt-file FILE")
    if prompt is not None:
        return prompt
    try:
        with open(prompt_file, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(prompt_file, f"cannot be read as UTF-8 text ({e.strerror or e.reason})") from None


def _dtype(plan) -> str:
    return str(plan.dtype).removeprefix("torch.")


def _revision(model) -> str | None:
    """The commit of a Hub repo read from the HF cache; None for a local path."""
    if os.path.exists(os.path.expanduser(model.ref)):
        return None
    found = SNAPSHOT.search(model.root.replace(os.sep, "/") + "/")
    return found.group(1) if found else None


def _layouts(plan) -> dict[str, int]:
    """Stored layout -> number of weights in it, as the runtime holds them (packed, or dequantized from it)."""
    counts: dict[str, int] = {}
    for name in plan.needs:
        layout = plan.model.layout(name) + (
            "" if name in plan.packed or plan.model.layout(name) in ("bf16", "f16", "f32") else " (dequantized)"
        )
        counts[layout] = counts.get(layout, 0) + 1
    return dict(sorted(counts.items()))


def _check_fits(plan, context: int) -> None:
    import torch

    from specpair.errors import BadInput

    free, _ = torch.cuda.mem_get_info(plan.device)
    if _needs(plan, context) > free:
        raise BadInput(
            plan.model.ref,
            does_not_fit(plan, context, free, f"{_gb(free)} GB are free on {torch.cuda.get_device_name(plan.device)}"),
        )


def _out_of_memory(plan, context: int, when: str) -> str:
    import torch

    return does_not_fit(plan, context, torch.cuda.mem_get_info(plan.device)[0], f"ran out of GPU memory {when}")


def _cache_bytes(plan, context: int) -> int:
    from specpair.runtime.cache import Cache

    return Cache(plan.model.config, 1, context, plan.dtype, "meta").nbytes


def _needs(plan, context: int, weights: float | None = None) -> float:
    """Weights as loaded + the cache + compat/memory.py's working memory per GPU (what `check` adds too)."""
    from specpair.compat.memory import OVERHEAD_PER_GPU

    return (plan.resident_bytes if weights is None else weights) + _cache_bytes(plan, context) + OVERHEAD_PER_GPU


def does_not_fit(plan, context: int, free: float, why: str) -> str:
    """What running needs and why it does not fit; the smaller layout of the matmul weights that would fit
    `free` bytes, if there is one."""
    import math

    from specpair.compat.memory import OVERHEAD_PER_GPU

    message = (
        f"needs {_gb(_needs(plan, context))} GB on the GPU ({_gb(plan.resident_bytes)} GB of weights as loaded, "
        f"{_gb(_cache_bytes(plan, context))} GB of cache for {context} tokens, {_gb(OVERHEAD_PER_GPU)} GB working "
        f"memory); {why}"
    )
    matmul = [n for n, need in plan.needs.items() if need.matmul]
    values = sum(math.prod(plan.needs[n].shape) for n in matmul)
    bits_now = 8 * sum(plan.resident[n] for n in matmul) / values
    other = plan.resident_bytes - sum(plan.resident[n] for n in matmul)
    for bits, layout in ((8.5, "fp8"), (4.5, "nvfp4")):
        if bits < bits_now and _needs(plan, context, values * bits / 8 + other) <= free:
            return message + (
                f"; with its matmul weights at {bits:g} bits it would fit: "
                f"specpair convert {plan.model.ref} DST --to {layout}"
            )
    return message + "; a smaller layout would not fit this GPU either (`specpair check` names multi-GPU stacks)"


def _gb(nbytes: float) -> float:
    from specpair.compat.memory import gb

    return gb(nbytes)


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


class _Stages:
    """A line on stderr as a stage starts where no progress bar shows it (a pipe, a log file), and as it ends."""

    def __init__(self, enabled: bool, bar: bool) -> None:
        self.enabled, self.bar = enabled, bar

    def begin(self, what: str) -> None:
        if self.enabled and not self.bar:
            sys.stderr.write(what + " ...\n")
            sys.stderr.flush()

    def end(self, what: str) -> None:
        if self.enabled:
            sys.stderr.write(what + "\n")


class _TextStream:
    """Writes the generated text to stdout as tokens arrive: each time, what the decoded text has gained,
    held back while it ends inside a UTF-8 sequence (decode shows those bytes as U+FFFD)."""

    def __init__(self, tokenizer, stops: list[int]) -> None:
        self.tokenizer, self.stops, self.tokens, self.written = tokenizer, set(stops), [], ""

    def add(self, token: int) -> None:
        if token in self.stops:
            return
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens)
        if text.startswith(self.written) and not text.endswith("\ufffd"):
            sys.stdout.write(text[len(self.written) :])
            sys.stdout.flush()
            self.written = text

    def finish(self, text: str) -> None:
        """The final text (stop token dropped): what is still missing, then a newline."""
        sys.stdout.write((text[len(self.written) :] if text.startswith(self.written) else "\n" + text) + "\n")
        sys.stdout.flush()


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    """Bytes read, rate and ETA on stderr when it is a terminal."""
    if not enabled:
        yield lambda nbytes: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress(
        "loading",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("bytes", total=total)
        yield lambda nbytes: bar.update(task, advance=nbytes)
