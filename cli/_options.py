"""Option types shared by commands, each declared once so that every command spells and explains it the same way.

--json and --quiet mean one thing everywhere (cli/_output.py): --json puts one JSON document on stdout, errors
included; --quiet leaves on stdout only the result a script needs, and nothing on stderr but an error.
"""

from __future__ import annotations

from typing import Annotated

import typer

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout (errors too) instead of tables.")
]
QuietOpt = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Print only the result a script needs (see Output below), no progress or warnings."
    ),
]
GgufFileOpt = Annotated[
    str | None, typer.Option("--gguf-file", help="Which .gguf file to read when a directory or repo holds several.")
]
DraftGgufFileOpt = Annotated[str | None, typer.Option("--draft-gguf-file", help="Which .gguf file of DRAFT to read.")]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Do not contact the Hub: use the HF cache, then the built-in catalog.")
]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show every row: all findings, all tensors.")]
DeviceOpt = Annotated[
    str | None, typer.Option("--device", help="Where the work runs: cuda, cuda:N or cpu (default: cuda when present).")
]
MtpOpt = Annotated[bool, typer.Option("--mtp", help="Draft with the target's own MTP head (give no DRAFT).")]
BlockSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--block-size", min=1, help="Tokens verified per round, the anchor and block-1 drafts (default: the drafter's)."
    ),
]
DraftBitsOpt = Annotated[
    int,
    typer.Option("--draft-bits", help="4: quantize the drafter to affine-4 at load, as TensorFold does; 0: as stored."),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        help="CPU threads for the runtime (default: OMP_NUM_THREADS, else the cores idle now: a thread on a busy core stalls every op).",
    ),
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help="What the model runs in: bfloat16 or float32 (default: bfloat16 on a GPU and on a CPU with native bf16 products, else float32; float32 on a CPU gives transformers' float32 bits).",
    ),
]
TpOpt = Annotated[
    int,
    typer.Option(
        "--tp",
        min=1,
        help="Tensor parallelism: run as N processes, one GPU each (gloo processes on a CPU); only the first prints. Also works under torchrun --nproc-per-node N -m specpair.",
    ),
]
GraphsOpt = Annotated[
    bool | None,
    typer.Option(
        "--graphs/--no-graphs",
        help="Decode and verify steps as CUDA graphs (default: on CUDA); --no-graphs runs them eagerly, for debugging.",
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option("--dry-run", help="Print the plan (what would be written or fetched, and why) and change nothing."),
]
ChatOpt = Annotated[
    bool | None,
    typer.Option(
        "--chat/--no-chat",
        help="Wrap each prompt in the target's chat template as a user message (default: when it has one; --no-chat: raw text).",
    ),
]
ChatKwargsOpt = Annotated[
    str | None,
    typer.Option(
        "--chat-template-kwargs",
        metavar="JSON",
        help="Variables the chat template is rendered with, a JSON object as vLLM and SGLang take it, e.g. '{\"enable_thinking\": false}': acceptance depends on the mode the drafter was trained in (z-lab/dflash#60).",
    ),
]
PromptsOpt = Annotated[
    str | None,
    typer.Option(
        "--prompts",
        help="Run these prompts: a file of one a line, or JSONL records with a `prompt` string or chat `messages` (and a `category`); `builtin`: the set shipped with specpair (chat, code, math, long context).",
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="Write the acceptance measured to this file as ModelOpt's speculation_profile.json (schema 1.0).",
    ),
]
