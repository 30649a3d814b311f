"""The Store contract (tp_store.testing.contract) on EtcdStore, on one and on three members,
its requests over gRPC and through the JSON gateway."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator

import pytest

from tp_rdzv_etcd import EtcdStore
from tp_store.testing.contract import TIMEOUT, Harness, StoreContract

pytestmark = pytest.mark.etcd


@pytest.fixture(params=["etcd-1/grpc", "etcd-1/gateway", "etcd-3/grpc", "etcd-3/gateway"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    members, transport = request.param.split("/")
    cluster = request.getfixturevalue("etcd1" if members == "etcd-1" else "etcd3")
    # A prefix of its own per test: the data of earlier tests is out of sight.
    opener = functools.partial(
        EtcdStore,
        cluster.endpoints,
        f"/contract/{uuid.uuid4().hex}/",
        timeout=TIMEOUT,
        transport=transport,
    )
    built = Harness(opener(), opener, crosses_processes=True)
    yield built
    built.close()


class TestEtcdStoreContract(StoreContract):
    """Every Store behaviour, on etcd."""
