"""app/profile.py: the acceptance profile in ModelOpt's speculation_profile.json schema 1.0, on rounds whose
figures are worked out by hand (examples/specdec_bench/specdec_bench/speculation_profile.py is the reference)."""

from __future__ import annotations

import json

import pytest

from specpair.app.profile import speculation_profile, write_profile
from specpair.errors import BadInput


def profile(requests, drafts=3, kind="dflash"):
    return speculation_profile(
        requests, drafts, kind=kind, draft={"ref": "d"}, target={"ref": "t"}, block_size=drafts + 1, conditions={}
    )


def test_marginal_conditional_histogram_and_means_of_known_rounds():
    # rounds keeping 0, 2, 3 drafts (request a) and 1 (request b): acceptance lengths 1, 3, 4 and 2
    p = profile([("chat", [0, 2, 3]), ("code", [1])])
    assert p["schema_version"] == "1.0" and p["measured"] and p["verification_method"] == "longest_prefix"
    assert p["marginal_accept_rates"] == [0.75, 0.5, 0.25]  # P(the first i drafts all kept)
    assert p["conditional_accept_rates"] == [0.75, 0.666667, 0.5]  # P(draft i kept | the ones before it)
    assert p["acceptance_length_histogram"] == {"1": 1, "2": 1, "3": 1, "4": 1}
    assert p["mean_accept_length"] == 2.5 and p["accept_length_by_k"] == {"3": 2.5}
    assert p["mean_accept_length_per_request"] == round((1 + 5 / 3 + 2) / 2, 6)  # each request's mean, averaged
    assert p["per_category"] == {
        "chat": {"mean_accept_length": round(1 + 5 / 3, 6), "requests": 1, "rounds": 3},
        "code": {"mean_accept_length": 2.0, "requests": 1, "rounds": 1},
    }
    check = p["validation"]["mean_consistency"]
    assert check == {
        "implied_mean_accept_length": 2.5,
        "reported_mean_accept_length": 2.5,
        "abs_delta": 0.0,
        "tolerance": 0.02,
        "passed": True,
    }
    assert p["validation"]["marginal_monotonicity"] == {"passed": True, "violations": []}
    assert p["measurement_conditions"] == {"rounds": 4, "requests": 2}
    assert p["accept_length_model"] == "measured_per_k" and profile([], kind="eagle3")["accept_length_model"] == (
        "chain_analytic"
    )


def test_no_rounds_is_not_measured():
    p = profile([("chat", [])])
    assert (
        not p["measured"] and p["marginal_accept_rates"] == [0.0, 0.0, 0.0] and p["acceptance_length_histogram"] == {}
    )


def test_written_whole_or_refused_in_one_line(tmp_path):
    path = tmp_path / "profile.json"
    write_profile(str(path), profile([("chat", [1])]))
    assert json.loads(path.read_text())["mean_accept_length"] == 2.0 and list(tmp_path.iterdir()) == [path]
    with pytest.raises(BadInput, match="cannot be written"):
        write_profile(str(tmp_path / "missing" / "profile.json"), profile([("chat", [1])]))
