"""``tp-rdzv`` as users run it: the installed command in subprocesses, on loopback."""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

import jsonschema
import pytest
from cli_support import Command, one_line_error, run_tp_rdzv, unique_run_id

from tp_rdzv_api import RendezvousParameters, create_handler
from tp_store import TCPStore

#: Quick liveness so the tests that wait for a change do not wait long.
FAST = "keep_alive_interval=0.5,keep_alive_max_attempt=2,last_call_timeout=0.5"
STATUS_SCHEMA = json.loads(
    resources.files("tp_rdzv_cli").joinpath("status.schema.json").read_text()
)


def join(tp_rdzv: Callable[..., Command], endpoint: str, run_id: str, *extra: str) -> Command:
    return tp_rdzv(
        "join",
        "--endpoint",
        endpoint,
        "--run-id",
        run_id,
        "--json",
        "--config",
        FAST,
        *extra,
    )


def status(endpoint: str, run_id: str) -> dict[str, Any]:
    document = status_if_it_exists(endpoint, run_id)
    assert document is not None, f"run {run_id} does not exist"
    return document


def status_if_it_exists(endpoint: str, run_id: str) -> dict[str, Any] | None:
    """``status --json``, or ``None`` while nothing of the run is stored (exit 1)."""
    result = run_tp_rdzv("status", "--endpoint", endpoint, "--run-id", run_id, "--json")
    if result.returncode == 1 and "does not exist" in result.stderr:
        return None
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.validate(document, STATUS_SCHEMA)
    return document


def next_round(node: Command) -> dict[str, Any]:
    event = node.event()
    assert event["event"] == "round", event
    return event


def test_three_joins_form_a_round_and_close_makes_them_exit_0(tp_rdzv, store):
    run_id = unique_run_id()
    nodes = [join(tp_rdzv, store, run_id, "--min", "3", "--max", "3") for _ in range(3)]
    rounds = [next_round(node) for node in nodes]

    assert sorted(r["rank"] for r in rounds) == [0, 1, 2]
    assert {r["world_size"] for r in rounds} == {3}
    assert len({tuple(r["participants"]) for r in rounds}) == 1
    for r in rounds:
        assert r["participants"][r["rank"]] == r["node"]

    seen = status(store, run_id)
    assert seen["complete"]
    assert not seen["closed"]
    assert [n["node"] for n in seen["participants"]] == rounds[0]["participants"]
    assert [n["rank"] for n in seen["participants"]] == [0, 1, 2]
    assert seen["steward"] in rounds[0]["participants"]

    closed = run_tp_rdzv("close", "--endpoint", store, "--run-id", run_id, "--json")
    assert closed.returncode == 0, closed.stderr
    assert json.loads(closed.stdout) == {"event": "closed", "run_id": run_id}
    for node in nodes:
        assert node.event()["event"] == "closed"
        code, err = node.wait()
        assert code == 0, err
    assert status(store, run_id)["closed"]


def test_a_late_joiner_makes_the_agents_join_the_next_round(tp_rdzv, store):
    run_id = unique_run_id()
    first = [join(tp_rdzv, store, run_id, "--min", "2", "--max", "3") for _ in range(2)]
    before = [next_round(node) for node in first]
    assert {r["world_size"] for r in before} == {2}

    late = join(tp_rdzv, store, run_id, "--min", "2", "--max", "3")
    after = [next_round(node) for node in [*first, late]]
    assert {r["world_size"] for r in after} == {3}
    assert {r["round"] for r in after} == {before[0]["round"] + 1}
    assert sorted(r["rank"] for r in after) == [0, 1, 2]


def test_agents_reform_when_the_steward_is_killed(tp_rdzv, store):
    # The steward is one of the running agents: with nobody joining, the others
    # must notice its silence themselves, take over, and find the dead node.
    run_id = unique_run_id()
    nodes = [join(tp_rdzv, store, run_id, "--min", "2", "--max", "3") for _ in range(3)]
    before = [next_round(node) for node in nodes]
    steward = status(store, run_id)["steward"]
    (victim,) = [node for node, r in zip(nodes, before, strict=True) if r["node"] == steward]
    victim.signal(signal.SIGKILL)
    survivors = [node for node in nodes if node is not victim]
    after = [next_round(node) for node in survivors]
    assert {r["world_size"] for r in after} == {2}
    assert sorted(r["rank"] for r in after) == [0, 1]
    assert steward not in after[0]["participants"]


