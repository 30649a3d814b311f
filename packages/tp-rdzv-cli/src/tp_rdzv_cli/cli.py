"""``tp-rdzv``: the command line of tensorplay-rendezvous (run by :func:`.main.main`).

Each subcommand lives in a module of its own with ``add_parser`` and ``run``;
this module only builds the parser, configures logging and turns failures into
one line on stderr and an exit code (see :class:`~.errors.ExitCode`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .__about__ import __version__
from .errors import EXIT_CODES_HELP, CommandError, ExitCode
from .logs import FORMATS, configure


class OneLineParser(argparse.ArgumentParser):
    """Reports bad arguments in one line (no usage dump) and exits with 2.

    Descriptions and epilogs (the examples) are printed as written.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``tp-rdzv`` parser with every subcommand.

    The subcommands (and the libraries they use) are imported here, not when
    this module is: Ctrl-C while they load then ends ``main`` in one line.
    """
    from . import close_command, demo, join_command, status_command, store_command  # noqa: PLC0415

    common = OneLineParser(add_help=False)
    common.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log records at this level and above go to stderr (default WARNING)",
    )
    common.add_argument(
        "--log-format", default="text", choices=FORMATS, help="text, or one JSON object per line"
    )
    parser = OneLineParser(
        prog="tp-rdzv",
        description="Run a rendezvous store, join, watch and close a rendezvous, or see a demo.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    commands.required = True
    for command in (store_command, join_command, status_command, close_command, demo):
        command.add_parser(commands, parents=[common])
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Run ``tp-rdzv`` with ``argv``; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        print("tp-rdzv: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    configure(args.log_level, args.log_format)
    try:
        return int(args.run(args))
    except CommandError as exc:
        print(f"tp-rdzv {args.command}: error: {exc}", file=sys.stderr)
        return int(exc.code)
    except KeyboardInterrupt:
        print(f"tp-rdzv {args.command}: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
