"""Endpoint and config parsing (re-exported from ``tp_rdzv_api.utils``)."""

from tp_rdzv_api.utils import parse_rendezvous_config, parse_rendezvous_endpoint

__all__ = ["parse_rendezvous_config", "parse_rendezvous_endpoint"]
