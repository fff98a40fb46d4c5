"""The `specpair convert` command a verdict names as its fix: which layout makes a checkpoint loadable on a
stack, chosen to keep bits where a lossless path exists (convert/converter.py carries it out)."""

from __future__ import annotations

import shlex

from specpair.checkpoint import Checkpoint
from specpair.compat.stacks import FLOAT_LAYOUTS
from specpair.formats.layouts import layout_of

WEIGHT_GROUPS = ("attention", "linear_attention", "mlp", "experts", "shared_expert")


def convert_command(checkpoint: Checkpoint, stack: str, which: str, target_ref: str | None = None) -> str:
    """The `specpair convert` command that makes `checkpoint` loadable on `stack`, keeping bits where a
    lossless path exists (NVFP4 between flavours, a GGUF's own block type)."""
    spec = _convert_spec(checkpoint, stack, which)
    if spec.startswith("gguf:"):
        destination = f"{_out(checkpoint.ref)}-{spec.removeprefix('gguf:').lower()}.gguf"
    else:
        destination = f"{_out(checkpoint.ref)}-{spec.replace(':', '')}"
    command = ["specpair", "convert", checkpoint.ref, destination, "--to", spec]
    if which == "draft" and spec.startswith("gguf:") and checkpoint.tokenizer is None and target_ref:
        command += ["--target", target_ref]  # llama.cpp's DFlash GGUF carries the target's tokenizer
    return shlex.join(command)


def _convert_spec(checkpoint: Checkpoint, stack: str, which: str) -> str:
    quantized = {g.layout for g in checkpoint.groups if g.group in WEIGHT_GROUPS} - FLOAT_LAYOUTS
    nvfp4 = bool(quantized) and all(layout_of(layout).kind == "nvfp4" for layout in quantized)
    if stack == "llama.cpp":
        gguf_types = {layout_of(layout).flavour for layout in quantized if layout_of(layout).kind == "gguf"}
        if checkpoint.format == "gguf" and len(gguf_types) == 1:
            return f"gguf:{gguf_types.pop()}"  # a fork's GGUF rewritten: its blocks are copied as they are
        if nvfp4:
            return "gguf:NVFP4"  # codes and scales repacked bit for bit
        return "gguf:Q8_0" if which == "target" else "gguf:BF16"
    if nvfp4 and (which == "target" or stack == "vllm") and "nvfp4-modelopt" not in quantized:
        return "nvfp4"  # ModelOpt's flavour, which SGLang, vLLM and TensorFold read: a bit-for-bit repack
    if stack == "tensorfold" and which == "target":
        return "affine4"
    if stack == "exllamav3" and which == "target":
        return "exl3:4"  # ExLlamaV3's own layout, at its usual 4 bits
    return "bf16"


def _out(ref: str) -> str:
    return ref.partition("@")[0].rstrip("/").rsplit("/", 1)[-1].removesuffix(".gguf")