def test_status_shows_the_wait_list_and_presence(tp_rdzv, store):
    run_id = unique_run_id()
    # A round needs 2; one node waits alone, present through its store session.
    lone = join(tp_rdzv, store, run_id, "--min", "2", "--max", "2")
    document = status_if_it_exists(store, run_id)
    while (
        document is None
        or not document["participants"]
        or not document["participants"][0]["present"]
    ):
        # The node joins, then the steward reports whom it watches with the membership.
        document = status_if_it_exists(store, run_id)
    assert not document["complete"]
    (node,) = document["participants"]
    assert node["rank"] is None
    assert node["present"] is True
    assert node["heartbeat_age"] is None
    lone.stop()


def test_status_table_for_people(tp_rdzv, store):
    run_id = unique_run_id()
    nodes = [join(tp_rdzv, store, run_id, "--min", "2", "--max", "2") for _ in range(2)]
    names = [next_round(node)["node"] for node in nodes]
    result = run_tp_rdzv("status", "--endpoint", store, "--run-id", run_id)
    assert result.returncode == 0, result.stderr
    assert "complete" in result.stdout
    for name in names:
        assert name in result.stdout


def test_status_table_of_a_closed_run_shows_no_live_node(tp_rdzv, store):
    run_id = unique_run_id()
    nodes = [join(tp_rdzv, store, run_id, "--min", "2", "--max", "2") for _ in range(2)]
    for node in nodes:
        next_round(node)
    closing = run_tp_rdzv("close", "--endpoint", store, "--run-id", run_id)
    assert closing.returncode == 0, closing.stderr
    result = run_tp_rdzv("status", "--endpoint", store, "--run-id", run_id)
    assert result.returncode == 0, result.stderr
    assert "closed" in result.stdout
    assert "s ago" not in result.stdout  # no heartbeat age, as if its nodes were alive
    assert result.stdout.count("not live (closed)") == 2


@pytest.mark.parametrize("signals", [[signal.SIGINT], [signal.SIGTERM], [signal.SIGINT] * 3])
@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["foreground", "background-job"])
def test_status_watch_refreshes_until_interrupted(tp_rdzv, store, signals, sigint_ignored):
    # A script's `tp-rdzv status --watch &` inherits SIGINT ignored; it must stop all the same.
    run_id = unique_run_id()
    watch = tp_rdzv(
        "status",
        "--endpoint",
        store,
        "--run-id",
        run_id,
        "--watch",
        "--json",
        "--interval",
        "0.1",
        sigint_ignored=sigint_ignored,
    )
    first, second = watch.event(), watch.event()
    assert second["observed_at"] > first["observed_at"]
    for signum in signals:
        watch.signal(signum)
    code, err = watch.wait()
    assert code == 0, err
    assert "Traceback" not in err


