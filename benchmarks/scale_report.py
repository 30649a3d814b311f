"""The large-round section of the benchmark report: ``scale_bench.py``'s results and plot."""

from __future__ import annotations

import statistics
from pathlib import Path

from report_parts import (
    OURS_COLOR,
    TORCH_COLOR,
    Run,
    escape,
    load_run,
    machine_caption,
    markdown_table,
    number,
    pyplot,
    save,
)

HERE = Path(__file__).resolve().parent
SCALE_JSON = HERE / "results" / "scale_bench.json"
SCALE_PNG = "rendezvous-scale.png"


def load() -> Run | None:
    return load_run(SCALE_JSON)


def _runs(run: Run) -> list[dict]:
    return [r for r in run.data.get("runs", []) if "error" not in r]


def _medians(runs: list[dict], key: str) -> tuple[list[int], list[float]]:
    """Each N's median of ``key`` over its runs, in order of N (the line through the points)."""
    by_n: dict[int, list[float]] = {}
    for r in runs:
        by_n.setdefault(r["nodes"], []).append(r[key])
    nodes = sorted(by_n)
    return nodes, [statistics.median(by_n[n]) for n in nodes]


def plot(run: Run, path: Path) -> str:
    """Time and CPU per node against N, log-log, with the fitted slopes; the alt text.

    Every run is a point; the lines join each N's median.
    """
    plt = pyplot()
    runs = _runs(run)
    slopes = run.data.get("slopes", {})
    nodes = [r["nodes"] for r in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    series = (
        (left, "last", "o", OURS_COLOR, 1.0, "last return"),
        (left, "first", "o", OURS_COLOR, 0.5, "first"),
        (
            right,
            "nodes_cpu_ms_per_node",
            "o",
            OURS_COLOR,
            1.0,
            f"node processes (slope {slopes.get('nodes_cpu_ms_per_node')})",
        ),
        (
            right,
            "server_cpu_ms_per_node",
            "s",
            TORCH_COLOR,
            1.0,
            f"store server (slope {slopes.get('server_cpu_ms_per_node')})",
        ),
    )
    for ax, key, marker, color, alpha, label in series:
        ax.loglog(nodes, [r[key] for r in runs], marker, color=color, alpha=alpha * 0.6)
        ax.loglog(*_medians(runs, key), f"{marker}-", color=color, alpha=alpha, label=label)
    left.set_xlabel("nodes N")
    left.set_ylabel("seconds from the start signal")
    left.set_title(f"round time (slope {slopes.get('last')})", fontsize=10)
    right.set_xlabel("nodes N")
    right.set_ylabel("CPU ms per node")
    right.set_title("CPU per node per round", fontsize=10)
    for ax in (left, right):
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.25)
    fig.suptitle(machine_caption(run), fontsize=8, color="#555555")
    save(fig, path)
    plt.close(fig)
    ns, lasts = _medians(runs, "last")
    cpus = _medians(runs, "nodes_cpu_ms_per_node")[1]
    servers = _medians(runs, "server_cpu_ms_per_node")[1]
    points = "; ".join(
        f"{n} nodes: {last:.2f} s, {cpu:.2f} ms and {server:.3f} ms CPU per node"
        for n, last, cpu, server in zip(ns, lasts, cpus, servers, strict=True)
    )
    return (
        "Log-log plots of the round time and the CPU per node against N "
        f"(medians of {len(runs)} runs): {points}"
    )


def section(run: Run | None, alts: dict[str, str]) -> str:
    """The Markdown of the section (empty before ``scale_bench.py`` ran)."""
    if run is None:
        return ""
    rows = []
    for r in run.data.get("runs", []):
        if "error" in r:
            rows.append([escape(r["case"]), "failed", *["—"] * 8, escape(r["error"][:120])])
            continue
        split = r.get("split", {})
        rows.append(
            [
                escape(r["case"]),
                number(r["last"]),
                number(r["first"]),
                number(r["server_cpu_ms_per_node"]),
                number(r["nodes_cpu_ms_per_node"]),
                number(r["bytes_sent_per_node"]),
                number(r.get("connections_per_node")),
                " / ".join(number(split.get(k)) for k in ("joins", "decision", "answers")),
                number(split.get("publish")),
                str(len(r.get("removed", []))),
                escape(str(r.get("load"))),
            ]
        )
    header = [
        "case",
        "last return (s)",
        "first (s)",
        "server CPU ms/node",
        "nodes' CPU ms/node",
        "server B sent/node",
        "server connections/node",
        "joins / decision / answers (s)",
        "publish (s)",
        "live nodes removed",
        "load (1, 5, 15 min)",
    ]
    slopes = run.data.get("slopes", {})
    interval = run.data.get("switch_interval") or 0.005
    out = [
        "## Large rounds: 1,000 to 16,000 nodes\n",
        f"![{escape(alts[SCALE_PNG])}]({SCALE_PNG})\n",
        "`python benchmarks/scale_bench.py`: the spread scenario (N nodes over P processes, "
        "each node its own handler, store connection and presence session, as one node "
        "per host has when deployed: the session lives on the node's store connection, "
        "which also carries its ticks, so the server holds about one connection per node; "
        "the server alone in its own process, one start signal) at 1,000 / 4,000 / 10,000 / "
        "16,000 nodes, ours only. "
        "*Joins*: from the start signal until the steward began the batch that completed "
        "the round; *decision*: that batch decided and the state saved; *answers*: from then "
        "to the last return, including *publish* (the steward writing the roster, the "
        "per-node answers and the outcome). CPU is the server process's and all node "
        "processes' over the round, per node; bytes are what the server sent in the round, "
        "per node. Ranks are checked to be exactly 0..N-1; a removal record naming any node "
        "(all are alive) counts in *live nodes removed*.\n",
        markdown_table(header, rows, "lrrrrrrrrrl") + "\n",
        f"Node processes' switch interval: {interval} s (CPython's default 0.005: with "
        "hundreds of node threads a process, every thread waiting for the GIL wakes each "
        "interval, which the default makes most of the node processes' CPU; a real node "
        "process has a few threads). "
        f"Fitted log-log slopes against N: {escape(str(slopes))} (1 is linear; 0 is flat). "
        f"Limits: {escape('; '.join(run.data.get('limits', [])))}. Run of {run.date}.\n",
    ]
    return "\n".join(out)
