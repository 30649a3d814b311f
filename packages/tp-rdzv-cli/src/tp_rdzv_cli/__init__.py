"""tp-rdzv-cli: the ``tp-rdzv`` command line (store, join, status, close, demo)."""

from .__about__ import __version__

__all__ = ["__version__"]
