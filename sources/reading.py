"""One checkpoint's files, whatever holds them, read into a `Checkpoint`.

Every source (sources/local.py, sources/hub.py, the HF cache, a lockfile's directories) exposes the same small
`RepoFiles` view (list files, read a small file, read tensor headers); `read_checkpoint` turns any of them into a
`Checkpoint` with the same code, so a local directory and the Hub repo it was downloaded from give the same
answer. Tensor data is never read.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any, Protocol

import orjson

from specpair.checkpoint import Checkpoint, FileEntry
from specpair.checkpoint import gguf as gguf_builder
from specpair.checkpoint import hf as hf_builder
from specpair.checkpoint.tokenizer import Tokenizer, from_tokenizer_json
from specpair.errors import BadInput
from specpair.formats import MAX_JSON_DEPTH, TensorInfo, TensorTable, nests_deeper_than
from specpair.formats.gguf import GGUFHeader
from specpair.sources.child import forked

MAX_CONFIG_BYTES = 32 * 1024 * 1024
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024
# Worth a forked child (~1 ms): a 9 MB tokenizer.json costs ~0.2 s to parse, 2 MB of headers (~15,000 tensors) ~0.06 s.
FORK_TOKENIZER_BYTES = 1_000_000
FORK_HEADER_BYTES = 2_000_000
# Per byte, against parsing a safetensors header: parsing a tokenizer.json costs about as much, reading back a
# table the child parsed 0.2, summarising the headers (checkpoint/hf.py) 0.55; measured on benchmarks/check_speed.py.
TABLE_BACK_COST, SUMMARY_COST = 0.2, 0.55
QUANT_FILES = ("hf_quant_config.json", "quantization_config.json")
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class RepoFiles(Protocol):
    """Read-only view of one checkpoint's files, local or remote."""

    where: str  # how errors name this checkpoint (a path, or repo@revision)

    def list(self) -> list[FileEntry]: ...

    def read(self, path: str, limit: int) -> bytes | None:
        """Whole content of a small file, None when absent; BadInput when over `limit` bytes."""

    def safetensors_headers(self, shards: list[str]) -> list[TensorInfo] | None:
        """Headers of these shards; None when they cannot be had (an offline cache without them)."""

    def safetensors_table(self, shards: list[str]) -> TensorTable | None:
        """The same as columns (TensorTable.files names each row's shard)."""

    def header_lengths(self, shards: list[str]) -> list[int] | None:
        """Each shard's header length, where the shards are local files a forked child may read (sources/child.py);
        None otherwise (remote files, headers kept in a record, a shard that cannot be read)."""

    def gguf_header(self, path: str) -> GGUFHeader: ...


