"""The report's recovery section: a node's death under torchrun, the kill cases, an idle job.

Reads three results files, each written by one command (``benchmarks/README.md``):

- ``restart_bench.json`` (``restart_bench.py``): torchrun restarts, medians of
  detection, new workers' start and first training step, ours and torch;
- ``rdzv_recovery.json`` (``rdzv_bench.py --recovery``): SIGKILL 100 of 1000
  spread nodes, and kill -9 2 of 8 side by side with torch;
- ``idle_bench.json`` (``idle_bench.py``): the store's CPU per second while an
  idle job of 1000 nodes waits, on our store and on etcd.

The same three files under ``results/issue25-baseline/`` hold the measurements
of the code before issue 25 (main), against which the section's targets table
sets today's. It draws ``recovery-restart.png``: the restart phases, ours and
torch, each run a dot.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from report_parts import (
    OURS_COLOR,
    TORCH_COLOR,
    Run,
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
)

RESULTS = Path(__file__).resolve().parent / "results"
RESTART_JSON = "restart_bench.json"
RECOVERY_JSON = "rdzv_recovery.json"
IDLE_JSON = "idle_bench.json"
BASELINE_DIR = RESULTS / "issue25-baseline"
RESTART_PNG = "recovery-restart.png"
BASELINE_COLOR = "#9ecae1"

#: The restart phases, as restart_bench.py's rows end and as the plot names them.
PHASES = {
    "until the survivor logs the removal (detection)": "detection",
    "until its new workers start": "new workers start",
    "until the survivor's first step": "first training step",
}
#: What a profile of the idle store showed (a measurement of its own, so dated here).
IDLE_PROFILE = (
    "Where the idle store's CPU goes (py-spy at 500 Hz on the server for 15 s of the "
    "keep-alive window, 2026-12-04, the same 2-core machine, load about 1): with sessions the "
    "store serves nothing but the nodes' pings (200 a second, one per node per keep-alive "
    "interval; no counter writes, no scans), and each costs a wake-up: 42% of the samples are "
    "in the event loop itself (epoll and uvloop's reads), 26% in the reply's write, 5% in the "
    "server's periodic sweep of its 2000 connections, and the Python that decodes and answers a "
    "ping is the remaining quarter. A cheaper ping cannot reach a quarter of the baseline; only "
    "fewer wake-ups can (a node pings once per keep-alive interval, its documented period).\n"
)
#: The idle figures of the code before issue 25, as the issue quotes them (ms of CPU per second).
ISSUE_IDLE_MS = {"our store": 26.7, "etcd": 629.0}


@dataclass
class RecoveryRuns:
    """The section's runs: today's and the baseline's of each benchmark (None if not run)."""

    restart: Run | None
    kill: Run | None
    idle: Run | None
    base_restart: Run | None
    base_kill: Run | None
    base_idle: Run | None

    @classmethod
    def load(cls, results: Path = RESULTS, baseline: Path = BASELINE_DIR) -> RecoveryRuns:
        return cls(
            *(load_run(results / name) for name in (RESTART_JSON, RECOVERY_JSON, IDLE_JSON)),
            *(load_run(baseline / name) for name in (RESTART_JSON, RECOVERY_JSON, IDLE_JSON)),
        )

    def titled(self) -> list[tuple[str, Run]]:
        """Every run, titled for the machine table; a baseline run that is today's too once."""
        found = [("restart", self.restart), ("kill", self.kill), ("idle", self.idle)]
        found += [
            (f"{title}, baseline", base)
            for title, base, now in (
                ("restart", self.base_restart, self.restart),
                ("kill", self.base_kill, self.kill),
                ("idle", self.base_idle, self.idle),
            )
            if now is None or base is None or base.data != now.data
        ]
        return [(title, run) for title, run in found if run is not None]


# -- targets (issue 25) ---------------------------------------------------------------------


def _value(run: Run | None, name: str, side: str = "ours") -> float | None:
    row = run.row(name) if run is not None else None
    return None if row is None else getattr(row, side)


def _ratio(run: Run | None, name: str) -> float | None:
    row = run.row(name) if run is not None else None
    return None if row is None else row.ratio


def _verdict(now: float | None, bound: float) -> str:
    if now is None:
        return "not measured"
    return "**met**" if now <= bound else "not met"


def _named(run: Run | None, pattern: str) -> str:
    """The name of ``run``'s first row matching ``pattern`` ('' if none)."""
    rows = [] if run is None else run.rows
    return next((row.name for row in rows if re.fullmatch(pattern, row.name)), "")


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _first_restarts(run: Run | None) -> tuple[int, int]:
    """How many of ours' restart runs resumed at the first restart, of how many."""
    ours = [] if run is None else [r for r in run.data.get("runs", []) if r["impl"] == "ours"]
    return sum(1 for r in ours if r.get("restart") == 1), len(ours)


def _way(run: dict[str, object]) -> str:
    """Which node a restart run killed (runs before the steward's way name a group rank)."""
    return str(run.get("way") or f"group rank {run['killed_group_rank']}")


