"""Exit codes of ``tp-rdzv`` and the error that carries one to ``main``."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """What a ``tp-rdzv`` exit status means (the same for every subcommand)."""

    OK = 0  #: done; for ``join``: the rendezvous closed
    FAILED = 1  #: the rendezvous failed (timeout, too few nodes, corrupt state), or a check
    USAGE = 2  #: bad arguments or configuration
    UNREACHABLE = 3  #: the store or backend cannot be reached
    INTERRUPTED = 130  #: stopped by SIGINT (Ctrl-C)


class CommandError(Exception):
    """A failure to report as one line on stderr, exiting with ``code``."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.code = code


EXIT_CODES_HELP = """exit codes:
  0    done (join: the rendezvous closed)
  1    the rendezvous failed (timeout, too few nodes, corrupt state)
  2    bad arguments or configuration
  3    the store or backend cannot be reached
  130  interrupted"""
