"""The `specpair convert` command a verdict names as its fix: which layout makes a checkpoint loadable on a
stack, chosen to keep bits where a lossless path exists (convert/converter.py carries it out)."""

from __future__ import annotations

import shlex

from specpair.checkpoint import Checkpoint
from specpair.compat.stacks import FLOAT_LAYOUTS, STACKS, fetch_step, pinned_ref
from specpair.formats.layouts import GGUF, NVFP4, layout_of

WEIGHT_GROUPS = ("attention", "linear_attention", "mlp", "experts", "shared_expert")


def convert_command(checkpoint: Checkpoint, stack: str, which: str, target: Checkpoint | None = None) -> list[str]:
    """The `specpair convert` command, in its steps, that makes `checkpoint` loadable on `stack`, keeping bits where a
    lossless path exists (NVFP4 between flavours, a GGUF's own block type); after the download that puts a Hub
    checkpoint where convert reads it (convert reads local files only)."""
    spec = _convert_spec(checkpoint, stack, which)
    command = ["specpair", "convert", pinned_ref(checkpoint), destination(checkpoint.ref, spec), "--to", spec]
    reads = [checkpoint]
    if which == "draft" and spec.startswith("gguf:") and checkpoint.tokenizer is None and target:
        command += ["--target", pinned_ref(target)]  # llama.cpp's DFlash GGUF carries the target's tokenizer
        reads.append(target)
    fetches = [step for c in reads if (step := fetch_step(c))]
    return [*fetches, shlex.join(command)]


def destination(ref: str, spec: str) -> str:
    """Where a printed convert command writes: the source's name and the layout, in the working directory."""
    if spec.startswith("gguf:"):
        return f"{_out(ref)}-{spec.removeprefix('gguf:').lower()}.gguf"
    return f"{_out(ref)}-{spec.replace(':', '')}"


def _convert_spec(checkpoint: Checkpoint, stack: str, which: str) -> str:
    quantized = {g.layout for g in checkpoint.groups if g.group in WEIGHT_GROUPS} - FLOAT_LAYOUTS
    forms = [layout_of(layout) for layout in quantized]
    nvfp4 = bool(forms) and all(form.kind == NVFP4 for form in forms)
    if STACKS[stack].file_format == "gguf":
        gguf_types = {form.flavour for form in forms if form.kind == GGUF}
        if checkpoint.format == "gguf" and len(gguf_types) == 1:
            return f"gguf:{gguf_types.pop()}"  # a fork's GGUF rewritten: its blocks are copied as they are
        if nvfp4:
            return "gguf:NVFP4"  # codes and scales repacked bit for bit
    elif nvfp4 and (which == "target" or stack == "vllm") and not any(f.flavour == "modelopt" for f in forms):
        return NVFP4  # ModelOpt's flavour, which SGLang, vLLM and TensorFold read: a bit-for-bit repack
    return STACKS[stack].convert_to.get(which, "bf16")


def _out(ref: str) -> str:
    return ref.partition("@")[0].rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