def _ways(*found: Run | None) -> list[str]:
    """The ways of the restart runs in ``found``, in the order they ran."""
    ways = [_way(r) for run in found if run is not None for r in run.data.get("runs", [])]
    return list(dict.fromkeys(ways))


def targets_table(runs: RecoveryRuns) -> str:
    """Each target of issue 25, the baseline's figure, today's and whether it is met."""
    rows: list[list[str]] = []
    for way in _ways(runs.restart, runs.base_restart):
        for phase, bound in (
            ("until its new workers start", 0.6),
            ("until the survivor's first step", 0.85),
        ):
            name = f"kill {way}: {phase}"
            now = _ratio(runs.restart, name)
            rows.append(
                [
                    f"torchrun, {way} killed: kill -> {PHASES[phase]}, ours / torch",
                    f"<= {bound}x",
                    _times(_ratio(runs.base_restart, name)),
                    _times(now),
                    _verdict(now, bound),
                ]
            )
    (base_first, base_all), (first, total) = map(_first_restarts, (runs.base_restart, runs.restart))
    rows.append(
        [
            "torchrun: ours resumes at the first restart",
            "every run",
            f"{base_first} of {base_all}" if base_all else "—",
            f"{first} of {total}" if total else "—",
            _verdict(None if not total else total - first, 0),
        ]
    )
    kill_run = runs.kill or runs.base_kill
    spread = _named(kill_run, r"spread \d+ nodes / \d+ processes, SIGKILL \d+")
    if kill_run is not None and spread:
        last_call = kill_run.data["config"]["kill"]["config"]["last_call_timeout"]
        now = _value(runs.kill, spread)
        rows.append(
            [
                f"{spread}: survivors' new round (s)",
                f"<= last call + 0.3 = {last_call + 0.3:g}",
                number(_value(runs.base_kill, spread)),
                number(now),
                _verdict(now, last_call + 0.3),
            ]
        )
    kill = "kill -9 2 of 8, re-rendezvous"
    now = _ratio(runs.kill, kill)
    rows.append(
        [
            f"{kill}, ours / torch",
            "<= 0.45x",
            _times(_ratio(runs.base_kill, kill)),
            _times(now),
            _verdict(now, 0.45),
        ]
    )
    for where, factor in (("our store", 4), ("etcd", 20)):
        name = _named(runs.idle or runs.base_idle, rf"idle .*, keep-alive: {where}'s CPU")
        base = _value(runs.base_idle, name) if name else None
        # Without a baseline run, the figure the issue quotes for the code before it.
        reference = base if base is not None else ISSUE_IDLE_MS[where]
        now = _value(runs.idle, name) if name else None
        rows.append(
            [
                f"idle job of 1000 nodes, {where}'s CPU (ms/s)",
                f"<= baseline / {factor} = {number(reference / factor)}",
                number(base),
                number(now),
                _verdict(now, reference / factor),
            ]
        )
    header = ["target", "bound", "baseline (before issue 25)", "now", ""]
    return markdown_table(header, rows, "llrrl")


# -- the plot ----------------------------------------------------------------------------


def _restart_runs(run: Run, impl: str, way: str, field: str) -> list[tuple[float, bool]]:
    """The ``field`` of each run of ``impl`` that killed ``way``'s node, and whether the
    dead node held the steward lease (ours)."""
    return [
        (r[field], bool(r.get("victim_was_steward")))
        for r in run.data.get("runs", [])
        if r.get("impl") == impl and _way(r) == way and r.get(field)
    ]


