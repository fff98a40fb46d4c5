"""The `specpair` command line: one command per file, each registered here (no command module imports this
package), shared options declared once in `_options`, one `_output.Output` per command for what it prints. The
commands parse, call the application layer (specpair.app) and print."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from specpair import __version__

HELP = "Pair a target LLM with a speculative-decoding drafter."

app = typer.Typer(
    name="specpair",
    help=HELP,
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
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Pair a target LLM with a speculative-decoding drafter."""


from specpair.cli import bench, catalog, check, convert, download, inspect, run, verify  # noqa: E402

for module, command in (
    (bench, bench.bench),
    (catalog, catalog.catalog),
    (check, check.check),
    (convert, convert.convert),
    (download, download.download),
    (inspect, inspect.inspect),
    (run, run.run),
    (verify, verify.verify),
):
    app.command(epilog=module.EXAMPLES)(command)


def main() -> None:
    """Run one command. Its errors are one line on stderr, or one JSON document on stdout under --json, with
    the exit code they name; a reader that closes stdout early does not change the exit code."""
    from typer import Abort
    from typer._click.exceptions import ClickException  # typer 0.28 vendors click and raises its own classes
    from typer.main import get_command_name

    from specpair.cli._output import ClosedPipeSafe, report_error
    from specpair.errors import BadInput, Incomplete, Interrupted

    args = sys.argv[1:]
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    command = next((a for a in args if not a.startswith("-")), None)
    original = sys.stdout
    if int(os.environ.get("RANK", "0")) > 0:  # a tensor-parallel rank but the first (torchrun): only rank 0 prints
        original = open(os.devnull, "w")  # this process's stdout until it exits
    stdout = sys.stdout = ClosedPipeSafe(original)
    every = app.registered_commands
    invoked = [c for c in every if (c.name or get_command_name(c.callback.__name__)) == command]
    if invoked:  # typer builds the options of every command it holds before running one: ~20 ms a run
        app.registered_commands = invoked
    try:
        code = app(standalone_mode=False)
    except (BadInput, Incomplete) as e:
        code = report_error(e.where, e.problem, e.exit_code, command, as_json)
    except ClickException as e:  # usage errors: a missing argument, an unknown option
        if as_json:
            code = report_error(None, e.format_message(), e.exit_code, command, as_json=True)
        else:
            e.show()
            code = e.exit_code
    except Abort:  # end of input where a command read some
        code = 130
    except Interrupted as e:  # the work cleaned up after itself; worker threads still running are not waited for
        report_error(None, f"interrupted by {e}: nothing was left behind", e.exit_code, command, as_json)
        stdout.flush()
        sys.stderr.flush()
        os._exit(e.exit_code)
    else:
        if code == 130:  # typer's answer to Ctrl-C (KeyboardInterrupt): nothing else exits 130 this way
            report_error(None, "interrupted by SIGINT (Ctrl-C)", code, command, as_json)
    finally:
        app.registered_commands = every
        stdout.flush()
        sys.stdout = original
    raise SystemExit(code if isinstance(code, int) else 0)
