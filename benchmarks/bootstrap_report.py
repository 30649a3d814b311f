"""The bootstrap store's section of the benchmark report (issue 28).

From ``results/storm_bench.json`` (``storm_bench.py``: torch's clients storming
the workers' bootstrap store, ours in its child process against torch's libuv
server) and ``results/bootstrap_probes.json`` (``bootstrap_probes.py``: a PING
flood and a client storing all it can, against the agent), with the plot
``bootstrap-storm.png``. Empty when neither ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from report_parts import (
    MYPYC_COLOR,
    OURS_COLOR,
    TORCH_COLOR,
    escape,
    markdown_table,
    pyplot,
    save,
)

HERE = Path(__file__).resolve().parent
STORM_JSON = HERE / "results" / "storm_bench.json"
PROBES_JSON = HERE / "results" / "bootstrap_probes.json"
STORM_PNG = "bootstrap-storm.png"


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _machine(document: dict[str, Any]) -> str:
    host = document["host"]
    start = host.get("load_average_at_start") or ["?"]
    end = host.get("load_average_at_end") or ["?"]
    return (
        f"{document['date']}, {host['cpus']} CPUs ({host['cpu_model']}), load {start[0]} at "
        f"the start and {end[0]} at the end, commit {document['versions'].get('commit', '?')}"
    )


def _cpu(side: dict[str, Any]) -> str:
    """A server's CPU time, with its user part when the run recorded it."""
    if "server_user" in side:
        return f"{side['server_cpu']:.2f} (user {side['server_user']:.2f})"
    return f"{side['server_cpu']:.2f}"


def _against_torch(side: dict[str, Any], trials: int) -> str:
    """CPU over torch's (of the medians), and in how many trials it was at most torch's."""
    return (
        f"x{side['ratio_cpu']:.2f} (at most torch's in {side['trials_cpu_at_most_torch']} "
        f"of {trials})"
    )


def _trials(size: dict[str, Any]) -> int:
    return sum(1 for trial in size["trials"] if trial["server"] == "torch")


def storm_table(storm: dict[str, Any]) -> str:
    floor = any("floor" in size for size in storm["sizes"])
    mypyc = any("ours-mypyc" in size for size in storm["sizes"])
    rows = []
    for size in storm["sizes"]:
        ours, torch = size["ours"], size["torch"]
        loads = [trial["load"] for trial in size["trials"]]
        row = [
            f"{size['workers']:,} / {size['processes']}",
            f"{ours['seconds']:.2f} s",
            f"{torch['seconds']:.2f} s",
            f"x{size['ratio_seconds']:.2f}",
            f"{ours['connect_phase']:.2f} / {torch['connect_phase']:.2f} s",
            f"{_cpu(ours)} / {_cpu(torch)} s",
            _against_torch(ours, _trials(size)),
        ]
        if mypyc:
            side = size.get("ours-mypyc")
            row.append(
                f"{side['seconds']:.2f} s, CPU {_cpu(side)} s, "
                f"{_against_torch(side, _trials(size))}"
                if side
                else ""
            )
        if floor:
            side = size.get("floor")
            row.append(
                f"{side['seconds']:.2f} s, CPU {_cpu(side)} s, "
                f"{_against_torch(side, _trials(size))}"
                if side
                else ""
            )
        row += [f"{ours['stalls']} / {torch['stalls']}", f"{min(loads):.0f}-{max(loads):.0f}"]
        rows.append(row)
    header = [
        "workers / processes",
        "ours",
        "torch",
        "ours/torch",
        "connect phase ours / torch",
        "server CPU ours / torch",
        "CPU ours/torch",
        *(["ours, mypyc build (CPU over torch's)"] if mypyc else []),
        *(["floor (least a Python server on uvloop does)"] if floor else []),
        "DNS stalls ours / torch",
        "load",
    ]
    return markdown_table(header, rows, "l" + "r" * (len(header) - 1))


def syscalls_table(storm: dict[str, Any]) -> str:
    """System calls per worker by server (``--syscalls``); empty when not counted."""
    counted = [size for size in storm["sizes"] if "syscalls_per_worker" in size]
    if not counted:
        return ""
    size = counted[-1]
    by_server = size["syscalls_per_worker"]
    names = list(by_server)
    calls = sorted(
        {call for counts in by_server.values() for call, per in counts.items() if per >= 0.05},
        # Ties by name: the report is the same from one run of report.py to the next.
        key=lambda call: (-max(counts.get(call, 0.0) for counts in by_server.values()), call),
    )
    rows = [
        [f"`{call}`", *(f"{by_server[name].get(call, 0.0):.2f}" for name in names)]
        for call in calls
    ]
    rows.append(
        ["all", *(f"{sum(by_server[name].values()):.1f}" for name in names)],
    )
    header = [f"per worker ({size['workers']:,} / {size['processes']})", *names]
    return markdown_table(header, rows, "l" + "r" * len(names))


def probes_table(probes: dict[str, Any]) -> str:
    rows = []
    for placement, title in (("child", "its own process (now)"), ("in-process", "the agent's")):
        result = probes["results"][placement]
        flood, fill = result["ping_flood"], result["store_all"]
        rows.append(
            [
                title,
                f"{flood['quiet']['median_ms']:.1f} / {flood['quiet']['max_ms']:.1f} ms",
                f"{flood['flooded']['median_ms']:.1f} / {flood['flooded']['p99_ms']:.1f} / "
                f"{flood['flooded']['max_ms']:.1f} ms",
                f"{fill['stored_values']}",
                f"{fill['agent_rss_growth_mib']:.0f} MiB",
                "yes" if fill["workers_error"] is None else f"no: {escape(fill['workers_error'])}",
            ]
        )
    header = [
        "the store in",
        "50 ms timer late, quiet: median / max",
        "flooded: median / p99 / max",
        "8 MiB values stored",
        "agent's RSS growth",
        "workers initialise after",
    ]
    return markdown_table(header, rows, "lrrrrl")


