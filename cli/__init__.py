"""The `specpair` command line: one typer command per file, shared options in `_options`."""

from __future__ import annotations

from typing import Annotated

import typer

from specpair import __version__

app = typer.Typer(
    name="specpair",
    help="Pair a target LLM with a speculative-decoding drafter: check, download, convert, run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        print(f"specpair {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """Pair a target LLM with a speculative-decoding drafter: check, download, convert, run."""


from specpair.cli import catalog, check, convert, download, inspect, verify  # noqa: E402,F401  (each module registers its command on `app`)


def main() -> None:
    from specpair.cli._output import fail
    from specpair.errors import BadInput

    try:
        app()
    except BadInput as e:
        fail(str(e))
