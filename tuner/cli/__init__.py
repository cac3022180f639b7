"""The `tuner` command line: parse, call, format. Errors are one line; --debug shows tracebacks."""

from __future__ import annotations

import logging
import signal
import sys
import threading

import click

from tuner import __version__
from tuner.errors import TunerError, environment_error, missing_extra

FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
                             show_default=True, help="Output format.")


def _withhold_store_password(ctx, param, value):
    """The store URL's password never reaches a trial's environment (tuner.environment)."""
    from tuner.environment import withhold_url
    withhold_url(value)
    return value


def read_store(db, required: bool = True):
    """The store of a command that only reads: never created, opened read-only (a read-only SQLite file
    or directory reads as any other), its location on stderr. Without one: NoStore (naming the path
    looked at and how to choose another), or None when not `required`."""
    from tuner.errors import NoStore
    from tuner.store import open_store
    try:
        store = open_store(db, create=False, read_only=True)
    except NoStore as exc:
        if required:
            raise
        click.echo(f"note: {exc}", err=True)
        return None
    click.echo(f"store: {store.url}", err=True)
    return store


class _EchoHandler(logging.Handler):
    """The "tuner" logger's records on the stderr of the moment (click.echo: also under CliRunner):
    INFO as they are, warnings and errors with their level first."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            prefix = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
            click.echo(prefix + msg, err=True)
        except Exception:            # an output error never kills a search
            self.handleError(record)


def log_to_stderr(debug: bool) -> None:
    """Show tuner's log (INFO and above; DEBUG with --debug: every trial's start and end) on stderr."""
    logger = logging.getLogger("tuner")
    if not any(isinstance(h, _EchoHandler) for h in logger.handlers):
        logger.addHandler(_EchoHandler())
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    logger.propagate = False


DB_OPTION = click.option("--db", envvar="TUNER_DB", default=None, callback=_withhold_store_password,
                         help="Results store URL (default sqlite:///results/tuner.db; env TUNER_DB).")


#: How the top-level description names a layout dimension; one not listed reads as its option (--flag).
DIMENSION_LABELS = {"tp": "TP", "sequence_parallel": "SP", "context_parallel": "CP", "pp": "PP",
                    "virtual_pipeline": "VP", "dp": "DP", "zero_stage": "ZeRO", "expert_parallel": "EP",
                    "expert_tensor_parallel": "ETP"}


def description() -> str:
    """`tuner --help`'s first line, from today's dimensions, precisions and frameworks."""
    from tuner.frameworks import NAMES
    from tuner.layout import DIMENSIONS
    from tuner.specs import PRECISIONS
    dims = ", ".join(DIMENSION_LABELS.get(d.name, d.flag[2:]) for d in DIMENSIONS)
    return (f"Find the fastest parallel layout ({dims}) and precision ({' or '.join(PRECISIONS)}) for training "
            f"an LLM with one training framework ({', '.join(NAMES)}).")


class _Group(click.Group):
    """The command group; a reader that goes away (`tuner plan ... | head -2`) ends the command with exit 0 as
    main() says, where click's own handler of a closed pipe (core.py, errno EPIPE) would exit 1 without a word."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _quiet_stdout()
            raise click.exceptions.Exit(0) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             help=description())
@click.version_option(__version__, prog_name="tuner")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def cli(ctx, debug):
    ctx.obj = {"debug": debug}
    log_to_stderr(debug)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not fail again."""
    import os
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


class Terminated(KeyboardInterrupt):
    """SIGTERM (Slurm's time limit, `kill`) or SIGHUP (a closed terminal): handled as Ctrl-C is, so a running
    study marks its trials interrupted, stops their processes and stays resumable."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum, _frame):
    raise Terminated(signum)


def catch_termination() -> None:
    """SIGTERM and SIGHUP end the command as Ctrl-C does (the main thread only: where handlers may be set)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _raise_terminated)


def _command_of(argv: list[str]) -> tuple[click.Command, list[str], str]:
    """(the command `argv` names, the arguments after its name, its path: `tuner db current`)."""
    cmd, path, i = cli, "tuner", 0
    while isinstance(cmd, click.Group) and i < len(argv):
        if argv[i].startswith("-"):
            i += 1
            continue
        sub = cmd.commands.get(argv[i])
        if sub is None:
            break
        cmd, path, i = sub, f"{path} {argv[i]}", i + 1
    return cmd, argv[i:], path


def repeated_option(argv: list[str]) -> str | None:
    """Why `argv` gives one option two different values (`--nodes 16 --nodes 32`: click would keep the last
    silently), or None. Options that take many (multiple=True) may repeat."""
    cmd, args, path = _command_of(argv)
    if cmd is cli:
        return None
    params = {o: p for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
    given: dict[str, list[tuple[str, str]]] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            break
        key, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        p = params.get(key)
        i += 1
        if p is None:
            continue
        if p.is_flag or p.count:
            value = str(key in p.opts)          # --sp / --no-sp: on or off
        elif not eq:
            value, i = (args[i] if i < len(args) else ""), i + 1
        if not (p.multiple or p.count):
            given.setdefault(p.name, []).append((key, value))
    for uses in given.values():
        if len({v for _, v in uses}) > 1:
            shown = ", ".join(f"{k} {v}" if v not in ("True", "False") else k for k, v in uses)
            return f"{shown}: one value expected, {len(uses)} given; give {uses[0][0]} once (see `{path} --help`)"
    return None


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    catch_termination()
    if not argv:                      # bare `tuner`: the help, once, and no error
        click.echo(cli.get_help(click.Context(cli, info_name="tuner")))
        sys.exit(0)
    debug = "--debug" in argv
    repeated = repeated_option(list(argv))
    if repeated:
        click.echo(f"error: {repeated}", err=True)
        sys.exit(2)
    try:
        cli.main(args=argv, prog_name="tuner", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:   # bad option, missing value: one line naming the help to read
        where = exc.ctx.command_path if exc.ctx else "tuner"
        click.echo(f"error: {exc.format_message()} (see `{where} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except Terminated as exc:
        click.echo(f"terminated by {exc}", err=True)
        sys.exit(128 + exc.signum)
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:   # the reader went away (`tuner trials X | head`): the work itself is done
        _quiet_stdout()
        sys.exit(0)
    except TunerError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # a bug: one line unless --debug
        # not a bug: an optional dependency is not installed (name the extra), or the user's file system
        # refused a path (permission denied, read-only, disk full, not a directory: name the path, the fix)
        known = missing_extra(exc) or environment_error(exc)
        if known is not None and not debug:
            click.echo(f"error: {known}", err=True)
            sys.exit(known.exit_code)
        if debug:
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True)
        sys.exit(1)


from tuner.cli import plan, query, study  # noqa: E402,F401  (registers the commands)
from tuner.cli import report  # noqa: E402,F401  (report, export, launch)
from tuner.cli import calibrate  # noqa: E402,F401
from tuner.cli import scale  # noqa: E402,F401  (tuner scale)
