"""`specpair bench` on a tiny pair on the CPU: the users and depth tables (Markdown), every drafted run compared
with its undrafted run, the weights roofline, the PNG of the depth sweep; bad input as one line and exit 2. The
--json document is validated against its schema in test_schemas.py."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from fixtures import build_draft_model, build_target
from typer.testing import CliRunner

from specpair.cli import app
from specpair.cli._plot import BOTTOM, GLYPHS, HEIGHT, LEGEND_Y, SWATCH, TITLE_Y, TOP, WIDTH, line_chart
from specpair.cli.bench import COLORS, PLOT_TITLE
from specpair.runtime.kernels.cpu_rows import native_bf16
from specpair.runtime.loading import plan_load
from specpair.sources.model import open_model


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    return build_target(root / "target", "qwen3", layers=2), build_draft_model(root / "draft")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, RGB bytes) of an 8-bit RGB PNG with unfiltered scanlines, as _plot writes it."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(data):
        size, kind = struct.unpack(">I4s", data[at : at + 8])
        body = data[at + 8 : at + 8 + size]
        assert struct.unpack(">I", data[at + 8 + size : at + 12 + size])[0] == zlib.crc32(kind + body)
        chunks[kind] = chunks.get(kind, b"") + body
        at += 12 + size
    width, height, depth, color, *_ = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, color) == (8, 2) and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    assert len(raw) == height * (1 + 3 * width)
    lines = [raw[y * (1 + 3 * width) : (y + 1) * (1 + 3 * width)] for y in range(height)]
    assert all(line[0] == 0 for line in lines)
    return width, height, b"".join(line[1:] for line in lines)


def test_markdown_tables_roofline_and_the_depth_plot(pair, tmp_path):
    target, draft = pair
    png = tmp_path / "depth.png"
    done = CliRunner().invoke(
        app,
        [
            "bench",
            str(target),
            str(draft),
            "--depth",
            "0,12",
            "--users",
            "1,2",
            "--tokens",
            "16",
            "--md",
            "--plot",
            str(png),
            "--device",
            "cpu",
            "--bandwidth",
            "50",
            "--graphs",
            "--quiet",
        ],
    )
    assert done.exit_code == 0, done.output
    out = done.stdout
    drafted = "drafted tok/s | speedup | predicted | speedup / predicted | τ | identical | roofline tok/s"
    assert f"| users | undrafted tok/s | {drafted} |" in out and f"| depth | undrafted tok/s | {drafted} |" in out
    assert "| undrafted / roofline | drafted / roofline |" in out and "baseline" not in out  # one name, both tables
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| 1 |", "| 2 |", "| 0 |", "| 12 |"))]
    assert [r[0] for r in rows] == ["| 1", "| 2", "| 0", "| 12"] and all(r[7] == "yes" for r in rows)
    assert "drafted == undrafted, token for token: 4/4 runs" in out and "CUDA graphs on" in out
    served = torch.bfloat16 if native_bf16() else torch.float32  # what bench runs in on this CPU
    plan = plan_load(open_model(str(target)), "cpu", served)
    for r in rows:  # users x bandwidth / the weights a step of that many tokens reads
        users = 2 if r[0] == "| 2" else 1
        assert r[8] == f"{users * 50e9 / plan.weights_read(users):.1f}"
    embedding = plan.resident["embed_tokens.weight"]
    assert plan.weights_read(2) == plan.resident_bytes - embedding + embedding * 2 / plan.model.config.vocab_size
    width, height, pixels = png_pixels(png.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    assert bytes(COLORS["roofline"]) in colors(pixels)  # drawn last, so on top wherever the lines cross
    legend = colors(band(pixels, width, LEGEND_Y, LEGEND_Y + SWATCH))
    assert {bytes(COLORS[name]) for name in ("undrafted", "drafted", "roofline")} <= legend
    assert "blue undrafted, orange drafted, grey roofline" in out


def band(pixels: bytes, width: int, top: int, bottom: int) -> bytes:
    """Rows [top, bottom) of an RGB image `width` pixels wide."""
    return pixels[3 * width * top : 3 * width * bottom]


def colors(pixels: bytes) -> set[bytes]:
    return {pixels[i : i + 3] for i in range(0, len(pixels), 3)}


def test_the_chart_draws_each_series_and_its_tick_labels():
    series = [((31, 119, 180), [10.0, 12.0, None]), ((255, 127, 14), [300.0, 280.0, 250.0])]
    width, height, pixels = png_pixels(line_chart(["0", "4k", "32k"], series))
    assert (width, height) == (WIDTH, HEIGHT)
    assert {bytes(c) for c, _ in series} | {b"\x00\x00\x00", b"\xff\xff\xff"} <= colors(pixels)


def test_the_chart_has_a_title_axis_labels_and_a_legend():
    """Above the plot the title (centred) and a legend row (a swatch of each series' colour and its name, the y
    axis's label at its left); under the tick labels the x axis's label. Every character has a glyph."""
    words = [PLOT_TITLE, "context depth (prompt tokens)", "tok/s", "undrafted", "drafted", "roofline"]
    assert set("".join(words).lower()) <= set(GLYPHS)
    series = [((31, 119, 180), [10.0, 12.0]), ((255, 127, 14), [300.0, 280.0])]
    bare = png_pixels(line_chart(["0", "4k"], series))[2]
    width, _, drawn = png_pixels(
        line_chart(["0", "4k"], series, title=PLOT_TITLE, x_label=words[1], y_label="tok/s", names=["a", "b"])
    )
    white, black = b"\xff\xff\xff", b"\x00\x00\x00"
    assert colors(band(bare, width, 0, TOP - 8)) == {white} == colors(band(bare, width, HEIGHT - BOTTOM // 2, HEIGHT))
    assert black in colors(band(drawn, width, TITLE_Y, TITLE_Y + 10))
    assert {bytes(c) for c, _ in series} | {black} <= colors(band(drawn, width, LEGEND_Y, LEGEND_Y + SWATCH))
    assert black in colors(band(drawn, width, HEIGHT - BOTTOM // 2, HEIGHT))  # the x axis's label


def test_without_a_drafter_only_the_undrafted_columns(pair):
    target, _ = pair
    done = CliRunner().invoke(
        app,
        ["bench", str(target), "--depth", "0", "--users", "1", "--tokens", "2", "--md", "--device", "cpu", "--quiet"],
    )
    assert done.exit_code == 0, done.output
    assert "| users | undrafted tok/s | roofline tok/s | undrafted / roofline |" in done.stdout
    assert "no draft" in done.stdout and "| 1 |" in done.stdout and "| — | — |" in done.stdout  # bandwidth unknown


@pytest.mark.parametrize(
    "args,message",
    [
        (["--depth", "0,1x,4k"], "error: --depth: '1x' is not a count"),
        (["--users", "1,0"], "error: --users: 0 is below 1"),
        (["--md", "--plot", "/nonexistent/depth.png"], "error: /nonexistent/depth.png: its directory does not exist"),
        (["--at-tau", "2"], "error: --at-tau: prices a drafter's round: give DRAFT or --mtp"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(pair, args, message):
    target, _ = pair
    done = subprocess.run(
        [sys.executable, "-m", "specpair", "bench", str(target), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


def test_at_tau_prices_each_rows_steps_at_that_tau(pair):
    """--at-tau T: each drafted row's sequences x T / (its draft round + verify step), the speedup T gives over its
    decode step, both from the steps the row timed alone; a column of the tables; a τ the block cannot hold refused."""
    from specpair.cli.bench import tables

    target, draft = pair
    common = ["bench", str(target), str(draft), "--depth", "0", "--users", "2", "--tokens", "16", "--device", "cpu"]
    done = CliRunner().invoke(app, [*common, "--at-tau", "2.5", "--json", "--quiet"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["at_tau"] == 2.5
    for row, sequences in ((doc["users"][0], 2), (doc["depth"][0], 1)):
        d = row["drafted"]
        steps = d["step_seconds"]
        assert d["at_tau"]["tau"] == 2.5
        assert d["at_tau"]["tokens_per_s"] == pytest.approx(sequences * 2.5 / (steps["draft"] + steps["verify"]))
        assert d["at_tau"]["speedup"] == pytest.approx(2.5 * steps["decode"] / (steps["draft"] + steps["verify"]))
    (_, header, rows), _ = tables(doc)
    priced = doc["users"][0]["drafted"]["at_tau"]
    assert header[header.index("identical") + 1] == "tok/s at τ 2.5"
    assert rows[0][header.index("tok/s at τ 2.5")] == f"{priced['tokens_per_s']:.1f} ({priced['speedup']:.2f}×)"
    block = doc["draft"]["block_size"]
    refused = subprocess.run(
        [sys.executable, "-m", "specpair", *common, "--at-tau", str(block + 1), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith(f"error: --at-tau: {block + 1} is not a τ of block {block}"), refused.stderr
    early = subprocess.run(  # with --block-size, before anything loads
        [sys.executable, "-m", "specpair", *common, "--block-size", "2", "--at-tau", "3"],
        capture_output=True,
        text=True,
    )
    assert (
        early.returncode == 2
        and early.stderr == "error: --at-tau: 3 is not a τ of block 2: a round keeps 1 to 2 tokens\n"
    )


def test_bad_input_under_json_is_one_error_document(pair):
    target, _ = pair
    done = subprocess.run(
        [sys.executable, "-m", "specpair", "bench", str(target), "--json", "--md"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr == ""
    assert json.loads(done.stdout)["error"] == {"file": "--md", "problem": "give at most one of --json and --md"}


def test_the_users_prompts_their_profile_and_too_few_tokens(pair, tmp_path):
    """--prompts runs every prompt of the file, N at a time, through the chat template; --profile writes the users
    rows' acceptance (ModelOpt's schema 1.0); a drafted row on fewer than 16 tokens is inconclusive, exit 3."""
    from specpair.app.prompts import encode_prompt

    target, draft = pair
    prompts = tmp_path / "prompts.txt"
    texts = ["Hello there", "Write a loop", "What is 2 + 2?"]
    prompts.write_text("\n".join(texts) + "\n", encoding="utf-8")
    profile = tmp_path / "profile.json"
    args = ["bench", str(target), str(draft), "--depth", "0", "--users", "2", "--device", "cpu", "--json"]
    done = CliRunner().invoke(app, [*args, "--tokens", "16", "--prompts", str(prompts), "--profile", str(profile)])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    tokenizer = open_model(str(target)).tokenizer()
    (users,) = report["users"]
    assert report["chat"] and report["prompts"] == ["line 1", "line 2", "line 3"]
    assert users["users"] == 2 and users["prompt_tokens"] == sum(len(encode_prompt(tokenizer, t, True)) for t in texts)
    assert users["drafted"]["identical"] and users["drafted"]["compared_tokens"] == 3 * 16
    written = json.loads(profile.read_text())
    assert written["schema_version"] == "1.0" and written["method"] == "draft_model"
    assert written["mean_accept_length"] == round(users["drafted"]["tau"], 6)
    assert written["marginal_accept_rates"] == [round(a, 6) for a in users["drafted"]["acceptance_by_position"]]
    assert written["validation"]["mean_consistency"]["passed"] and set(written["per_category"]) == set(
        report["prompts"]
    )
    assert written["measurement_conditions"]["settings"] == [
        {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "batch": 2}
    ]
    short = CliRunner().invoke(app, [*args, "--tokens", "8"])
    assert short.exit_code == 3, short.output
    report = json.loads(short.stdout)
    assert report["identical"] is None  # the built-in 4 prompts, 2 at a time: 4 x 8 tokens; depth 0: one of 8
    assert report["inconclusive"] == ["depth 0: 8 generated tokens compared, fewer than 16 (--tokens 8)"]
    assert report["users"][0]["drafted"]["identical"] is True and report["depth"][0]["drafted"]["identical"] is None
    human = CliRunner().invoke(app, [*args[:-1], "--tokens", "8", "--md"])
    assert human.exit_code == 3 and "INCONCLUSIVE depth 0: 8 generated tokens compared" in human.stdout
    assert "drafted == undrafted, token for token: 1/2 runs" in human.stdout and "| inconclusive |" in human.stdout


def test_the_roofline_counts_the_expert_share_the_tokens_touch(tmp_path):
    """A MoE's routed experts are read in the share T tokens touch, expected under uniform routing (k of E each:
    1 - (1 - k/E)^T); every other weight whole, the embedding a row a token."""
    target = build_target(tmp_path / "moe", "qwen3_moe", layers=2, experts=8, experts_per_token=2)
    plan = plan_load(open_model(str(target)), "cpu", torch.float32)
    config = plan.model.config
    assert [config.experts_touched(t) for t in (1, 2)] == [2 / 8, 1 - (6 / 8) ** 2]
    experts = sum(b for n, b in plan.resident.items() if ".mlp.experts." in n)
    embedding = plan.resident["embed_tokens.weight"]
    assert experts > 0
    for tokens in (1, 3, 100):
        whole = plan.resident_bytes - experts - embedding
        want = whole + experts * config.experts_touched(tokens) + embedding * tokens / config.vocab_size
        assert plan.weights_read(tokens) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="no routed experts"):
        plan_load(open_model(str(build_target(tmp_path / "dense"))), "cpu").model.config.experts_touched(1)
