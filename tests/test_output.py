"""cli/_output.Output: the one object through which a command prints its result (for people, as one JSON document
under --json, or only what a script needs under --quiet) and shows the application layer's progress on stderr."""

from __future__ import annotations

import json

import pytest

from specpair.cli._output import Output, rate_text


@pytest.mark.parametrize("json_output", [False, True])
@pytest.mark.parametrize("quiet", [False, True])
def test_one_output_object_serves_every_mode(json_output, quiet, capsys):
    out = Output(json_output, quiet)
    out.stage("loading")
    out.note("loaded")
    out.warn("a context past the drafter's window")
    with out.meter("converting", 100, detail=lambda: "1 of 2 tensors", tenths=True) as advance:
        advance(50)
        advance(50)
    with out.meter("loading", 100) as advance:  # no tenths asked: nothing off a terminal
        advance(100)
    out.result({"schema": "x"}, lambda: print("for people"), quiet=["the result"])
    stdout, stderr = capsys.readouterr()
    if json_output:
        assert json.loads(stdout) == {"schema": "x"}
    else:
        assert stdout == ("the result\n" if quiet else "for people\n")
    if quiet:  # nothing on stderr but an error, whatever --json says
        assert stderr == ""
    else:  # stderr is not a terminal here: a line per stage, and one per tenth of metered work where asked
        lines = stderr.splitlines()
        assert lines[:3] == ["loading ...", "loaded", "warning: a context past the drafter's window"]
        assert [line.split(", ")[0] for line in lines[3:]] == ["50% (1 of 2 tensors)", "100% (1 of 2 tensors)"]
        assert all(" MB/s" in line and line.endswith(" left") for line in lines[3:])


def test_a_command_may_print_its_quiet_result_itself(capsys):
    Output(quiet=True).result({}, lambda: print("for people"), quiet=lambda: print("the report"))
    assert capsys.readouterr() == ("the report\n", "")


def test_slow_work_says_how_long_each_item_takes():
    """The gate's prompts on a CPU once showed '0.0 prompts/s' at every tenth."""
    assert rate_text(1 / 90, "prompts") == "0.011 prompts/s" and rate_text(0.5, "batches") == "0.5 batches/s"
    assert rate_text(3.0, "prompts") == "3.0 prompts/s" and rate_text(2.5e6, "bytes") == "2.5 MB/s"
