"""`--profile FILE.json`: the acceptance a run measured, as NVIDIA ModelOpt's `speculation_profile.json` (schema
1.0, examples/specdec_bench/specdec_bench/speculation_profile.py `build_profile`), the form peers exchange: the
marginal acceptance per draft position (P(the first i drafts all kept), vLLM's synthetic sampler reads it), the
conditional one (P(draft i kept | the i - 1 before it were), Dynamo's mocker reads it), the histogram of
acceptance lengths (tokens a round committed, the token after the drafts included), the per-step and per-request
means, the conditions measured under, and ModelOpt's two self-checks: mean acceptance length = 1 + the sum of the
marginals within 0.02, and marginals that never rise.

The rounds are the run's measured rounds (runtime/speculative.py Drafted.measured: a round cut short by
max_tokens or a stop id is left out, as specdec_bench leaves out each request's last step), so the profile's mean
acceptance length is the run's tau.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from specpair.errors import BadInput

SCHEMA_VERSION = "1.0"
TOLERANCE = 0.02  # ModelOpt's tolerance on mean acceptance length = 1 + sum of marginals
CHAIN_KINDS = frozenset({"eagle3", "draft_model"})  # ModelOpt's chain drafters: a K-draft run predicts every K' < K


def speculation_profile(
    requests: list[tuple[str, list[int]]],
    drafts: int,
    *,
    kind: str,
    draft: dict[str, Any],
    target: dict[str, Any],
    block_size: int,
    conditions: dict[str, Any],
) -> dict[str, Any]:
    """The profile of `requests` (each its category and the drafts kept in each of its measured rounds) at
    `drafts` (K) drafts a round."""
    from specpair.runtime.speculative import accepted_by_position, mean_accept_length

    rounds = [a for _, accepted in requests for a in accepted]
    marginal = accepted_by_position(rounds, drafts)
    conditional = [m / before if before > 0 else 0.0 for m, before in zip(marginal, [1.0] + marginal)]
    mean = mean_accept_length(rounds)
    measured = [accepted for _, accepted in requests if accepted]
    per_request = sum(mean_accept_length(a) for a in measured) / len(measured) if measured else 0.0
    histogram = Counter(a + 1 for a in rounds)
    categories: dict[str, list[list[int]]] = {}
    for name, accepted in requests:
        categories.setdefault(name, []).append(accepted)
    implied = 1.0 + sum(marginal)
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": bool(rounds),
        "method": kind,
        "draft_checkpoint": draft,
        "target_model": target,
        "num_speculative_tokens": drafts,
        "block_size": block_size,
        "max_supported_k": drafts,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": round(mean, 6),
        "mean_accept_length_per_request": round(per_request, 6),
        "accept_length_model": "chain_analytic" if kind in CHAIN_KINDS else "measured_per_k",
        "accept_length_by_k": {str(drafts): round(mean, 6)},
        "acceptance_length_histogram": {str(length): histogram[length] for length in sorted(histogram)},
        "per_category": {
            name: {
                "mean_accept_length": round(mean_accept_length([a for r in runs for a in r]), 6),
                "requests": len(runs),
                "rounds": sum(len(r) for r in runs),
            }
            for name, runs in categories.items()
        },
        "measurement_conditions": {**conditions, "rounds": len(rounds), "requests": len(requests)},
        "validation": {
            "mean_consistency": {
                "implied_mean_accept_length": round(implied, 6),
                "reported_mean_accept_length": round(mean, 6),
                "abs_delta": round(abs(implied - mean), 6),
                "tolerance": TOLERANCE,
                "passed": abs(implied - mean) <= TOLERANCE,
            },
            "marginal_monotonicity": monotonicity(marginal),
        },
    }


def monotonicity(marginal: list[float]) -> dict[str, Any]:
    """Marginals are a survival function: one that rises means the histogram is malformed."""
    violations = [
        {"position": i, "value": marginal[i], "previous": marginal[i - 1]}
        for i in range(1, len(marginal))
        if marginal[i] > marginal[i - 1] + 1e-9
    ]
    return {"passed": not violations, "violations": violations}


def check_writable(path: str) -> None:
    """Refused before any work: a profile whose directory does not exist."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise BadInput(path, "its directory does not exist")


def write_profile(path: str, profile: dict[str, Any]) -> None:
    """The profile as JSON, written beside `path` and renamed onto it (never half a file); by the first rank only
    of a tensor-parallel group (every rank measured the same rounds)."""
    if int(os.environ.get("RANK", "0")) > 0:
        return
    partial = path + ".specpair-partial"
    try:
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(profile, f, indent=2)
            f.write("\n")
        os.replace(partial, path)
    except OSError as e:
        if os.path.exists(partial):
            os.remove(partial)
        raise BadInput(path, f"cannot be written ({e.strerror})") from None
