#!/usr/bin/env python3
"""Write the benchmark report: the docs page and its plots, from the JSON results.

Reads ``benchmarks/results/store_bench.json`` (``store_bench.py``) and
``benchmarks/results/rdzv_bench.json`` (``rdzv_bench.py``) and writes
``docs/benchmarks/index.md`` with two matplotlib plots beside it:

- ``rendezvous-first-round.png``: the first round's time against the node
  count, log-log, for ours on the embedded store, ours on etcd and torch's
  c10d backend (a torch round that timed out is drawn at the timeout);
- ``store-ops.png``: store operations per second, ours next to torch;
- ``rendezvous-spread-returns.png``: for each spread case (N nodes over P
  processes, the server alone), every node's time from the start signal to
  its return, as a histogram: where the round's tail is;
- the etcd section (``etcd_report.py``): the round on etcd at job scale,
  from ``etcd_round.py``'s results, with ``etcd-round.png``;
- the recovery section (``recovery_report.py``): from the results of
  ``restart_bench.py``, ``rdzv_bench.py --recovery`` and ``idle_bench.py``
  and of the same before issue 25 (``results/issue25-baseline/``), with
  ``recovery-restart.png``;
- the bootstrap store's section (``bootstrap_report.py``): from the results
  of ``storm_bench.py`` and ``bootstrap_probes.py``, with ``bootstrap-storm.png``.

Measuring and rendering are separate: ``nox -s bench`` runs both benchmarks
and then this script, and ``python benchmarks/report.py`` alone regenerates
the page from the JSON that is there (it needs matplotlib only). The output
depends on the JSON alone, so the same results give the same bytes.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import bootstrap_report
import etcd_report
import recovery_report
import scale_report
from metrics import Metric
from recovery_report import RecoveryRuns
from report_parts import (
    ETCD_COLOR,
    EVEN,
    OURS_COLOR,
    TORCH_COLOR,
    Run,
    config_line,
    escape,
    load_run,
    machine_caption,
    machine_table,
    markdown_table,
    notes_block,
    number,
    pyplot,
    results_table,
    save,
    short_number,
    verdict,
)
from store_matrix import MatrixView, matrix_table

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STORE_JSON = HERE / "results" / "store_bench.json"
RDZV_JSON = HERE / "results" / "rdzv_bench.json"
OUT_DIR = REPO / "docs" / "benchmarks"
PAGE = "index.md"
RDZV_PNG = "rendezvous-first-round.png"
SPREAD_PNG = "rendezvous-spread-returns.png"
STORE_PNG = "store-ops.png"
MATRIX_PNG = "store-matrix.png"

ROUND = re.compile(r"^first round, (\d+) nodes$")
ETCD_ROUND = re.compile(r"^first round, (\d+) nodes, on etcd$")


# -- the plots -----------------------------------------------------------------------------


def series(run: Run, pattern: re.Pattern[str], side: str) -> list[tuple[int, float]]:
    """(node count, seconds) of ``side`` on the rows matching ``pattern``."""
    points = []
    for row in run.rows:
        match = pattern.match(row.name)
        value = getattr(row, side)
        if match and value is not None:
            points.append((int(match[1]), float(value)))
    return sorted(points)


def timed_out(run: Run, side: str) -> list[int]:
    """The node counts whose first round of ``side`` timed out."""
    sizes = []
    for row in run.rows:
        match = ROUND.match(row.name)
        note = row.notes.get(side, "")
        if match and getattr(row, side) is None and note.startswith("TimeoutError"):
            sizes.append(int(match[1]))
    return sorted(sizes)


def plot_rendezvous(run: Run, path: Path) -> str:
    """The first-round plot of ``run`` at ``path``; returns its alt text."""
    plt = pyplot()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ours = series(run, ROUND, "ours")
    etcd = series(run, ETCD_ROUND, "ours")
    torch = series(run, ROUND, "torch")
    torch_timeouts = timed_out(run, "torch")
    ours_timeouts = timed_out(run, "ours")
    timeout = float(run.data.get("config", {}).get("timeout", 0) or 0)

    fig, ax = plt.subplots(figsize=(8, 5.2))
    lines = [
        (ours, "ours (tp-rdzv-dynamic, embedded TCPStore)", OURS_COLOR, "o", "-"),
        (etcd, "ours on etcd (one member, data on disk)", ETCD_COLOR, "s", "--"),
        (torch, "PyTorch 2.13 (c10d backend, TCPStore)", TORCH_COLOR, "^", "-"),
    ]
    for points, label, color, marker, style in lines:
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker=marker, linestyle=style, color=color, label=label, linewidth=1.8)
        x, y = points[-1]
        ax.annotate(
            f"{short_number(y)} s",
            (x, y),
            textcoords="offset points",
            xytext=(6, -3),
            fontsize=8,
            color=color,
        )
    for points, sizes, color, who in (
        (torch, torch_timeouts, TORCH_COLOR, "PyTorch"),
        (ours, ours_timeouts, OURS_COLOR, "ours"),
    ):
        if not sizes or not timeout:
            continue
        before = [point for point in points if point[0] < sizes[0]]
        if before:  # dotted: the round took at least the timeout from here on
            x, y = before[-1]
            ax.plot([x, sizes[0]], [y, timeout], linestyle=":", color=color, linewidth=1.5)
        ax.scatter(
            sizes,
            [timeout] * len(sizes),
            marker="x",
            s=80,
            linewidths=2.2,
            color=color,
            zorder=5,
            label=f"{who}: timed out (no result within {timeout:g} s)",
        )
        for size in sizes:
            ax.annotate(
                f"timed out\n(> {timeout:g} s)",
                (size, timeout),
                textcoords="offset points",
                xytext=(9, -4),
                ha="left",
                va="center",
                fontsize=8,
                color=color,
            )

    sizes = sorted({x for points in (ours, etcd, torch) for x, _ in points} | set(torch_timeouts))
    ax.set_xscale("log")
    ax.set_yscale("log")
    if sizes:
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_xlim(sizes[0] / 1.3, sizes[-1] * 1.5)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_xlabel("nodes in the round (min_nodes = max_nodes = N), log scale")
    ax.set_ylabel("seconds until every node has its rank, log scale")
    values = [y for points in (ours, etcd, torch) for _, y in points]
    if torch_timeouts or ours_timeouts:
        values.append(timeout)
    if values:
        low = 10 ** math.floor(math.log10(min(values)))
        high = 10 ** math.ceil(math.log10(max(values) * 1.3))
        ax.set_ylim(low, high)
    fig.suptitle("Rendezvous: first round of N nodes (lower is better)", fontsize=12)
    ax.set_title(machine_caption(run), fontsize=8, color="#555555")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    save(fig, path)
    plt.close(fig)
    return alt_rendezvous(ours, etcd, torch, torch_timeouts, timeout)


def alt_rendezvous(
    ours: Sequence[tuple[int, float]],
    etcd: Sequence[tuple[int, float]],
    torch: Sequence[tuple[int, float]],
    torch_timeouts: Sequence[int],
    timeout: float,
) -> str:
    """The alt text of the first-round plot: what it shows, with the end points."""

    def span(points: Sequence[tuple[int, float]]) -> str:
        (x0, y0), (x1, y1) = points[0], points[-1]
        return f"{short_number(y0)} s at {x0} nodes to {short_number(y1)} s at {x1} nodes"

    parts = ["Log-log plot of the first rendezvous round's time against the node count"]
    if ours:
        parts.append(f"ours on the embedded store: {span(ours)}")
    if etcd:
        parts.append(f"ours on etcd: {span(etcd)}")
    if torch:
        parts.append(f"PyTorch: {span(torch)}")
    if torch_timeouts:
        shown = ", ".join(map(str, torch_timeouts))
        parts.append(f"PyTorch timed out after {timeout:g} s at {shown} nodes")
    return "; ".join(parts)


def plot_spread(run: Run, path: Path) -> str:
    """Every node's return in each spread case, as histograms; returns the alt text."""
    plt = pyplot()
    cases = run.data.get("spread") or {}
    fig, axes = plt.subplots(len(cases), 1, figsize=(8, 2.6 * len(cases)), squeeze=False)
    for ax, (name, sides) in zip(axes[:, 0], cases.items(), strict=True):
        for side, color in (("ours", OURS_COLOR), ("torch", TORCH_COLOR)):
            for attempt, result in enumerate(sides.get(side, []), start=1):
                label = f"{side}, run {attempt}: last {result['last']:.2f} s"
                ax.hist(result["returns"], bins=60, color=color, alpha=0.5, label=label)
        ax.set_title(name)
        ax.set_xlabel("seconds from the start signal to the node's return")
        ax.set_ylabel("nodes")
        ax.legend()
    fig.text(0.01, -0.01, machine_caption(run), fontsize=8)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
    return "Histograms of every node's time to return in the spread cases"