def plot_storm(storm: dict[str, Any], path: Path) -> str:
    """Bars of the storm's time and server CPU, ours next to torch, per size."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    labels = [f"{s['workers']:,}/{s['processes']}" for s in storm["sizes"]]
    places = range(len(labels))
    if all("ours-mypyc" in size for size in storm["sizes"]):
        width = 0.27
        bars = [
            (-width, "ours", OURS_COLOR),
            (0, "ours-mypyc", MYPYC_COLOR),
            (width, "torch", TORCH_COLOR),
        ]
    else:
        width = 0.4
        bars = [(-0.2, "ours", OURS_COLOR), (0.2, "torch", TORCH_COLOR)]
    for axis, key, title in (
        (left, "seconds", "time to the last worker done (s)"),
        (right, "server_cpu", "server CPU time (s)"),
    ):
        for offset, side, color in bars:
            values = [s[side][key] for s in storm["sizes"]]
            axis.bar([p + offset for p in places], values, width, label=side, color=color)
        axis.set_xticks(list(places), labels)
        axis.set_xlabel("workers / client processes")
        axis.set_title(title)
    left.legend()
    save(fig, path)
    plt.close(fig)
    return (
        "Bar charts of the bootstrap store's connect storm: time to the last worker done and "
        "the server process's CPU time, ours in its child process (and from tp-store's mypyc "
        "build, where run) against torch's libuv server, for each number of workers"
    )


def section(alts: dict[str, str]) -> str:
    """The Markdown of the section (empty when neither benchmark ran)."""
    storm, probes = _load(STORM_JSON), _load(PROBES_JSON)
    if storm is None and probes is None:
        return ""
    out = ["## The workers' bootstrap store: storms and hostile clients\n"]
    add = out.append
    if storm is not None:
        add(f"![{escape(alts[STORM_PNG])}]({STORM_PNG})\n")
        add(
            "When a round completes every worker of the job connects to the round's bootstrap "
            "store at once. N of torch's C++ clients (threads, each its own connection) over P "
            "processes connect, `add` a counter, and `get` a key the last one sets (NCCL's "
            "unique id); ours runs as deployed, in the agent's child process "
            "(`BootstrapProcess`), torch's libuv server alone in a process; trials alternate, "
            "medians shown. Server CPU is the server process's (`/proc/<pid>/stat`, 10 ms "
            "ticks). A DNS stall is a connect over 4 s: torch looks up the peer's name on "
            "connect and accept, and this machine's resolver drops such lookups; the bench "
            "gives its client processes and torch's server `::ffff:127.0.0.1` in a private "
            f"`/etc/hosts` ({'done' if storm.get('private_hosts') else 'not done'} in this run). "
            "`python benchmarks/storm_bench.py`.\n"
        )
        if any("ours-mypyc" in size for size in storm["sizes"]):
            add(
                "The column *ours, mypyc build* (`--compiled DIR`) is the same child importing "
                "tp-store's optional compiled build (its README), in the same trials; the wheel "
                "we publish is pure Python.\n"
            )
        if any("floor" in size for size in storm["sizes"]):
            add(
                "The floor (`--floor`, `storm_floor_server.py`) is the least a Python server "
                "on uvloop can do for the storm: the five requests of a worker answered as they "
                "arrive, nothing checked, counted or bounded; its CPU is what uvloop and the "
                "kernel cost per worker.\n"
            )
        add(storm_table(storm) + "\n")
        add(f"Run: {escape(_machine(storm))}.\n")
        syscalls = syscalls_table(storm)
        if syscalls:
            add(
                "System calls each server makes per worker in one storm (`strace -c -f` on "
                "the server process, `--syscalls`): the same socket calls; torch's adds the "
                "reads of `/etc/hosts` for its lookup of each peer's name, ours and the floor "
                "uvloop's `getsockname`. What ours costs above the floor is its own Python.\n"
            )
            add(syscalls + "\n")
    if probes is not None:
        settings = probes["settings"]
        add(
            f"Against the agent (`python benchmarks/bootstrap_probes.py`): {settings['floods']} "
            f"connections pipeline PINGs at the bootstrap port for {settings['seconds']:g} s "
            "while a thread of the agent sleeps 50 ms in a loop (how late it wakes); then a "
            f"client stores 8 MiB values (at most {settings['fill_values']}, reconnecting when "
            f"dropped) and {settings['workers']} workers do a process group's store handshake. "
            "The store in its own process, as now, and in the agent's interpreter, as "
            "before.\n"
        )
        add(probes_table(probes) + "\n")
        add(f"Run: {escape(_machine(probes))}.\n")
    return "\n".join(out)


def write_plots(out_dir: Path) -> tuple[dict[str, str], list[Path]]:
    """The section's plot in ``out_dir``: its alt text by file name, and its path."""
    storm = _load(STORM_JSON)
    if storm is None:
        return {}, []
    path = out_dir / STORM_PNG
    return {STORM_PNG: plot_storm(storm, path)}, [path]
