"""`specpair run TARGET [DRAFT]`: generate with specpair's own runtime (PyTorch + Triton); with a drafter, the gate
(app/gate.py): the same prompts undrafted and drafted, compared token by token."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from specpair.app.gate import GATE_MAX_TOKENS
from specpair.app.generation import MAX_TOKENS
from specpair.app.pair import DEMO_CPU_MAX_TOKENS
from specpair.cli._options import (
    BlockSizeOpt,
    ChatKwargsOpt,
    ChatOpt,
    DeviceOpt,
    DraftBitsOpt,
    DraftGgufFileOpt,
    DtypeOpt,
    GgufFileOpt,
    GraphsOpt,
    JsonOpt,
    MtpOpt,
    ProfileOpt,
    PromptsOpt,
    QuietOpt,
    ThreadsOpt,
    TpOpt,
)
from specpair.cli._output import Output, printable

EXAMPLES = """\b
Examples:
  specpair run ./SmolLM2-135M-Instruct.Q4_1.gguf --prompt "The capital of France is" --max-tokens 16
  specpair run Qwen/Qwen3.6-35B-A3B --chat --prompt "Write a haiku about GPUs" --temperature 0.6 --seed 1
  specpair run ./Qwen3-8B-fp8 --prompt-file prompt.txt --device cuda --json
  specpair run --demo                                         # SmolLM2-135M with its DFlash drafter: the gate
  specpair run --demo draft-model                             # ... with its Q8_0 copy as draft model
  specpair run Qwen/Qwen3.6-35B-A3B z-lab/Qwen3.6-35B-A3B-DFlash --block-size 8 --json
  specpair run Qwen/Qwen3.6-35B-A3B --mtp --temperature 0.7 --seed 1
  specpair run ./Qwen3-8B ./Qwen3-8B-EAGLE3 --prompts traffic.jsonl --temperature 0 --batch 1 --profile profile.json

\b
Output: the text on stdout as it is generated, then the speed on stderr; --quiet: only the text. With a drafter:
the revisions and file hashes, the replies of the first setting, any divergence in context, and a summary line
last (--quiet: only the summary line); each setting's result on stderr as it completes. --json: one document
(schema specpair.run/1). Prompts go through the target's chat template when it has one (--no-chat: raw text).
tau and acceptance by position count the same rounds: a round cut short by --max-tokens or a stop token (the last
of a reply) is left out of both, so tau = 1 + the sum of acceptance by position.

