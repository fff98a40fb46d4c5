"""`specpair inspect REF`: the normalized Checkpoint of one local path, GGUF file or Hub repo."""

from __future__ import annotations

from typing import Annotated

import typer

from specpair.cli._options import GgufFileOpt, JsonOpt, OfflineOpt
from specpair.cli._output import Output, console, print_prose, print_table

EXAMPLES = """\b
Examples:
  specpair inspect ./Qwen3.6-35B-A3B
  specpair inspect z-lab/Qwen3.6-35B-A3B-DFlash --json
  specpair inspect ./models --gguf-file qwen3.6-35b-a3b-dflash.gguf

\b
Output: what was read, a line per fact, and the tensor groups; --json: one document (schema specpair.inspect/1)."""
RefArg = Annotated[str, typer.Argument(help="Local directory, .gguf file, or Hub repo org/name[@revision].")]


def inspect(
    ref: RefArg, gguf_file: GgufFileOpt = None, offline: OfflineOpt = False, json_output: JsonOpt = False
) -> None:
    """Print what specpair reads from one checkpoint's metadata (no tensor data is read)."""
    from specpair.sources import open_checkpoint

    checkpoint = open_checkpoint(ref, gguf_file, offline or None)
    Output(json_output).result(
        lambda: {"schema": "specpair.inspect/1", "checkpoint": checkpoint.to_json()}, lambda: print_human(checkpoint)
    )


def print_human(checkpoint) -> None:
    from rich.table import Table

    out = console()
    s, r, d = checkpoint.shapes, checkpoint.rope, checkpoint.drafter
    rows = [
        ("checkpoint", f"{checkpoint.ref} ({checkpoint.source}, {checkpoint.format})"),
        ("revision", checkpoint.revision or "unknown"),
        ("role", checkpoint.role),
        ("family", f"{checkpoint.family} ({checkpoint.architecture or checkpoint.model_type})"),
        (
            "shapes",
            f"hidden {s.hidden_size}, {s.num_layers} layers, heads {s.num_heads}/{s.num_kv_heads}, head_dim {s.head_dim}",
        ),
        ("layer types", _layer_summary(s.layer_types)),
        (
            "vocabulary",
            f"vocab_size {s.vocab_size}, embedding rows {s.embedding_rows or 'unknown'}"
            if s.vocab_size
            else "none of its own: its target's (no tokenizer, no token_embd)",
        ),
        (
            "rope",
            f"theta {r.theta}, {r.rope_type or 'default'}, max positions {r.max_position_embeddings}"
            + (f", sliding window {r.sliding_window}" if r.sliding_window else ""),
        ),
    ]
    if s.num_experts:
        rows.append(("experts", f"{s.num_experts} (top {s.experts_per_token}), width {s.moe_intermediate_size}"))
    if checkpoint.tokenizer:
        t = checkpoint.tokenizer
        rows.append(
            ("tokenizer", f"{t.length} tokens, {t.source}, fingerprint {(t.fingerprint or t.family or 'unknown')[:16]}")
        )
    if checkpoint.mtp:
        from specpair.checkpoint.families import HEAD_KIND

        rows.append((HEAD_KIND.name, f"{checkpoint.mtp.layers} layer(s), {checkpoint.mtp.tensors} tensors present"))
    if d:
        taps = (
            f"outputs of layers {d.taps.layers} ({d.taps.source} {d.taps.raw}: {d.taps.convention})"
            if d.taps
            else "missing"
        )
        rows += [
            ("drafter", d.kind),
            ("taps", taps),
            ("block size", str(d.block_size)),
            ("mask token", str(d.mask_token_id)),
            ("fc.weight", str(d.fc_shape)),
        ]
        if d.eagle_norms:
            rows.append(("EAGLE-3.1", ", ".join(d.eagle_norms)))
    if checkpoint.quantization:
        q = checkpoint.quantization
        rows.append(("quantization", " ".join(str(x) for x in (q.method, q.algo, q.producer) if x)))
    for note in checkpoint.notes:
        rows.append(("note", note))
    if checkpoint.provenance:
        rows.append(("provenance", checkpoint.provenance))
    from rich.markup import escape

    for key, value in rows:  # lines, not a table: a provenance paragraph would pad every row to its width
        print_prose(out, f"[bold]{key:<13}[/bold]{escape(value)}")
    if checkpoint.groups:
        groups = Table("group", "layout", "tensors", "GB")
        for g in checkpoint.groups:
            groups.add_row(g.group, g.layout, str(g.tensors), f"{g.bytes / 1e9:.3f}")
        print_table(out, groups)


def _layer_summary(layer_types: list[str]) -> str:
    counts = {t: layer_types.count(t) for t in dict.fromkeys(layer_types)}
    return ", ".join(f"{n} {t}" for t, n in counts.items()) or "none"
