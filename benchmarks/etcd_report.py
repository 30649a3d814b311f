"""The report's etcd section: the spread round on etcd at job scale (``etcd_round.py``).

Reads ``etcd_round.json`` (one member), ``etcd_round_kill.json`` (three
members, the leader killed during the round), ``etcd_round_torch.json``
(torch's ``etcd-v2``), ``etcd_transport.json`` (etcd's CPU per request by
transport) and ``idle_bench.json`` (its etcd row: an idle job of 1,000 nodes
on etcd, ``idle_bench.py``) from ``benchmarks/results/``,
and draws ``etcd-round.png``: the round's time, etcd's requests per node and
its CPU per node against the node count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from report_parts import ETCD_COLOR, OURS_COLOR, markdown_table, pyplot, save

HERE = Path(__file__).resolve().parent
ONE_MEMBER_JSON = HERE / "results" / "etcd_round.json"
KILL_JSON = HERE / "results" / "etcd_round_kill.json"
#: torch's ``etcd-v2`` on one member with the v2 API (``etcd_round.py --torch-cases``).
TORCH_JSON = HERE / "results" / "etcd_round_torch.json"
#: etcd's CPU per request through either transport (``etcd_transport.py --json ...``).
TRANSPORT_JSON = HERE / "results" / "etcd_transport.json"
#: ``idle_bench.py --only etcd --out ...``: the idle job on etcd after issue 30.
IDLE_JSON = HERE / "results" / "idle_bench.json"
TARGET_IDLE_MS_PER_S = 30.0
PNG = "etcd-round.png"
#: The issue's targets for one member: N -> seconds.
TARGETS = {1000: 2.0, 2000: 4.0, 4000: 10.0}
TARGET_REQUESTS_PER_NODE = 4
TARGET_CPU_MS_PER_NODE = 1.0
ALIGN = "lrrrll"


def _load(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _done(data: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [run for run in (data or {}).get("runs", []) if "error" not in run]


def write_plot(out_dir: Path) -> tuple[str, list[Path]]:
    """The plot's alt text and what was written (nothing without results)."""
    one, kill = _load(ONE_MEMBER_JSON), _load(KILL_JSON)
    runs = [run for run in _done(one) if not _lone(run)]
    lone = [run for run in _done(one) if _lone(run)]
    if not runs:
        return "", []
    plt = pyplot()
    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    sizes = [run["nodes"] for run in runs]
    panels = (
        ("round (s)", "seconds", TARGETS),
        ("etcd requests per node", "requests_per_node", TARGET_REQUESTS_PER_NODE),
        ("etcd CPU per node (ms)", "etcd_cpu_ms_per_node", TARGET_CPU_MS_PER_NODE),
    )
    series = (
        (runs, "o-", ETCD_COLOR, "one member"),
        (lone, "^", ETCD_COLOR, "one member, one node per process"),
        (_done(kill), "s--", OURS_COLOR, "three members, leader killed"),
    )
    for axis, (title, field, targets) in zip(axes, panels, strict=True):
        for shown, style, color, label in series:
            if shown:
                nodes = [run["nodes"] for run in shown]
                axis.plot(nodes, [run[field] for run in shown], style, color=color, label=label)
        if isinstance(targets, dict):
            axis.plot(list(targets), list(targets.values()), "k:", label="target")
        else:
            axis.axhline(targets, color="k", linestyle=":", label="target")
        axis.set_xscale("log")
        axis.set_xticks(sizes, [str(size) for size in sizes])
        axis.minorticks_off()
        axis.set_ylim(bottom=0)
        axis.set_title(title)
        axis.set_xlabel("nodes")
        axis.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    save(figure, out_dir / PNG)
    alt = "; ".join(
        f"{run['nodes']} nodes"
        + (" (one per process)" if _lone(run) else "")
        + f": {run['seconds']:.2f} s, {run['requests_per_node']} requests "
        f"and {run['etcd_cpu_ms_per_node']} ms of etcd CPU per node"
        for run in [*runs, *lone]
    )
    return f"The round on etcd against the node count: {alt}", [out_dir / PNG]


def _lone(run: dict[str, Any]) -> bool:
    """Whether every node of ``run`` had a process of its own."""
    return bool(run["processes"] == run["nodes"])


def _rows(data: dict[str, Any] | None) -> list[list[str]]:
    rows = []
    for run in (data or {}).get("runs", []):
        case = f"{run['nodes']} / {run['processes']}"
        if "error" in run:
            rows.append([case, "failed: " + run["error"][:80], "", "", "", ""])
            continue
        killed = run.get("killed_leader")
        note = ""
        if killed:
            elected = killed.get("elected_after")
            note = "leader killed" + (f", elected after {elected} s; " if elected else "; ")
        rows.append(
            [
                case,
                f"{run['seconds']:.2f}",
                f"{run['requests_per_node']}",
                f"{run['etcd_cpu_ms_per_node']}",
                ", ".join(f"{method} {count}" for method, count in sorted(run["requests"].items())),
                note + f"load {run['load'][0]:.0f}",
            ]
        )
    return rows


def _torch_rows(data: dict[str, Any]) -> list[list[str]]:
    rows = []
    for run in data.get("runs", []):
        case = f"{run['nodes']} / {run['processes']}"
        if "error" in run:
            rows.append([case, "never: " + run["error"][:80], "", ""])
            continue
        cpu = f"{run['etcd_cpu_ms_per_node']}"
        rows.append([case, f"{run['seconds']:.2f}", cpu, f"load {run['load'][0]:.0f}"])
    return rows