\b
Exit codes: 0 generated (with a drafter: every drafted reply identical to the undrafted one); 1 a drafted
reply differed (its first diverging position and both tokens are reported); 2 bad input (a family or layout
the runtime cannot run, a pair `specpair check` refuses, a model too big for the GPU); 3 inconclusive: a setting
compared fewer than 16 generated tokens (the target stopped after N tokens, or --max-tokens), so it proves
nothing and is never reported identical."""

TargetArg = Annotated[
    str | None,
    typer.Argument(
        help="Checkpoint: local directory, .gguf file, a Hub repo org/name[@revision] already in the HF cache, or a specpair.lock (its pair)."
    ),
]
DraftArg = Annotated[
    str | None,
    typer.Argument(help="Drafter (DFlash, DFlash2, EAGLE-3) or a draft model sharing the tokenizer: runs the gate."),
]
PromptOpt = Annotated[str | None, typer.Option("--prompt", help="The prompt text.")]
PromptFileOpt = Annotated[str | None, typer.Option("--prompt-file", help="Read the prompt from this UTF-8 file.")]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        min=1,
        help=f"Most tokens to generate (default: {MAX_TOKENS}; with a drafter {GATE_MAX_TOKENS} per prompt and "
        f"setting, {DEMO_CPU_MAX_TOKENS} for --demo on a CPU).",
    ),
]
TemperatureOpt = Annotated[
    float, typer.Option("--temperature", min=0.0, help="0 picks the most likely token (greedy).")
]
TopKOpt = Annotated[int, typer.Option("--top-k", min=0, help="Sample among the k most likely tokens (0: all).")]
TopPOpt = Annotated[
    float,
    typer.Option(
        "--top-p", min=0.0, max=1.0, help="Sample among the most likely tokens holding this much probability."
    ),
]
SeedOpt = Annotated[
    int, typer.Option("--seed", help="Seed of the sampler's draws (keyed by position: the same seed, the same text).")
]
DemoOpt = Annotated[
    bool,
    typer.Option(
        "--demo",
        help="The built-in pair: SmolLM2-135M-Instruct and the DFlash drafter trained for it (TARGET draft-model: "
        "its Q8_0 copy as draft model).",
    ),
]
BatchOpt = Annotated[
    int | None,
    typer.Option("--batch", min=1, help="Run the gate at this concurrency only (default: solo and 4 concurrent)."),
]
RuleOpt = Annotated[
    str,
    typer.Option(
        "--rule",
        help="exact: drafted output is the undrafted output at every temperature; rejection: Leviathan's rule, equal in distribution only.",
    ),
]
SAMPLING = ("temperature", "top_k", "top_p", "seed")


def run(
    ctx: typer.Context,
    target: TargetArg = None,
    draft: DraftArg = None,
    prompt: PromptOpt = None,
    prompt_file: PromptFileOpt = None,
    prompts: PromptsOpt = None,
    profile: ProfileOpt = None,
    max_tokens: MaxTokensOpt = None,
    temperature: TemperatureOpt = 0.0,
    top_k: TopKOpt = 0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    chat: ChatOpt = None,
    chat_template_kwargs: ChatKwargsOpt = None,
    device: DeviceOpt = None,
    threads: ThreadsOpt = None,
    dtype: DtypeOpt = None,
    tp: TpOpt = 1,
    gguf_file: GgufFileOpt = None,
    mtp: MtpOpt = False,
    demo: DemoOpt = False,
    block_size: BlockSizeOpt = None,
    batch: BatchOpt = None,
    draft_gguf_file: DraftGgufFileOpt = None,
    draft_bits: DraftBitsOpt = 0,
    rule: RuleOpt = "exact",
    graphs: GraphsOpt = None,
    json_output: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Generate text from TARGET with specpair's runtime, streamed as it comes, then the speed. With DRAFT, --mtp or
    --demo: the gate, undrafted and drafted on the same prompts (built-in prose and code, --prompt or --prompts),
    greedy and two seeded temperatures (or --temperature/--seed), solo and 4 concurrent (or --batch)."""
    from specpair.app.device import on_cpu, start_ranks
    from specpair.app.prompts import read_prompt
    from specpair.errors import BadInput

    ended = start_ranks(tp)
    if ended is not None:
        raise typer.Exit(ended)
    out = Output(json_output, quiet)
    sampling = (temperature, top_k, top_p, seed)
    shared = _shared_settings(chat, chat_template_kwargs, device, threads, dtype, gguf_file, graphs)
    if draft is not None or mtp or demo or (target or "").endswith(".lock"):
        from specpair.app.gate import run_gate
        from specpair.app.profile import write_profile

        text, records = _gate_prompts(prompt, prompt_file, prompts, profile, chat)
        given = [ctx.get_parameter_source(name) for name in SAMPLING]  # by name: typer vendors click's enum
        report = run_gate(
            target,
            draft,
            mtp=mtp,
            demo=demo,
            prompt=text,
            prompts=records,
            max_tokens=max_tokens or (DEMO_CPU_MAX_TOKENS if demo and on_cpu(device) else GATE_MAX_TOKENS),
            sampling=sampling if any(s is not None and s.name == "COMMANDLINE" for s in given) else None,
            draft_gguf_file=draft_gguf_file,
            block_size=block_size,
            batch=batch,
            draft_bits=draft_bits or None,
            rule=rule,
            progress=out,
            **shared,
        )
        if profile is not None:
            write_profile(profile, report.profile())
        out.result(report.to_json, lambda: print_gate(report), quiet=[report.summary])
        raise typer.Exit(report.exit_code)
    if target is None:
        raise BadInput("TARGET", "give a checkpoint to run (or --demo for the built-in pair)")
    if prompts is not None or profile is not None:
        raise BadInput("--prompts" if prompts is not None else "--profile", "needs a drafter: give DRAFT or --mtp")
    text = read_prompt(prompt, prompt_file)
    _generate(out, target=target, prompt=text, max_tokens=max_tokens or MAX_TOKENS, sampling=sampling, **shared)


