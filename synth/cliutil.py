"""Running a Typer app so that user mistakes end as one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import sys

import typer

from synth.errors import UserError

# The usage-error base class (bad option, missing argument). Typer ≥ 0.25 vendors click privately, so
# find it through the public BadParameter instead of importing click.
_USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def new_app(help: str) -> typer.Typer:
    """A Typer app that is always a command group (`prog COMMAND ...`), even with one command."""
    app = typer.Typer(help=help, add_completion=False, no_args_is_help=True,
                      pretty_exceptions_enable=False, rich_markup_mode=None)
    app.callback()(lambda: None)
    return app


def run(app: typer.Typer, prog: str, argv: list[str] | None = None) -> int:
    try:
        rv = app(args=argv, prog_name=prog, standalone_mode=False)
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except _USAGE_ERROR as e:
        if type(e).__name__.startswith("NoArgsIsHelp") and getattr(e, "ctx", None) is not None:
            print(e.ctx.get_help(), file=sys.stderr)
            return 2
        msg = e.format_message().splitlines()[0] if e.format_message() else type(e).__name__
        print(f"{prog}: error: {msg} (see `{prog} --help`)", file=sys.stderr)
        return 2
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        return 130
    return rv if isinstance(rv, int) else 0