def read_checkpoint(
    files: RepoFiles, ref: str, source: str, gguf_file: str | None = None, revision: str | None = None
) -> Checkpoint:
    """Build the Checkpoint of one HF-layout or GGUF checkpoint from its files."""
    with _collection_paused():
        return _read_checkpoint(files, ref, source, gguf_file, revision)


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """Parsing builds ~10^6 objects (a header's entry per tensor, a tokenizer's tokens) and none of them forms a
    cycle; the cyclic collector would walk them all again every few thousand allocations (~40% of the time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_checkpoint(
    files: RepoFiles, ref: str, source: str, gguf_file: str | None, revision: str | None
) -> Checkpoint:
    entries = files.list()
    names = {e.path for e in entries}
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    if gguf_file is not None:
        if gguf_file not in names:
            raise BadInput(files.where, f"has no file {gguf_file!r} (GGUF files: {', '.join(ggufs) or 'none'})")
        return gguf_builder.build(files.gguf_header(gguf_file), ref, source, revision)
    if "config.json" not in names:
        if len(ggufs) == 1:
            return gguf_builder.build(files.gguf_header(ggufs[0]), ref, source, revision)
        if ggufs:
            raise BadInput(
                files.where, f"holds {len(ggufs)} GGUF files; choose one with --gguf-file ({', '.join(ggufs[:6])})"
            )
        raise BadInput(files.where, "no config.json and no GGUF file")
    meta = hf_builder.HFMetadata(
        config=read_json(files, "config.json", required=True),
        config_where=f"{files.where}/config.json",
        generation_config=read_json(files, "generation_config.json"),
        quant_files={name: doc for name in QUANT_FILES if (doc := read_json(files, name)) is not None},
        files=entries,
    )
    raw_tokenizer = files.read("tokenizer.json", MAX_TOKENIZER_BYTES) if "tokenizer.json" in names else None
    tokenizer_of: Callable[[], Tokenizer | None] = lambda: None  # noqa: E731
    if raw_tokenizer is not None:
        template = files.read("chat_template.jinja", MAX_CONFIG_BYTES) if "chat_template.jinja" in names else None
        tokenizer_of = functools.partial(
            from_tokenizer_json,
            raw_tokenizer,
            f"{files.where}/tokenizer.json",
            read_json(files, "tokenizer_config.json"),
            meta.generation_config,
            template.decode("utf-8", "replace") if template is not None else None,
        )
    # Beside the first shards' headers, a child parses the later ones', then a big tokenizer.json
    # (sources/child.py): the summary needs every header, the tokenizer is wanted last. What is small is not
    # worth a process.
    try:
        shards, index = safetensors_shards(files, names)
        big_tokenizer = bool(shards) and raw_tokenizer is not None and len(raw_tokenizer) >= FORK_TOKENIZER_BYTES
        lengths = files.header_lengths(shards) if shards else None
        front, back = _child_share(shards, lengths, len(raw_tokenizer) if big_tokenizer else 0)
        with forked(
            (lambda: files.safetensors_table(back).to_bytes()) if back else None,
            (lambda: tokenizer_of().to_bytes()) if big_tokenizer else None,
        ) as (back_from_child, tokenizer_from_child):
            meta.tensors = files.safetensors_table(front) if shards else None
            if back:
                table = back_from_child()
                meta.tensors.extend(
                    TensorTable.from_bytes(table) if table is not None else files.safetensors_table(back)
                )
            if meta.tensors is not None and index is not None:
                check_index(f"{files.where}/{index[0]}", index[1], meta.tensors)
            checkpoint = hf_builder.build(meta, ref, source, revision)
            tokenizer = tokenizer_from_child()
    except BadInput:
        tokenizer_of()  # a bad tokenizer.json is named first, as when it is read first
        raise
    checkpoint.tokenizer = Tokenizer.from_bytes(tokenizer) if tokenizer is not None else tokenizer_of()
    if meta.tensors is None and any(n.endswith(".safetensors.index.json") for n in names):
        checkpoint.notes.append("no weight shards present (a metadata-only copy): tensor headers not read")
    return checkpoint


def read_json(files: RepoFiles, path: str, required: bool = False) -> dict[str, Any] | None:
    raw = files.read(path, MAX_CONFIG_BYTES)
    if raw is None:
        if required:
            raise BadInput(f"{files.where}/{path}", "missing")
        return None
    where = f"{files.where}/{path}"
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadInput(where, f"not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise BadInput(where, "not a JSON object")
    if nests_deeper_than(doc, MAX_JSON_DEPTH):
        raise BadInput(where, f"nests deeper than {MAX_JSON_DEPTH} levels")
    return doc


SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<k>\d{5})-of-(?P<n>\d{5})\.safetensors$")  # huggingface_hub's


def safetensors_shards(files: RepoFiles, names: set[str]) -> tuple[list[str], tuple[str, dict[str, str]] | None]:
    """Shard files to read headers from, and (index file, its weight map) when the index had to be read.

    The index only repeats what the shards' headers say, and a MoE export's is ~10 MB of JSON (~40 MB for 512
    experts): when the top-level shards are one complete huggingface_hub series (`stem-0000k-of-0000n`), their
    headers are the whole truth and the index is not read. A series with a shard missing is refused by name;
    other layouts (custom names, stray files beside a series) go by the index."""
    index = next((n for n in sorted(names) if n.endswith(".safetensors.index.json") and "/" not in n), None)
    shards = sorted(n for n in names if n.endswith(".safetensors") and "/" not in n)
    _refuse_case_collisions(files.where, shards)
    if index is None:
        return shards, None
    series = {(m["stem"], m["n"]) for m in map(SHARD_NAME.match, shards) if m}
    if len(series) == 1 and all(SHARD_NAME.match(n) for n in shards):
        ((stem, total),) = series
        expected = [f"{stem}-{k:05d}-of-{total}.safetensors" for k in range(1, int(total) + 1)]
        missing = [n for n in expected if n not in names]
        if not missing and len(shards) == len(expected):
            return shards, None
        if missing and len(missing) < len(expected):
            raise BadInput(
                files.where,
                f"holds {len(expected) - len(missing)} of the {len(expected)} shards of "
                f"{stem}-*-of-{total}.safetensors: {missing[0]} is missing (an interrupted download?)",
            )
    where = f"{files.where}/{index}"
    weight_map = read_json(files, index, required=True).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise BadInput(where, "weight_map is not an object of tensor -> file names")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if shard.startswith("/") or "\\" in shard or any(part in ("", ".", "..") for part in shard.split("/")):
            raise BadInput(
                where, f"names shard {shard!r}, which is not a plain relative path inside the checkpoint: refused"
            )
    missing = [shard for shard in shards if shard not in names]
    if missing and len(missing) == len(shards):
        return [], None  # a metadata-only copy (specpair download --metadata-only): judged from its config
    if missing:
        raise BadInput(where, f"names shard {missing[0]!r}, which is not in the checkpoint")
    _refuse_case_collisions(where, shards)
    return shards, (index, weight_map)


def _child_share(
    shards: list[str], header_lengths: list[int] | None, tokenizer_bytes: int
) -> tuple[list[str], list[str]]:
    """The shards this process parses and the later ones a forked child parses before a tokenizer.json of
    `tokenizer_bytes` (0: none). This process summarises every header once it has the child's, while the child
    parses the tokenizer: the child takes at most half the header bytes, less where its tokenizer would finish
    after the summary (by the costs above). All are this process's when the headers are small or not local."""
    if header_lengths is None or len(shards) < 2 or sum(header_lengths) < FORK_HEADER_BYTES:
        return shards, []
    total = sum(header_lengths)
    wanted = min(total / 2, (total * (1 + SUMMARY_COST) - tokenizer_bytes) / (2 - TABLE_BACK_COST))
    later = [0, *accumulate(reversed(header_lengths[1:]))]  # header bytes of the last 0, 1, 2, ... shards
    count = min(range(len(later)), key=lambda k: abs(later[k] - wanted))
    return (shards[:-count], shards[-count:]) if count else (shards, [])


def _refuse_case_collisions(where: str, shards: list[str]) -> None:
    """Two shards whose names differ only in case are one file on macOS and Windows file systems, so
    which one a copy of the checkpoint holds depends on where it was downloaded: refuse the checkpoint."""
    seen: dict[str, str] = {}
    for shard in shards:
        other = seen.setdefault(shard.lower(), shard)
        if other != shard:
            raise BadInput(
                where,
                f"names shards {other!r} and {shard!r}, which differ only in case: refused "
                "(they are one file on case-insensitive file systems)",
            )


def check_index(where: str, weight_map: dict[str, str], tensors: TensorTable) -> None:
    """When the index decided which files to read, each tensor it names is in the shard it names."""
    found = dict(zip(tensors.names, tensors.files))
    for name, shard in weight_map.items():
        if found.get(name) != shard:
            raise BadInput(where, f"maps {name!r} to {shard!r}, but that shard's header does not hold it")