def _shared_settings(
    chat: bool | None, chat_template_kwargs: str | None, device, threads, dtype, gguf_file, graphs
) -> dict[str, Any]:
    """What the gate and a plain generation both take from the command line, by their parameters' names."""
    from specpair.app.prompts import template_kwargs

    return {
        "chat": chat,
        "chat_kwargs": template_kwargs(chat_template_kwargs),
        "device": device,
        "threads": threads,
        "dtype": dtype,
        "gguf_file": gguf_file,
        "graphs": graphs,
    }


def _gate_prompts(
    prompt: str | None, prompt_file: str | None, prompts: str | None, profile: str | None, chat: bool | None
) -> tuple[str | None, list | None]:
    """The gate's prompt (--prompt, --prompt-file) or prompts (--prompts), at most one given, read and checked
    with --profile's directory before any work."""
    from specpair.app.profile import check_writable
    from specpair.app.prompts import read_prompt, read_prompts
    from specpair.errors import BadInput

    if prompts is not None and (prompt is not None or prompt_file is not None):
        raise BadInput("--prompts", "give at most one of --prompt, --prompt-file and --prompts")
    if profile is not None:
        check_writable(profile)
    text = read_prompt(prompt, prompt_file) if prompt is not None or prompt_file is not None else None
    return text, read_prompts(prompts, chat) if prompts is not None else None


def _generate(out: Output, **settings: Any) -> None:
    """`generate_text` with `settings` (the command's), the text streamed to stdout unless --json, then its speed."""
    from specpair.app.generation import generate_text

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    done = generate_text(**settings, on_text=None if out.json else write, progress=out)
    timing = done.timing
    out.result(
        done.to_json,
        lambda: out.note(
            f"{len(done.tokens)} tokens in {timing.prefill_s + timing.decode_s:.2f} s: "
            f"{timing.tokens_per_s:.1f} tok/s (prompt {done.prompt_tokens} tokens in {timing.prefill_s:.2f} s) "
            f"· {done.device}{f' x{done.tensor_parallel}' if done.tensor_parallel > 1 else ''} {done.target.dtype} "
            f"· {done.target.model.config.family}"
        ),
    )


def print_gate(report) -> None:
    """The gate for people (stdout): what ran, with revisions and file hashes; the replies of the first setting;
    where a drafted reply left the undrafted one, in context; the summary line last."""
    lines = []
    for role in ("target", "draft"):
        described = report.described(role)
        if described.get("mtp"):
            lines.append(f"draft   the MTP head of {described['ref']} ({report.kind}, {report.block_label})")
            continue
        what = described["family"] if role == "target" else f"{report.kind}, {report.block_label}"
        revision = described["revision"] or "none (not a Hub repo)"
        lines.append(f"{role:<7} {described['ref']} ({what}) · revision {revision}")
        lines += [f"  {name}  sha256 {digest}" for name, digest in described["files"].items()]
    first = report.cells[0]
    shown = set()
    for index, (_, drafted) in zip(first.indices, first.outputs):
        if index not in shown:
            shown.add(index)
            prompt = report.prompts[index]
            lines.append(f"reply {index + 1} ({prompt.name}, {first.label}):")
            lines += ["  " + line for line in printable(report.text(drafted)).split("\n")]
    for d in report.divergences():
        lines.append(
            f"DIVERGED {d.setting} batch {d.batch} prompt {d.prompt}: at token {d.position} undrafted "
            f"{d.undrafted} vs drafted {d.drafted}"
        )
        lines.append(f'  undrafted: "…{printable(d.before, True)}⟨{printable(d.undrafted_after, True)}⟩…"')
        lines.append(f'  drafted:   "…{printable(d.before, True)}⟨{printable(d.drafted_after, True)}⟩…"')
    lines += [f"INCONCLUSIVE {reason}" for reason in report.inconclusive]
    sys.stdout.write("\n".join(lines + [report.summary]) + "\n")
