"""Map exceptions to exit codes and one-paragraph messages: UserError -> 2, anything else -> 1."""

from __future__ import annotations

import traceback

import click

from trtforge.errors import TrtforgeError, UserError


def run_cli(group: click.Group, argv: list[str] | None) -> int:
    """Run `group` standalone=False and translate failures; never swallows: internal errors print a trace."""
    try:
        rv = group.main(args=argv, prog_name="trtforge", standalone_mode=False)
    except click.exceptions.Exit as e:
        return int(e.exit_code or 0)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except click.ClickException as e:
        e.show()
        return 2 if e.exit_code in (1, 2) else int(e.exit_code)
    except UserError as e:
        click.secho(f"error: {e}", fg="red", err=True)
        return 2
    except TrtforgeError as e:
        click.secho(f"error: {e}", fg="red", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except Exception:
        traceback.print_exc()
        click.secho("internal error (the trace above); please report it.", fg="red", err=True)
        return 1
    # With standalone_mode=False, click returns the code of `ctx.exit(n)` instead of raising.
    return rv if isinstance(rv, int) else 0
