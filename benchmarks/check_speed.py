"""Time `specpair check` on MoE checkpoints of real size, cold and with its metadata cache, in fresh processes.

Targets, every tensor their quantization config implies (tools/build_catalog.py's parameter formulas and storage
rules, the ones the catalog is built with), in HF shards of at most 5 GB with an index, a 248k-token
tokenizer.json, generation and tokenizer configs:
- nvidia/Qwen3.6-35B-A3B-NVFP4 from its published config.json and hf_quant_config.json
  (catalog/sources/real-configs): 94,393 tensors, experts stored one by one (weight, weight_scale,
  weight_scale_2 each), ~12 MB of headers over 5 shards and a ~10 MB index;
- a Qwen3.5-397B-A17B-class NVFP4 checkpoint (512 experts, 60 layers) from Qwen/Qwen3.5-397B-A17B's config with
  routed experts in NVFP4 as nvidia's Qwen3.5-122B-A10B-NVFP4 stores them (weight, weight_scale, weight_scale_2,
  input_scale): the same code on ~4x the tensors, to show the time grows linearly.
Drafters: z-lab's DFlash layout for each (dflash.md §1.3). Tensor data sections are sparse files: the checkpoints
cost no disk, and reading any data would show up as time.

Cold: each run with an empty HF_HUB_CACHE, where specpair keeps its parsed-metadata cache. Cached: runs after one
that filled it. Baselines measured in the same run: a bare interpreter, `import torch` (what a checker that loads a
framework pays before reading anything), and the parse floor: orjson.loads of every JSON file a cold check has to
read (configs, headers, tokenizer), in one warm process.

    python benchmarks/check_speed.py [--runs 5] [--skip-512] [--before DIR]

--before DIR times another checkout of specpair too (DIR: a folder holding it as `specpair`, e.g. from
`git archive <commit> | tar -x -C /tmp/old && ln -s /tmp/old /tmp/before/specpair`), on the same checkpoints,
its cold runs taking turns with this one's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL_CONFIGS = REPO / "catalog" / "sources" / "real-configs"
SHARD_BYTES = 5 * 10**9
VOCAB, TOKENS = 248320, 248077
# nvidia/Qwen3.5-122B-A10B-NVFP4's pattern: only routed experts in NVFP4 (targets.md §2.3).
ROUTED_EXPERTS_NVFP4 = {
    "producer": {"name": "modelopt", "version": "0.44.0"},
    "quantization": {
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": "FP8",
        "group_size": 16,
        "exclude_modules": [
            "lm_head",
            "*linear_attn*",
            "*self_attn*",
            "*shared_expert*",
            "*mlp.gate",
            "model.visual*",
            "mtp*",
        ],
    },
}


def builder():
    spec = importlib.util.spec_from_file_location("build_catalog", REPO / "tools" / "build_catalog.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_safetensors(path: Path, tensors: list) -> None:
    """A valid header (compact, as the safetensors library writes it) followed by a sparse data section."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
    os.truncate(path, 8 + len(raw) + offset)


def write_target(root: Path, config: dict, quant: dict | None) -> int:
    """The checkpoint's files; returns its tensor count."""
    b = builder()
    quant_files = {"hf_quant_config.json": quant} if quant else {}
    tensors = b.derived_tensors(b.build_checkpoint("target", config, quant_files, None), config, quant_files, None)
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    if quant:
        (root / "hf_quant_config.json").write_text(json.dumps(quant, indent=4))
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    weight_map = {}
    for k, shard in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(root / name, shard)
        weight_map.update({t.name: name for t in shard})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    write_tokenizer(root)
    return len(tensors)


def write_tokenizer(root: Path) -> None:
    vocab = {f"\u0120tok{i}": i for i in range(248044)}
    added = [{"id": 248044 + i, "content": f"<|special_{i}|>", "special": True} for i in range(TOKENS - 248044)]
    merges = [f"\u0120t ok{i}" for i in range(247587)]
    tokenizer = {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel"},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges},
    }
    (root / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (root / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|special_2|>", "pad_token": "<|special_0|>"})
    )
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044], "pad_token_id": 248044}))