def plot_restart(runs: RecoveryRuns, path: Path) -> str:
    """The restart phases of the restart run (and the baseline's ours); returns the alt text."""
    assert runs.restart is not None
    plt = pyplot()
    fields = {"detection": "detected", "new workers start": "workers_started"}
    fields["first training step"] = "seconds"
    sides = [("ours", runs.restart, OURS_COLOR, "ours")]
    if runs.base_restart is not None and runs.base_restart.data != runs.restart.data:
        commit = runs.base_restart.data.get("versions", {}).get("commit", "")
        sides.append(("ours", runs.base_restart, BASELINE_COLOR, f"ours before ({commit})"))
    sides.append(("torch", runs.restart, TORCH_COLOR, "PyTorch c10d"))
    ways = _ways(runs.restart)
    bars = [(way, phase, field) for way in ways for phase, field in fields.items()]
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.45 * len(bars)))
    height = 0.8 / len(sides)
    medians = []
    for index, (impl, run, color, label) in enumerate(sides):
        shown: str | None = label  # on the first bar drawn of each side
        for position, (way, phase, field) in enumerate(bars):
            found = _restart_runs(run, impl, way, field)
            if not found:
                continue
            y = position + (index - (len(sides) - 1) / 2) * height
            median = statistics.median(value for value, _ in found)
            medians.append(f"{label}, {way} killed, {phase}: {median:.2f} s")
            ax.barh(y, median, height=height, color=color, label=shown)
            shown = None
            for steward, marker in ((False, "k."), (True, "kx")):
                values = [value for value, was in found if was == steward]
                ax.plot(values, [y] * len(values), marker, markersize=4)
            rightmost = max(median, *(value for value, _ in found))
            ax.text(rightmost, y, f"  {median:.2f}", va="center", fontsize=7)
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([f"{way} killed:\n{phase}" for way, phase, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the SIGKILL (bars: medians; dots: runs, x: the steward's node)")
    fig.suptitle("torchrun, one of two nodes killed: when the survivor goes on", fontsize=12)
    ax.set_title(machine_caption(runs.restart), fontsize=8, color="#555555")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, axis="x", alpha=0.25)
    ax.grid(False, axis="y")
    save(fig, path)
    plt.close(fig)
    return "Horizontal bars of the restart phases' medians: " + "; ".join(medians)


# -- the section ---------------------------------------------------------------------------


def idle_table(run: Run) -> str:
    """Each store and phase of the idle run: store CPU, node CPU, requests per second."""
    rows = []
    for store, result in run.data.get("runs", {}).items():
        for phase, window in result.get("windows", {}).items():
            rows.append(
                [
                    store,
                    phase,
                    number(window["server_ms_per_s"]),
                    number(window["nodes_ms_per_s"]),
                    number(window["requests_per_s"]),
                    " / ".join(f"{v:g}" for v in window.get("load") or []),
                ]
            )
    header = [
        "store",
        "phase",
        "store CPU (ms/s)",
        "node processes' CPU (ms/s)",
        "requests/s",
        "load",
    ]
    return markdown_table(header, rows, "llrrrl")


def section(runs: RecoveryRuns, alts: dict[str, str]) -> str:
    """The Markdown of the recovery section (empty when none of its benchmarks ran)."""
    if not (runs.restart or runs.kill or runs.idle):
        return ""
    out = ["## Recovery: a node's death, and an idle job's cost\n"]
    add = out.append
    add(
        "How fast the survivors know of a dead node and go on (issue 25), and what an idle "
        "job costs its store. *Detection* is the time from the SIGKILL until the steward's log "
        "record of the dead node's removal (ours: the `node_dead` or `node_gone` event; "
        "PyTorch: the moment a node's state sync drops it for an expired heartbeat, where it "
        "logs `Detected dead node`; a PyTorch run without one had dropped the node before "
        "the kill, see `benchmarks/README.md`). The baseline is the code before issue 25 (main), "
        "measured in the same session; its commit is in the machine table.\n"
    )
    add("### Targets\n")
    add(targets_table(runs) + "\n")
    if runs.restart is not None:
        add("### torchrun: one of two nodes killed\n")
        add(f"![{escape(alts[RESTART_PNG])}]({RESTART_PNG})\n")
        conf = runs.restart.data.get("config", {}).get("rdzv_conf", "")
        add(
            "Two `torchrun --nnodes=1:2 --nproc-per-node=2` agents on one `tp-rdzv store` "
            f"(`--rdzv-conf={escape(conf)}`) train a small DDP model; one node (agent and "
            "workers) gets SIGKILL: the node of group rank 0, of group rank 1, or the one whose "
            "agent holds our steward lease (PyTorch has no steward: group rank 0 again). Medians "
            "over the runs, ours and PyTorch alternating; the notes list every run and, for "
            "ours, whether the dead node held the steward lease (marked x in the plot).\n"
        )
        add(results_table(runs.restart) + "\n")
        add(notes_block(runs.restart))
    if runs.kill is not None:
        add("### SIGKILL in a spread job, and kill -9 2 of 8\n")
        add(
            "The spread case: 1000 nodes over 8 processes and 100 more in processes of their "
            "own, killed after the first round (keep-alive 1 s, 2 attempts, last call 0.5 s); "
            "detection runs until the removal of the last victim, recovery until the last "
            "survivor's new round. kill -9 2 of 8: 8 node processes, two killed, 6 survivors "
            "(PyTorch with a 1 s last call: it reads whole seconds).\n"
        )
        add(results_table(runs.kill) + "\n")
        add(notes_block(runs.kill))
    if runs.idle is not None:
        add("### An idle job's cost to its store\n")
        add(
            "1000 nodes over 8 processes (default settings: keep-alive every 5 s, 3 attempts) "
            "complete a round and stay idle: the store process's CPU time per second over the "
            "window (from `/proc/<pid>/stat`), first with the handlers' keep-alive alone, then "
            "with every node also in a `wait_for_change()` loop (as `tp-rdzv join` waits).\n"
        )
        add(results_table(runs.idle) + "\n")
        add(idle_table(runs.idle) + "\n")
        add(IDLE_PROFILE)
    add("### The machine of these runs\n")
    add(machine_table(runs.titled()) + "\n")
    return "\n".join(out)


def write_plots(runs: RecoveryRuns, out_dir: Path) -> tuple[dict[str, str], list[Path]]:
    """The section's plots in ``out_dir``: their alt texts by file name, and their paths."""
    if runs.restart is None:
        return {}, []
    path = out_dir / RESTART_PNG
    return {RESTART_PNG: plot_restart(runs, path)}, [path]
