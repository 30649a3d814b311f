"""From command-line arguments to a rendezvous handler, with errors as exit codes."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from tp_rdzv_api import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousParameters,
    create_handler,
)
from tp_rdzv_api.utils import parse_rendezvous_config
from tp_rdzv_dynamic import DynamicRendezvousHandler
from tp_rdzv_dynamic.factory import create_store
from tp_rdzv_dynamic.torch_compat.torch_c10d import TorchC10dRun
from tp_store import StoreError

from .errors import CommandError, ExitCode
from .options import positive_seconds

DEFAULT_BACKEND = "core"
#: Backends on a TCPStore endpoint, where a torchrun job (PyTorch's c10d) may run too.
_TORCH_STORE_BACKENDS = frozenset({DEFAULT_BACKEND, "c10d"})


def add_rendezvous_arguments(parser: argparse.ArgumentParser, run_id_required: bool = True) -> None:
    """``--backend``, ``--endpoint``, ``--run-id`` and ``--config``."""
    parser.add_argument(
        "--backend", default=DEFAULT_BACKEND, help="registered backend (default: core)"
    )
    parser.add_argument(
        "--endpoint",
        required=True,
        help="the store as HOST:PORT (etcd: comma-separated client URLs or HOST:PORTs)",
    )
    parser.add_argument("--run-id", required=run_id_required, help="the job's run id")
    parser.add_argument(
        "--config",
        default="",
        metavar="K=V,...",
        help="backend options, e.g. keep_alive_interval=1,last_call_timeout=5",
    )


@contextmanager
def rendezvous_errors() -> Iterator[None]:
    """Turn rendezvous and configuration failures into :class:`CommandError`."""
    try:
        yield
    except RendezvousConnectionError as exc:
        raise CommandError(str(exc), ExitCode.UNREACHABLE) from exc
    except (OSError, StoreError) as exc:
        # A store that could not be opened (a file store on a missing path...).
        raise CommandError(f"cannot open the store: {exc}", ExitCode.UNREACHABLE) from exc
    except RendezvousError as exc:
        raise CommandError(f"{type(exc).__name__}: {exc}", ExitCode.FAILED) from exc
    except (ValueError, TypeError, KeyError) as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc


def open_handler(
    args: argparse.Namespace,
    *,
    min_nodes: int = 1,
    max_nodes: int = 1,
    observer: bool = False,
) -> DynamicRendezvousHandler:
    """The handler ``args`` describe; an ``observer`` never hosts the store.

    Only dynamic backends (core, c10d, p10d, etcd) have rounds to join, watch
    and close from the command line.
    """
    with rendezvous_errors():
        handler = create_handler(_parameters(args, min_nodes, max_nodes, observer))
    if not isinstance(handler, DynamicRendezvousHandler):
        raise CommandError(
            f"backend {args.backend!r} has no rounds to join, watch or close from the command "
            "line; use a dynamic backend (core, c10d, p10d, etcd)",
            ExitCode.USAGE,
        )
    return handler


def _parameters(
    args: argparse.Namespace, min_nodes: int, max_nodes: int, observer: bool
) -> RendezvousParameters:
    config: dict[str, object] = dict(parse_rendezvous_config(args.config))
    if observer:
        # An observer must never start a store of its own on a free port,
        # and should fail fast when nothing answers.
        config["is_host"] = False
        config.setdefault("read_timeout", args.timeout)
    return RendezvousParameters(
        args.backend,
        args.endpoint,
        args.run_id,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        config=config,
    )


def open_torch_c10d_run(args: argparse.Namespace) -> TorchC10dRun | None:
    """With ``--backend core`` (the default) or ``c10d``: the run of PyTorch's own
    c10d rendezvous on the store.

    ``c10d`` names PyTorch's backend (a torchrun job) and our alias of
    ``core``: on a store endpoint, observers look for PyTorch's state first.
    ``None`` for other backends. The store is a client only, as for every
    observer.
    """
    if args.backend not in _TORCH_STORE_BACKENDS:
        return None
    with rendezvous_errors():
        store = create_store(_parameters(args, 1, 1, observer=True))
        return TorchC10dRun(store, args.run_id)


def add_observer_arguments(parser: argparse.ArgumentParser) -> None:
    """``--timeout``, for commands that only look at or close a rendezvous."""
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=5.0,
        help="seconds to wait for the store before giving up (default 5)",
    )