def write_draft(root: Path, hidden: int, target_layers: int, taps: list[int], ffn: int) -> None:
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "num_hidden_layers": 6,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": ffn,
        "vocab_size": VOCAB,
        "max_position_embeddings": 262144,
        "num_target_layers": target_layers + 1,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "sliding_window": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000},
        "dflash_config": {"target_layer_ids": taps, "mask_token_id": TOKENS, "block_size": 16},
    }
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    Tensor = builder().TensorInfo
    shapes = {"fc.weight": [hidden, len(taps) * hidden], "hidden_norm.weight": [hidden], "norm.weight": [hidden]}
    for i in range(6):
        for name, shape in (
            ("self_attn.q_proj", [4096, hidden]),
            ("self_attn.k_proj", [1024, hidden]),
            ("self_attn.v_proj", [1024, hidden]),
            ("self_attn.o_proj", [hidden, 4096]),
            ("mlp.gate_proj", [ffn, hidden]),
            ("mlp.up_proj", [ffn, hidden]),
            ("mlp.down_proj", [hidden, ffn]),
        ):
            shapes[f"layers.{i}.{name}.weight"] = shape
        for name in ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
            shapes[f"layers.{i}.{name}.weight"] = [128 if "_norm" in name and "self_attn" in name else hidden]
    tensors = [Tensor(n, "BF16", tuple(s), 2 * math.prod(s), "model.safetensors") for n, s in shapes.items()]
    write_safetensors(root / "model.safetensors", tensors)