def _transport_table(data: dict[str, Any]) -> str:
    """etcd's CPU per request (ms) and latency, each kind through each transport."""
    kinds = data["kinds"]
    ways = list(dict.fromkeys(way for kind in kinds.values() for way in kind))
    header = ["request", *(f"{way}: etcd CPU ms / latency ms" for way in ways)]
    rows = [
        [
            kind,
            *(
                f"{found['etcd_cpu_ms_per_request']} / {found['latency_ms']}"
                if (found := measured.get(way))
                else "-"
                for way in ways
            ),
        ]
        for kind, measured in kinds.items()
    ]
    return markdown_table(header, rows, "l" + "r" * len(ways))


def _families(run: dict[str, Any]) -> str:
    """The nodes' requests per node by request and key family, largest first."""
    nodes = run["nodes"]
    parts = [
        f"`{name}` {count / nodes:.2f}"
        for name, count in run["client_requests"].items()
        if count / nodes >= 0.05
    ]
    return ", ".join(parts)


def section(alt: str) -> str:
    """The Markdown of the etcd section ('' without results)."""
    one, kill = _load(ONE_MEMBER_JSON), _load(KILL_JSON)
    if one is None:
        return ""
    header = ["N nodes / processes", "round (s)", "requests / node", "etcd CPU ms / node"]
    header += ["etcd's requests by method", "notes"]
    out = ["## The round on etcd at job scale\n"]
    out.append(f"![{alt}]({PNG})\n")
    out.append(
        "`benchmarks/etcd_round.py`: the spread shape (N nodes over P processes, each node its "
        "own handler and `EtcdStore`, `min_nodes = max_nodes = N`, default settings) against a "
        "fresh etcd started for each case, its data on disk. Requests are the messages etcd "
        "received (`grpc_server_msg_received_total`, every member summed: a keep-alive on a "
        "stream counts, as does a watch request); CPU is every member's over the round. "
        f"Targets: {TARGET_REQUESTS_PER_NODE} requests and {TARGET_CPU_MS_PER_NODE:g} ms of etcd "
        "CPU per node; rounds of 1,000 / 2,000 / 4,000 nodes within "
        + " / ".join(f"{seconds:g}" for seconds in TARGETS.values())
        + " s.\n"
    )
    out.append(
        "A node waits for its round's outcome with no request of its own: its process keeps a "
        "copy of the run's outcomes (`tp_rdzv_etcd.client.shared.mirrors`), read in its first "
        "transaction, before the round (set-up, not counted here), and kept by one watch. The "
        "reads of their answers by the nodes of one process, coming at once, go in one "
        "transaction (`tp_rdzv_etcd.client.shared.reads`). So a node alone in its process, as "
        "one agent per host runs (the N / N row), costs its lease grant, its join and the read "
        "of its answer. In a job's first round the first join takes the vacant steward lease "
        "in its own transaction, and the others read who did.\n"
    )
    out.append(f"One member (etcd {one.get('versions', {}).get('etcd', '?')}, {one['date']}):\n")
    out.append(markdown_table(header, _rows(one), ALIGN) + "\n")
    if kill is not None:
        out.append(
            f"Three members on loopback, the leader killed {kill['config']['kill_leader']} s into "
            f"the round ({kill['date']}):\n"
        )
        out.append(markdown_table(header, _rows(kill), ALIGN) + "\n")
    torch = _load(TORCH_JSON)
    if torch is not None:
        out.append(
            f"torch's `etcd-v2` (python-etcd on etcd's v2 API, the member started with "
            f"`--enable-v2`; {torch['date']}, {torch['config'].get('timeout', '?')} s allowed per "
            "round; its requests are HTTP/1.1 to the v2 API, which etcd's gRPC counters do not "
            "see):\n"
        )
        header_torch = ["N nodes / processes", "round (s)", "etcd CPU ms / node", "notes"]
        out.append(markdown_table(header_torch, _torch_rows(torch), "lrrl") + "\n")
    transport = _load(TRANSPORT_JSON)
    if transport is not None:
        out.append(
            f"etcd's CPU per request by transport (`etcd_transport.py`, etcd "
            f"{transport['etcd']}, one client sending one request after the other, load "
            f"{transport['load_before'][0]:.0f} at the start):\n"
        )
        out.append(_transport_table(transport) + "\n")
    idle = _load(IDLE_JSON)
    windows = (idle or {}).get("runs", {}).get("etcd", {}).get("windows", {})
    if windows:
        shown = "; ".join(
            f"{phase}: {window['server_ms_per_s']} ms/s (load {window['load'][0]:.0f})"
            for phase, window in windows.items()
        )
        out.append(
            f"An idle job ({idle['config']['nodes']} nodes over {idle['config']['processes']} "
            f"processes after its round, `idle_bench.py`, {idle['date']}), etcd's "
            f"CPU per second: {shown}; target {TARGET_IDLE_MS_PER_S:g} ms/s (629 before "
            "issue 25, 177 after it).\n"
        )
    done = [run for run in _done(one) if not _lone(run)]
    if done:
        largest = max(done, key=lambda run: run["nodes"])
        out.append(
            f"Where a node's requests go ({largest['nodes']} nodes, per node, counted in the node "
            f"processes by request and key family): {_families(largest)}.\n"
        )
    for run in (run for run in _done(one) if _lone(run)):
        out.append(
            f"With one node per process ({run['nodes']} nodes): {_families(run)} "
            "(`range roster`: the bench's check of the participant lists after the round, "
            "once per process; etcd's counts above stop before it).\n"
        )
    return "\n".join(out)
