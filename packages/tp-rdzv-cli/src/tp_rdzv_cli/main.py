"""``tp-rdzv``'s entry point: Ctrl-C at any moment ends the command in one line.

Loading this module imports nothing but ``sys``. The command's modules
(argparse, logging, the store client...) load inside :func:`main`, where
Ctrl-C is caught: while they load, as later, it ends the command with one
line and exit code 130. Only an interrupt while Python loads this module
itself is Python's own.
"""

import sys

#: :attr:`.errors.ExitCode.INTERRUPTED`, not imported: loading it may be what Ctrl-C stops.
INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    """Run ``tp-rdzv`` with ``argv``; returns the exit code."""
    try:
        from .cli import run  # noqa: PLC0415 - loaded where Ctrl-C is caught
    except KeyboardInterrupt:
        print("tp-rdzv: interrupted", file=sys.stderr)
        return INTERRUPTED
    return run(argv)