def spread_table(run: Run) -> str:
    """First and last return, CPU seconds and load of every spread run."""
    rows = []
    for name, sides in (run.data.get("spread") or {}).items():
        for side, results in sides.items():
            for result in results:
                recovery = result.get("recovery")
                rows.append(
                    (
                        escape(name),
                        side,
                        number(result["first"]),
                        number(result["last"]),
                        "-" if recovery is None else number(recovery),
                        number(result["server_cpu"]),
                        number(result["nodes_cpu"]),
                        str(sum(result.get("ops", {}).values()) or "-"),
                        escape(str(result.get("load"))),
                    )
                )
    header = (
        "case",
        "side",
        "first return (s)",
        "last return (s)",
        "after SIGKILL (s)",
        "server CPU (s)",
        "nodes' CPU (s)",
        "server requests",
        "load average",
    )
    return markdown_table(header, rows, "llrrrrrrl")


def plot_store(run: Run, path: Path) -> str:
    """The store operations plot of ``run`` at ``path``; returns its alt text."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    rows = [row for row in run.rows if row.unit == "ops/s"]
    fig, ax = plt.subplots(figsize=(9, 5.2))
    width = 0.38
    positions = range(len(rows))
    for offset, side, label, color in (
        (-width / 2, "ours", "ours (tp_store TCPStore, its own server)", OURS_COLOR),
        (width / 2, "torch", "PyTorch 2.13 TCPStore (libuv server)", TORCH_COLOR),
    ):
        xs = [i + offset for i, row in zip(positions, rows, strict=True) if getattr(row, side)]
        ys = [getattr(row, side) for row in rows if getattr(row, side)]
        bars = ax.bar(xs, ys, width=width, color=color, label=label)
        ax.bar_label(bars, labels=[short_number(y) for y in ys], fontsize=8, padding=2)
    values = [v for row in rows for v in (row.ours, row.torch) if v]
    if values and max(values) / min(values) > 20:
        ax.set_yscale("log")
        ax.set_ylim(min(values) / 2, max(values) * 3)
        scale = "log scale"
    else:
        ax.set_ylim(0, max(values, default=1) * 1.15)
        scale = "linear scale"
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: short_number(y) if y else "0"))
    ax.set_xticks(list(positions))
    ax.set_xticklabels([tick_label(row.name) for row in rows], fontsize=9)
    ax.set_ylabel(f"operations per second, {scale}")
    fig.suptitle("Store: operations per second (higher is better)", fontsize=12)
    ax.set_title(machine_caption(run), fontsize=8, color="#555555")
    ax.legend(loc="upper left", fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.25)
    ax.grid(False, axis="x")
    caption = "set sends without waiting for a reply (torch's SET has none), hence its rate."
    fig.text(0.01, -0.01, caption, fontsize=8, color="#555555", ha="left", va="top")
    save(fig, path)
    plt.close(fig)
    pairs = [
        f"{row.name}: ours {number(row.ours)}, PyTorch {number(row.torch)}"
        for row in rows
        if row.ours or row.torch
    ]
    return "Grouped bars of store operations per second, ours and PyTorch: " + "; ".join(pairs)


def plot_matrix(run: Run, path: Path) -> str:
    """The client x server matrix of ``run`` at ``path``: bars per workload; its alt text."""
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    view = MatrixView(run.data["matrix"])
    pairs = view.pairs
    jobs = view.workloads
    servers = [side["name"] for side in view.result["servers"]]
    fig, ax = plt.subplots(figsize=(10, 5.4))
    width = 0.8 / len(pairs)
    families = {"torch": "Reds", "ours": "Blues"}  # a colour family per client, a shade per server
    for index, pair in enumerate(pairs):
        shades = plt.get_cmap(families.get(pair[0], "Greens"))
        color = shades(0.45 + 0.5 * servers.index(pair[1]) / max(len(servers) - 1, 1))
        ys = [view.value(job["name"], pair, "rate") or 0.0 for job in jobs]
        xs = [j + (index - (len(pairs) - 1) / 2) * width for j in range(len(jobs))]
        bars = ax.bar(xs, ys, width=width, color=color, label=view.label(pair))
        ax.bar_label(bars, labels=[short_number(y) for y in ys], fontsize=6, padding=1)
    ax.set_xticks(list(range(len(jobs))))
    ax.set_xticklabels([job["label"] for job in jobs], fontsize=9)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: short_number(y) if y else "0"))
    ax.set_ylabel("calls per second (median of the repetitions)")
    fig.suptitle("Store: every client against every server (higher is better)", fontsize=12)
    ax.set_title(machine_caption(run), fontsize=8, color="#555555")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, fontsize=8)
    ax.grid(True, axis="y", alpha=0.25)
    ax.grid(False, axis="x")
    save(fig, path)
    plt.close(fig)
    parts = []
    for job in jobs:
        shown = ", ".join(
            f"{view.label(pair)} {number(view.value(job['name'], pair, 'rate'))}" for pair in pairs
        )
        parts.append(f"{job['label']}: {shown}")
    return "Grouped bars of calls per second, every client against every server; " + "; ".join(
        parts
    )


def matrix_section(run: Run) -> str:
    """The matrix tables of ``run`` (rates, server CPU, client CPU) and how they were made."""
    matrix = run.data["matrix"]
    out = [
        "### Every client against every server\n",
        f"![{{alt}}]({MATRIX_PNG})\n",
        "Each server runs alone in its own process: PyTorch's libuv master, and ours "
        "(`python -m tp_store`) on asyncio's loop and on uvloop. PyTorch's C++ client costs "
        "the server's side little, so its columns show the servers' speed. Clients are "
        "worker processes started once, each keeping a connection to every server; the "
        f"aggregate runs {matrix['workloads'][-1].get('processes', 'many')} client processes at "
        "once on one counter. "
        f"Each of the {matrix['repetitions']} repetitions measures every cell once "
        f"({matrix['seconds']:g} s for one client, {matrix['aggregate_seconds']:g} s for the "
        "aggregate), in an order rotated between repetitions; the tables show medians, with "
        "the ratio to PyTorch's client against PyTorch's server in parentheses. A `get` of "
        "PyTorch's client, and of ours against PyTorch's server, is two requests (WAIT, "
        "then GET); ours against ours is one (WAIT_GET).\n",
    ]
    for value, title in (
        ("rate", "Calls per second, median of the repetitions (higher is better)"),
        (
            "best_rate",
            "Calls per second, best repetition: on a loaded machine the rate of a repetition "
            "is high or low with what else runs, so the best is closest to what the code can do",
        ),
        ("server_cpu_us", "Server CPU microseconds per call, all its threads (lower is better)"),
        ("client_cpu_us", "Client CPU microseconds per call, all its processes (lower is better)"),
    ):
        header, rows = matrix_table(matrix, value)
        out.append(f"{title}:\n")
        out.append(
            markdown_table(
                [escape(h) for h in header],
                [[escape(c) for c in row] for row in rows],
                "l" + "r" * (len(header) - 1),
            )
            + "\n"
        )
    loads = matrix.get("load_average_per_repetition") or []
    if loads:
        shown = ", ".join("/".join(f"{v:g}" for v in load) for load in loads if load)
        out.append(f"Load average (1/5/15 min) at each repetition: {shown}.\n")
    return "\n".join(out)


def tick_label(name: str) -> str:
    """A metric name on two lines: the operation, then how many clients."""
    return name.replace(" (", "\n(")


# -- the page ----------------------------------------------------------------------------


def slower_rows(runs: Iterable[Run]) -> list[Metric]:
    """Rows where ours is measurably worse than torch."""
    found = []
    for run in runs:
        for row in run.rows:
            ratio = row.ratio
            if ratio is None:
                continue
            factor = ratio if row.better == "higher" else 1 / ratio
            if factor <= 1 / EVEN:
                found.append(row)
    return found


def page(store: Run | None, rdzv: Run | None, recovery: RecoveryRuns, alts: dict[str, str]) -> str:
    """The Markdown of docs/benchmarks/index.md."""
    out: list[str] = []
    add = out.append
    add(
        "<!-- Generated by benchmarks/report.py (run by `nox -s bench`): edit that script, "
        "not this file. -->\n"
    )
    add("# Benchmarks\n")
    add(
        "tensorplay-rendezvous against PyTorch 2.13, measured side by side in one run on one "
        "machine: the store (`tp_store.TCPStore` against `torch.distributed.TCPStore`) and the "
        "dynamic rendezvous (`tp_rdzv_dynamic` against torch's "
        "`dynamic_rendezvous` with the c10d backend).\n"
    )
    add(
        '!!! info "Generated page"\n'
        "    `nox -s bench` runs both benchmarks, writes their results as JSON to\n"
        "    `benchmarks/results/` and then writes this page and its plots with\n"
        "    `benchmarks/report.py`. `python benchmarks/report.py` alone regenerates the page\n"
        "    from the JSON that is there. Every number below comes from the runs named in\n"
        "    [The machine](#the-machine).\n"
    )
    runs = [(title, run) for title, run in (("store run", store), ("rendezvous run", rdzv)) if run]
    bad = slower_rows(run for _, run in runs)
    if bad:
        names = ", ".join(f"`{row.name}` ({verdict(row).strip('*')})" for row in bad)
        add(
            '!!! warning "Where ours is slower"\n'
            f"    In these runs ours is measurably worse than PyTorch on: {escape(names)}.\n"
            "    They are marked in bold in the tables. Each is a single measurement on a\n"
            "    small, possibly shared machine: see [how to read](#how-to-read-these-numbers).\n"
        )

    add("## Rendezvous: the first round against the node count\n")
    if rdzv is None:
        add("Not run yet: `python benchmarks/rdzv_bench.py` writes its results.\n")
    else:
        add(f"![{escape(alts[RDZV_PNG])}]({RDZV_PNG})\n")
        add(
            "N nodes (threads of the bench process, each with its own handler and store "
            "connection) are released at once with `min_nodes = max_nodes = N`; the time is "
            "from the release until the last `next_rendezvous()` returns, and every round is "
            "checked (ranks 0..N-1 once each, world size N). The etcd rows run ours on "
            "`tp_rdzv_etcd.EtcdStore` against a one-member etcd the bench starts; PyTorch has "
            "no counterpart there (its etcd backends need etcd's v2 API). The kill row: 8 node "
            "processes, two killed with SIGKILL after the first round, time until the 6 "
            "survivors have their new ranks.\n"
        )
        add(results_table(rdzv) + "\n")
        add(f"Configuration: {escape(config_line(rdzv))}.\n")
        add(notes_block(rdzv))

    if rdzv is not None and rdzv.data.get("spread"):
        add("## Rendezvous spread over processes, the server alone\n")
        add(f"![{escape(alts[SPREAD_PNG])}]({SPREAD_PNG})\n")
        add(
            "N nodes over P processes of N/P node threads, each node with its own handler and "
            "store connection; the store server alone in a process of its own (ours: "
            "`python -m tp_store`; PyTorch: a libuv master); `min_nodes = max_nodes = N`; one "
            "start signal. Every node's time from it to its return is in the histogram; CPU "
            "seconds are the server process's and all node processes' over the round. With "
            "SIGKILL K, K more nodes run in processes of their own and are killed after the "
            "first round; the survivors' new round is timed from the kill.\n"
        )
        add(spread_table(rdzv) + "\n")

    scale_section = scale_report.section(scale_report.load(), alts)
    if scale_section:
        add(scale_section)

    recovery_section = recovery_report.section(recovery, alts)
    if recovery_section:
        add(recovery_section)
    bootstrap_section = bootstrap_report.section(alts)
    if bootstrap_section:
        add(bootstrap_section)

    etcd_section = etcd_report.section(alts.get(etcd_report.PNG, ""))
    if etcd_section:
        add(etcd_section)

    add("## Store: operations per second, storms and memory\n")
    if store is None:
        add("Not run yet: `python benchmarks/store_bench.py` writes its results.\n")
    else:
        if "matrix" in store.data:
            add(matrix_section(store).replace("{alt}", escape(alts[MATRIX_PNG])))
        if store.rows:
            if "matrix" in store.data:
                add("### Single operations, many processes, storms and memory\n")
            add(f"![{escape(alts[STORE_PNG])}]({STORE_PNG})\n")
            add(
                "Both clients talk to a server running alone in another process (ours: "
                "`python -m tp_store`, on uvloop when installed; PyTorch: a libuv master). "
                "Single-client rates are the best of several one-second rounds with the operations "
                "interleaved; `add (N processes)` is the aggregate rate of N client processes on "
                "one counter; a storm is N clients connecting, adding and waiting for the last; "
                "RSS is the server's with 1000 idle connections.\n"
            )
            add(results_table(store) + "\n")
            add(f"Configuration: {escape(config_line(store))}.\n")
            add(notes_block(store))

    add("## The machine\n")
    if runs:
        add(machine_table(runs) + "\n")
    else:
        add("No results yet: run `nox -s bench`.\n")

    add("## How to read these numbers\n")
    add(
        "- **Ratios** are ours / PyTorch as measured; whether that is good depends on the row: "
        "for times (s) and memory (MiB) below 1 is better, for rates (ops/s) above 1 is. "
        '"In words" says it plainly; rows where ours is worse are in bold.\n'
        "- **One run, one small machine.** Each row is a single measurement on the host named "
        "above, often a shared 2-vCPU machine with other work on it (see the load averages): "
        "absolute numbers are noisy, and from run to run a single-client store rate can move "
        "by a factor of two or more, for both sides alike. Both benches measure ours and "
        "PyTorch back to back for each row, and the single-client store rates interleave the "
        "two within each of their rounds, so the ratios are fairer than the absolute numbers.\n"
        "- **PyTorch's first round** includes its deliberate random delay of up to 0.3 s before "
        "a node's first join, and its cost grows faster than linearly with the node count (every "
        "node polls and compare-and-sets one shared state, and names each event with "
        "`inspect.stack()`); that is why the larger sizes are ours only, and why a PyTorch "
        "round above 64 nodes can take from seconds to minutes on this kind of host.\n"
        "- **Threads share one GIL.** All nodes of a first round are threads of one process; "
        "PyTorch's store server runs in C++ threads, ours in a Python thread that competes with "
        "the node threads.\n"
        "- **etcd rows** measure a one-member etcd with its data on disk, where every store "
        "operation is an HTTP request and a raft commit: compare them with ours on the embedded "
        "store, not with PyTorch.\n"
        "- **The kill scenario** uses a keep-alive interval of 1 s with 2 missed beats allowed "
        "and a last-call window of 0.5 s for ours; PyTorch reads its timeouts in whole seconds, "
        "so it runs with a 1 s last call.\n"
        "- **Store `set`** does not wait for a reply (PyTorch's SET has none), so its rate is "
        "the cost of the call; `set+get` is a confirmed write.\n"
        "- **PyTorch's connection storms** are slow in a container without DNS: its server does "
        "a reverse DNS lookup on its accept path.\n"
    )
    add(
        "The benchmark scripts and their flags are described in `benchmarks/README.md` in the "
        "repository, which also keeps the results of earlier runs (with other sizes, such as "
        "4000-node rounds).\n"
    )
    return "\n".join(out)


def write_report(store_path: Path, rdzv_path: Path, out_dir: Path) -> list[Path]:
    """Write the page and the plots of the runs stored at the two paths; return what was written."""
    store = load_run(store_path)
    rdzv = load_run(rdzv_path)
    recovery = RecoveryRuns.load()
    out_dir.mkdir(parents=True, exist_ok=True)
    alts, written = recovery_report.write_plots(recovery, out_dir)
    bootstrap_alts, bootstrap_plots = bootstrap_report.write_plots(out_dir)
    alts |= bootstrap_alts
    written += bootstrap_plots
    alts[etcd_report.PNG], etcd_plots = etcd_report.write_plot(out_dir)
    written += etcd_plots
    scale = scale_report.load()
    if scale is not None:
        alts[scale_report.SCALE_PNG] = scale_report.plot(scale, out_dir / scale_report.SCALE_PNG)
        written.append(out_dir / scale_report.SCALE_PNG)
    if rdzv is not None:
        alts[RDZV_PNG] = plot_rendezvous(rdzv, out_dir / RDZV_PNG)
        written.append(out_dir / RDZV_PNG)
        if rdzv.data.get("spread"):
            alts[SPREAD_PNG] = plot_spread(rdzv, out_dir / SPREAD_PNG)
            written.append(out_dir / SPREAD_PNG)
    if store is not None:
        if store.rows:
            alts[STORE_PNG] = plot_store(store, out_dir / STORE_PNG)
            written.append(out_dir / STORE_PNG)
        if "matrix" in store.data:
            alts[MATRIX_PNG] = plot_matrix(store, out_dir / MATRIX_PNG)
            written.append(out_dir / MATRIX_PNG)
    (out_dir / PAGE).write_text(page(store, rdzv, recovery, alts))
    written.append(out_dir / PAGE)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, default=STORE_JSON, help="store_bench.py's JSON")
    parser.add_argument("--rdzv", type=Path, default=RDZV_JSON, help="rdzv_bench.py's JSON")
    parser.add_argument(
        "--out-dir", type=Path, default=OUT_DIR, help="where the page and its plots go"
    )
    args = parser.parse_args(argv)
    try:
        written = write_report(args.store, args.rdzv, args.out_dir)
    except ImportError as exc:
        print(f"report.py needs matplotlib ({exc}); nox -s bench installs it", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