def test_status_of_the_store_server_counts_operations(tp_rdzv, store):
    run_id = unique_run_id()
    nodes = [join(tp_rdzv, store, run_id, "--min", "2", "--max", "2") for _ in range(2)]
    for node in nodes:
        next_round(node)
    result = run_tp_rdzv("status", "--endpoint", store, "--store", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["connections_open"] >= 2
    assert stats["ops"]["queue_push"] >= 2  # each node posted its join
    table = run_tp_rdzv("status", "--endpoint", store, "--store")
    assert table.returncode == 0, table.stderr
    assert "connections_open" in table.stdout
    (uptime,) = (line for line in table.stdout.splitlines() if "uptime" in line)
    # To the millisecond, not a float's 17 digits.
    assert re.search(r"\b\d+\.\d{3}\b", uptime), uptime


def test_store_serves_prometheus_metrics(tp_rdzv):
    server = tp_rdzv("store", "--port", "0", "--metrics-port", "0", "--json")
    ready = server.event()
    with urllib.request.urlopen(ready["metrics"], timeout=30) as response:
        text = response.read().decode()
    assert "tp_store_connections_open" in text


@pytest.mark.parametrize(
    "signals", [[signal.SIGINT], [signal.SIGTERM], [signal.SIGTERM, signal.SIGTERM]]
)
def test_store_shuts_down_cleanly_on_a_signal(tp_rdzv, signals):
    # timeout(1) and supervisors may send a second signal milliseconds after the first.
    server = tp_rdzv("store", "--port", "0", sigint_ignored=True)
    assert server.line().startswith("store listening on 127.0.0.1:")
    for signum in signals:
        server.signal(signum)
        time.sleep(0.005)
    code, err = server.wait()
    assert code == 0, err
    assert "Traceback" not in err


def test_join_logs_structured_events_as_json(tp_rdzv, store):
    run_id = unique_run_id()
    nodes = [
        join(
            tp_rdzv,
            store,
            run_id,
            "--min",
            "1",
            "--max",
            "1",
            "--log-level",
            "INFO",
            "--log-format",
            "json",
        )
    ]
    next_round(nodes[0])
    assert run_tp_rdzv("close", "--endpoint", store, "--run-id", run_id).returncode == 0
    code, err = nodes[0].wait()
    assert code == 0, err
    records = [json.loads(line) for line in err.splitlines()]
    joined = [r for r in records if r.get("action") == "round_joined"]
    assert joined, records
    assert joined[0]["run_id"] == run_id
    assert joined[0]["round"] == 0
    assert joined[0]["duration"] >= 0
    assert {r.get("action") for r in records} >= {"steward_elected", "round_complete"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


JOIN = "join --endpoint h:1 --run-id r --min 1 --max 1"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("join --endpoint 127.0.0.1:1 --run-id r", "required: --min, --max"),
        ("join --endpoint h:1:2 --run-id r --min 1 --max 1", "endpoint"),
        ("join --endpoint h:99999 --run-id r --min 1 --max 1", "port"),
        ("join --endpoint h:1 --run-id r --min 3 --max 2", "max_nodes"),
        ("join --endpoint h:1 --run-id r --min x --max 2", "--min"),
        (f"{JOIN} --config keep_alive_interval=-1", "keep_alive_interval"),
        (f"{JOIN} --config nokey", "config"),
        (f"{JOIN} --backend nope", "nope"),
        ("status --endpoint h:1", "--run-id"),
        ("status --endpoint h:1 --run-id r --timeout 0", "--timeout"),
        ("demo --nodes 2 --kill 2", "--kill"),
        ("demo --timeout nan", "--timeout"),
        ("demo --timeout inf", "--timeout"),
        ("demo --nodes 0", "--nodes"),
        ("demo --nodes 100000", "--nodes"),
        ("demo --kill -1", "--kill"),
        ("status --endpoint h:1 --run-id r --watch --interval nan", "--interval"),
        ("status --endpoint h:1 --run-id r --watch --interval inf", "--interval"),
        ("status --endpoint h:1 --run-id r --watch --interval -1", "--interval"),
        ("status --endpoint h:1 --run-id r --timeout inf", "--timeout"),
        ("close --endpoint h:1 --run-id r --timeout nan", "--timeout"),
        ("store --port 0 --metrics-port 99999", "--metrics-port"),
        ("store --port 0 --metrics-port -1", "--metrics-port"),
        (f"store --port 0 --metrics-port {'9' * 5000}", "--metrics-port"),
        (f"join --endpoint h:1 --run-id r --min {'9' * 5000} --max 2", "--min"),
        ("join --endpoint h:1 --run-id r --min 1 --max 0", "--max"),
        (f"{JOIN} --config keep_alive_max_attempt={'9' * 5000}", "keep_alive_max_attempt"),
        (f"{JOIN} --config join_timeout={'9' * 5000}", "join_timeout"),
        ("join --endpoint h:1 --run-id 'bad id' --min 1 --max 1", "run_id"),
        ("store --port 70000", "port"),
        ("frobnicate", "invalid choice"),
        ("", "required: COMMAND"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(command, expected):
    result = run_tp_rdzv(*shlex.split(command))
    assert expected in one_line_error(result, 2)
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["status", "close"])
def test_an_unreachable_store_gives_one_line_and_exit_3(command):
    endpoint = f"127.0.0.1:{_free_port()}"
    result = run_tp_rdzv(command, "--endpoint", endpoint, "--run-id", "r", "--timeout", "1")
    assert endpoint in one_line_error(result, 3)


@pytest.mark.parametrize("command", ["join --min 1 --max 1", "status", "close"])
def test_a_file_store_that_cannot_be_opened_gives_one_line_and_exit_3(tmp_path, command):
    missing = tmp_path / "no-such-directory" / "store"
    result = run_tp_rdzv(
        *shlex.split(command),
        "--endpoint",
        str(missing),
        "--run-id",
        "r",
        "--config",
        "store_type=file",
    )
    assert str(missing) in one_line_error(result, 3)


def test_status_shows_node_names_literally_not_as_markup(tmp_path):
    # A node may be named anything; "[/]x" is a closing tag to rich markup. Rank 0
    # (first in the natural order) hosts the workers' bootstrap store on its address:
    # one this host can listen on.
    names = ["127.0.0.1", "[/]x", "[bold]y[/bold]", "[link=http://z]z"]
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=30)
    handlers = []
    try:
        endpoint = f"127.0.0.1:{store.port}"
        for name in names:
            params = RendezvousParameters(
                "core",
                endpoint,
                "markup",
                min_nodes=4,
                max_nodes=4,
                local_addr=name,
                config={"is_host": False, "last_call_timeout": 0.5},
            )
            handlers.append(create_handler(params))
        with ThreadPoolExecutor(len(handlers)) as pool:
            list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
        result = run_tp_rdzv("status", "--endpoint", endpoint, "--run-id", "markup")
        assert result.returncode == 0, result.stderr
        for handler in handlers:
            assert str(handler.node) in result.stdout
    finally:
        for handler in handlers:
            handler.shutdown()
        store.close()


def test_store_status_of_an_unreachable_store_exits_3():
    endpoint = f"127.0.0.1:{_free_port()}"
    result = run_tp_rdzv("status", "--endpoint", endpoint, "--store", "--timeout", "1")
    assert endpoint in one_line_error(result, 3)


def test_store_on_a_taken_port_fails_in_one_line(tp_rdzv, store):
    port = store.rsplit(":", 1)[1]
    assert port in one_line_error(run_tp_rdzv("store", "--port", port), 1)


def test_help_shows_examples_and_exit_codes():
    for command in ("store", "join", "status", "close", "demo"):
        result = run_tp_rdzv(command, "--help")
        assert result.returncode == 0
        assert "examples:" in result.stdout
    top = run_tp_rdzv("--help")
    assert "exit codes:" in top.stdout


def _keys_and_count(endpoint: str) -> tuple[dict[str, bytes], int]:
    """Every user key with its value, and the server's key count (internal keys too)."""
    from tp_store import TCPStore

    host, port = endpoint.rsplit(":", 1)
    with TCPStore(host, int(port), timeout=10) as client:
        return {key: client.get(key) for key in client.list_keys()}, client.server_stats()["keys"]


@pytest.mark.parametrize("backend", ["core", "c10d", "p10d"])
def test_status_writes_nothing(tp_rdzv, store, backend):
    run_id = unique_run_id()
    node = join(tp_rdzv, store, run_id, "--backend", backend, "--min", "1", "--max", "1")
    next_round(node)
    node.signal(signal.SIGKILL)  # nothing writes any more: the store must stay as it is
    node.wait()
    before = _keys_and_count(store)
    for args in ([], ["--json"]):
        result = run_tp_rdzv(
            "status", "--endpoint", store, "--run-id", run_id, "--backend", backend, *args
        )
        assert result.returncode == 0, result.stderr
    assert _keys_and_count(store) == before


@pytest.mark.parametrize("backend", ["core", "c10d", "p10d"])
def test_status_of_a_run_that_does_not_exist_says_so_and_writes_nothing(store, backend):
    before = _keys_and_count(store)
    result = run_tp_rdzv("status", "--endpoint", store, "--run-id", "nobody", "--backend", backend)
    message = one_line_error(result, 1)
    assert "rendezvous 'nobody' does not exist" in message
    assert _keys_and_count(store) == before