def environment(**extra: str) -> dict[str, str]:
    """This environment with bytecode caching on, as an installed specpair has it (its .pyc files written once)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, **extra}


def median_seconds(cmd: list[str], runs: int, env: dict[str, str] | None = None, fresh_cache: bool = False) -> float:
    return interleaved_medians(cmd, runs, [env or environment()], fresh_cache)[0]


def interleaved_medians(cmd: list[str], runs: int, envs: list[dict[str, str]], fresh_cache: bool) -> list[float]:
    """The median time of `cmd` under each environment, the environments taking turns run by run: a machine
    whose speed drifts during the benchmark (a shared VM) slows each of them alike."""
    times: list[list[float]] = [[] for _ in envs]
    for _ in range(runs):
        for env, taken in zip(envs, times):
            run_env = dict(env)
            with tempfile.TemporaryDirectory() as cache:
                if fresh_cache:
                    run_env["HF_HUB_CACHE"] = cache
                start = time.perf_counter()
                done = subprocess.run(cmd, capture_output=True, env=run_env)
                taken.append(time.perf_counter() - start)
            if done.returncode not in (0, 1):
                sys.exit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.decode()[-800:]}")
    return [statistics.median(taken) for taken in times]


def parse_floor(target: Path, draft: Path, runs: int) -> float:
    """orjson.loads of every JSON a cold check reads (configs, tokenizer, each shard's header), in a warm process."""
    code = f"""
import orjson, pathlib, struct, time
files = [p for d in ({str(target)!r}, {str(draft)!r}) for p in sorted(pathlib.Path(d).iterdir())]
times = []
for _ in range({runs}):
    start = time.perf_counter()
    for p in files:
        if p.suffix == ".safetensors":
            with open(p, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                orjson.loads(f.read(n))
        elif p.suffix == ".json" and not p.name.endswith(".index.json"):
            orjson.loads(p.read_bytes())
    times.append(time.perf_counter() - start)
print(sorted(times)[len(times) // 2])
"""
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def sizes(root: Path) -> str:
    headers = 0
    for p in root.glob("*.safetensors"):
        with open(p, "rb") as f:
            headers += struct.unpack("<Q", f.read(8))[0]
    index = (root / "model.safetensors.index.json").stat().st_size
    tokenizer = (root / "tokenizer.json").stat().st_size
    shards = len(list(root.glob("*.safetensors")))
    return f"{headers / 1e6:.1f} MB of headers in {shards} shards, a {index / 1e6:.1f} MB index, a {tokenizer / 1e6:.1f} MB tokenizer.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--skip-512", action="store_true", help="only the 94k-tensor pair")
    parser.add_argument("--before", type=Path, help="a folder holding an earlier specpair checkout as `specpair`")
    args = parser.parse_args()
    python = sys.executable
    pairs = [
        (
            "nvidia/Qwen3.6-35B-A3B-NVFP4 + DFlash",
            json.loads((REAL_CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.json").read_text()),
            json.loads((REAL_CONFIGS / "nvidia__Qwen3.6-35B-A3B-NVFP4.hf_quant_config.json").read_text()),
            (2048, 40, [1, 6, 11, 16, 22, 27, 32, 37], 6144),
        )
    ]
    if not args.skip_512:
        config = json.loads((REAL_CONFIGS / "Qwen__Qwen3.5-397B-A17B.json").read_text())
        pairs.append(
            (
                "Qwen3.5-397B-A17B-class NVFP4 (512 experts) + DFlash",
                config,
                ROUTED_EXPERTS_NVFP4,
                (4096, 60, [1, 9, 17, 25, 33, 41, 49, 57], 12288),
            )
        )
    subprocess.run([python, "-m", "specpair", "--help"], env=environment(), capture_output=True, check=True)  # .pyc
    bare = median_seconds([python, "-c", "pass"], args.runs)
    torch = median_seconds([python, "-c", "import torch"], args.runs)
    print(f"median of {args.runs} fresh processes ({python}):")
    print(f"  python -c pass            {bare:6.3f} s")
    print(f"  python -c 'import torch'  {torch:6.3f} s   (baseline: a checker that imports a framework)")
    per_tensor = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (name, config, quant, (hidden, layers, taps, ffn)) in enumerate(pairs):
            target, draft = Path(tmp) / f"target-{k}", Path(tmp) / f"draft-{k}"
            count = write_target(target, config, quant)
            write_draft(draft, hidden, layers, taps, ffn)
            floor = parse_floor(target, draft, args.runs)
            check = [python, "-m", "specpair", "check", str(target), str(draft), "--json"]
            envs, before = [environment()], None
            if args.before:
                old_env = environment(PYTHONPATH=str(args.before))
                done = subprocess.run(check, capture_output=True, env=old_env)  # also writes its .pyc files
                if done.returncode in (0, 1):
                    envs.append(old_env)
                else:
                    before = done.stderr.decode().strip().splitlines()[-1]
            cold, *cold_before = interleaved_medians(check, args.runs, envs, fresh_cache=True)
            before = cold_before[0] if cold_before else before
            with tempfile.TemporaryDirectory() as cache:
                env = environment(HF_HUB_CACHE=cache)
                median_seconds(check, 1, env)  # fills the cache
                cached = median_seconds(check, args.runs, env)
                tables = median_seconds(check[:-1], args.runs, env)
            per_tensor.append((count, cold))
            print(f"{name}: {count} tensors, {sizes(target)}")
            if isinstance(before, float):
                print(
                    f"  the --before checkout, check --json  {before:6.3f} s   (this one: {before / cold:.1f}x faster cold, "
                    f"{before / cached:.1f}x cached)"
                )
            elif before is not None:
                print(f"  the --before checkout refuses it: {before}")
            print(f"  parse floor (orjson.loads of configs, headers, tokenizer)  {floor:6.3f} s")
            print(
                f"  specpair check --json, cold    {cold:6.3f} s   = {cold / floor:.2f}x the parse floor, "
                f"{cold / torch:.2f}x the torch import, {cold / 0.5:.2f}x the 0.5 s goal"
            )
            print(
                f"  specpair check --json, cached  {cached:6.3f} s   = {cached / torch:.2f}x the torch import, "
                f"{cached / 0.3:.2f}x the 0.3 s goal"
            )
            print(f"  specpair check (tables), cached {tables:5.3f} s")
    if len(per_tensor) == 2:
        (n1, t1), (n2, t2) = per_tensor
        print(
            f"scaling: {n2 / n1:.2f}x the tensors, {(t2 - bare) / (t1 - bare):.2f}x the cold time past interpreter start"
        )


if __name__ == "__main__":
    main()
