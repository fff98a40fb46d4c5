"""Tensor groups: which part of a model a tensor belongs to, from its name (HF, MLX or GGUF).

First match wins; the order puts the narrow patterns (vision, MTP, norms) before the broad ones. The MTP group is
the head drafter kind's (checkpoint/families.py `head_group`).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import itemgetter, not_

from specpair.checkpoint import TensorGroup
from specpair.checkpoint.families import HEAD_KIND
from specpair.formats import TensorInfo, TensorTable
from specpair.formats.layouts import LAST_COMPONENTS, classify_table, module_layout, modules_of, plain_layout

GROUP_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (group, re.compile(pattern))
    for group, pattern in [
        ("vision", r"(^|\.)(visual|vision_tower|vision_model|multi_modal_projector|mm_projector)\."),
        (HEAD_KIND.head_group, r"(^|\.)mtp\.|\.nextn\."),  # the target's own drafter head
        ("embedding", r"embed_tokens|^token_embd\.|(^|\.)wte\."),
        ("lm_head", r"(^|\.)lm_head\.|^output\."),
        ("selector", r"candidate_selector|selector"),
        ("drafter_io", r"^(encoder\.)?fc\.|hidden_norm|output_norm_enc|^enc\.|^dflash[._]|^d2t$|^t2d$|mask_embedding"),
        ("conv", r"_conv\.|_conv_(base|proj)"),
        ("norm", r"norm"),
        ("router", r"mlp\.gate\.|shared_expert_gate|ffn_gate_inp"),
        ("shared_expert", r"shared_expert|_shexp"),
        ("experts", r"experts|_exps|switch_mlp"),
        ("linear_attention", r"linear_attn|ssm_|attn_qkv|attn_gate"),
        ("attention", r"self_attn|attn_"),
        ("mlp", r"mlp|ffn_"),
        ("other", r""),
    ]
]


NUMBER_COMPONENT = re.compile(r"(?<=\.)\d+(?=\.|$)")  # layer and expert indices: "layers.12." -> "layers.0."


def group_of(name: str) -> str:
    # Names differ mostly in layer and expert numbers: classify each numbering-free shape once.
    return _group_of_shape(NUMBER_COMPONENT.sub("0", name))


@functools.lru_cache(maxsize=4096)
def _group_of_shape(name: str) -> str:
    for group, pattern in GROUP_PATTERNS:
        if pattern.search(name):
            return group
    return "other"


def summarize(tensors: list[TensorInfo], layouts: dict[str, str], group_for=group_of) -> list[TensorGroup]:
    """Count tensors and bytes per (group, layout), in a stable order."""
    table = TensorTable.of(tensors)
    return summarize_table(table, [layouts[n] for n in table.names], group_for)


def summarize_table(
    table: TensorTable,
    layouts: list[str],
    group_for=group_of,
    modules: tuple[list[str], list[str], dict[str, list[int]]] | None = None,
) -> list[TensorGroup]:
    """`summarize` over columns. With `modules` (formats.layouts.modules_of), a module's tensors share its group:
    no name pattern tells a weight from its scales, so one look per module does."""
    names = table.names
    if modules is None:
        groups = list(map(group_for, names))
    else:
        module_of, _, rows_of = modules
        group_of_module = {module: group_for(names[rows[0]]) for module, rows in rows_of.items()}
        groups = list(map(group_of_module.__getitem__, module_of))
    totals: dict[tuple[str, str], list[int]] = {}
    for key, nbytes in zip(zip(groups, layouts), table.nbytes):
        entry = totals.get(key)
        if entry is None:
            totals[key] = [1, nbytes]
        else:
            entry[0] += 1
            entry[1] += nbytes
    return [TensorGroup(g, layout, n, b) for (g, layout), (n, b) in sorted(totals.items())]


DIGITS = bytes.maketrans(b"0123456789", b"##########")
DIGIT_PATTERNS = ("d#t", "t#d")  # the only group patterns with a digit in them: those kinds go module by module
SEPARATOR = "\x00"


@dataclass
class NameKinds:
    """A table's rows as summaries need them, from a few C-level passes over its columns: each row's module, the
    last component that makes it a part of that module ("" for a name that is its own module) and its kind (the
    module with digits as '#'), and how many rows share each signature (kind, part, dtype, last dimension,
    bytes). A 35B MoE export that stores every expert apart has ~94,000 rows and a few hundred signatures."""

    modules: list[str]
    tails: list[str]
    kinds: list[str]
    signatures: Counter

    @classmethod
    def of(cls, table: TensorTable) -> NameKinds:
        modules, tails = _modules(table.names)
        kinds = _kinds(modules)
        shapes = table.shapes
        lasts = list(map(itemgetter(-1), shapes)) if [] not in shapes else [s[-1] if s else None for s in shapes]
        return cls(modules, tails, kinds, Counter(zip(kinds, tails, table.dtypes, lasts, table.nbytes)))

    def rows_of(self, kinds: set[str], tail: str) -> list[int]:
        """Rows of these kinds with this part, in order."""
        tails = self.tails
        return [k for k in compress(range(len(tails)), map(kinds.__contains__, self.kinds)) if tails[k] == tail]

    def prefixed(self, prefix: str) -> tuple[int, int]:
        """(rows, bytes) of the names that begin with `prefix` (which has no digit), from the signatures alone."""
        rows = size = 0
        for (kind, tail, _, _, nbytes), count in self.signatures.items():
            if (f"{kind}.{tail}" if tail else kind).startswith(prefix):
                rows += count
                size += count * nbytes
        return rows, size


def summarize_hf(table: TensorTable, mlx: dict | None = None, names: NameKinds | None = None) -> list[TensorGroup]:
    """Groups of safetensors tensors with their layouts (formats.layouts), in a few passes over the columns.

    Modules whose names differ only in digits (layer and expert numbers) form a kind. When every module of a
    kind has one tensor per suffix with the same dtype and last dimension, the kind's layout and group are
    worked out once: a 35B MoE export that stores every expert apart has ~32,000 modules and ~200 kinds. Other
    kinds, and MLX configs with per-module bits, are summarised module by module (`classify_table`)."""
    mlx = mlx if isinstance(mlx, dict) else {}
    if any(isinstance(value, dict) for value in mlx.values()):
        modules = modules_of(table.names)
        return summarize_table(table, classify_table(table, mlx, modules), modules=modules)
    names = names or NameKinds.of(table)
    kinds, count = names.kinds, names.signatures
    first = dict(zip(reversed(kinds), range(len(kinds) - 1, -1, -1)))  # the first row of each kind
    modules_per_kind = Counter(dict(zip(names.modules, kinds)).values())
    by_kind: dict[str, list[tuple]] = {}
    for signature in count:
        by_kind.setdefault(signature[0], []).append(signature)
    affine = (_int(mlx.get("bits")), _int(mlx.get("group_size")))
    totals: dict[tuple[str, str], list[int]] = {}

    def add(group: str, layout: str, tensors: int, size: int) -> None:
        entry = totals.setdefault((group, layout), [0, 0])
        entry[0] += tensors
        entry[1] += size

    rest = set()
    for kind, sigs in by_kind.items():
        parts: dict[str, tuple[str, int | None]] = {}
        per_suffix: Counter = Counter()
        for signature in sigs:
            _, tail, dtype, last, _ = signature
            suffix = "." + tail if tail else ""
            per_suffix[suffix] += count[signature]
            if parts.setdefault(suffix, (dtype, last)) != (dtype, last):
                break
        else:
            if not any(d in kind for d in DIGIT_PATTERNS) and set(per_suffix.values()) == {modules_per_kind[kind]}:
                label = module_layout(parts, *affine)
                group = group_of(table.names[first[kind]])
                for signature in sigs:
                    add(group, label or plain_layout(signature[2]), count[signature], count[signature] * signature[4])
                continue
        rest.add(kind)
    if rest:
        rows = list(compress(range(len(kinds)), map(rest.__contains__, kinds)))
        subset = TensorTable(*([column[k] for k in rows] for column in table.columns()))
        for g in summarize_table(subset, classify_table(subset, mlx), modules=modules_of(subset.names)):
            add(g.group, g.layout, g.tensors, g.bytes)
    return [TensorGroup(g, layout, n, b) for (g, layout), (n, b) in sorted(totals.items())]


def _modules(names: list[str]) -> tuple[list[str], list[str]]:
    """Each name's module and the last component that makes it a part of that module ("" for a name that is its
    own module): `split_module` over the column, in C-level passes and a loop over the names that are no part."""
    split = list(map(str.rpartition, names, repeat(".")))
    modules, tails = list(map(itemgetter(0), split)), list(map(itemgetter(2), split))
    whole = compress(range(len(names)), map(not_, map(LAST_COMPONENTS.__contains__, tails)))
    if "" in modules:  # a name without a dot is its own module, whatever it is called
        whole = chain(whole, (k for k in compress(range(len(names)), map(not_, modules)) if not split[k][1]))
    for k in whole:
        modules[k], tails[k] = names[k], ""
    return modules, tails


def _kinds(modules: list[str]) -> list[str]:
    """Each module name with its digits as '#', in one bytes.translate over all of them (str.translate goes
    character by character through a dict)."""
    joined = SEPARATOR.join(modules)
    kinds = joined.encode("utf-8", "surrogatepass").translate(DIGITS).decode("utf-8", "surrogatepass").split(SEPARATOR)
    if len(kinds) != len(modules):  # a name holding the separator itself
        return [m.encode("utf-8", "surrogatepass").translate(DIGITS).decode("utf-8", "surrogatepass") for m in modules]
    return kinds


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
