"""The parts every section of the benchmark report uses: runs, numbers, tables, plots.

``report.py`` writes the page (``docs/benchmarks/index.md``) and
``recovery_report.py`` its recovery section, both with these.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metrics import Metric

# One colour per side, the same in every plot.
OURS_COLOR = "#1f77b4"
ETCD_COLOR = "#2ca02c"
TORCH_COLOR = "#d62728"
#: Ours from tp-store's optional mypyc build, beside the pure one.
MYPYC_COLOR = "#6baed6"
# Rows within this factor of each other are called even.
EVEN = 1.05


@dataclass
class Run:
    """One benchmark run as its JSON records it."""

    path: Path
    data: dict[str, Any]
    rows: list[Metric]

    @property
    def date(self) -> str:
        """The run's date, as ``YYYY-MM-DD HH:MM UTC``."""
        text = str(self.data.get("date", "unknown"))
        match = re.match(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d)", text)
        return f"{match[1]} {match[2]} UTC" if match else text

    def row(self, name: str) -> Metric | None:
        """The row called ``name``, if the run has one."""
        return next((row for row in self.rows if row.name == name), None)


def load_run(path: Path) -> Run | None:
    """The run stored at ``path``; None when that benchmark has not been run."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    rows = [Metric.from_json(item) for item in data.get("metrics", [])]
    return Run(path, data, rows)


def number(value: float | None) -> str:
    """A measurement for a table: three significant digits, thousands separated."""
    if value is None:
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def short_number(value: float) -> str:
    """A compact label for a bar or a point: 5.43k, 204k, 0.021."""
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.2g}" if value < 0.1 else f"{value:.3g}"


def verdict(row: Metric) -> str:
    """How ours compares with torch on ``row``, in words (says when torch has no value)."""
    ratio = row.ratio
    if ratio is None:
        if row.ours is not None and row.torch is None:
            return torch_missing(row)
        return "—"
    factor = ratio if row.better == "higher" else 1 / ratio
    if 1 / EVEN < factor < EVEN:
        return "about even (within 5%)"
    words = ("less", "more") if row.unit == "MiB" else ("faster", "slower")
    if factor >= 1:
        return f"ours {factor:.3g}x {words[0]}"
    return f"**ours {1 / factor:.3g}x {words[1]}**"


def torch_missing(row: Metric) -> str:
    """Why torch has no value on ``row``, briefly."""
    note = row.notes.get("torch", "")
    if note.startswith(("TimeoutError", "timeout")):
        return "torch timed out"
    if note.startswith("skipped"):
        return "ours only (torch not run)"
    if note.startswith("no counterpart"):
        return "no torch counterpart"
    if note:
        return "torch failed"
    return "—"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str) -> str:
    """A Markdown table; ``align`` has an ``l`` or ``r`` per column."""
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def escape(text: str) -> str:
    """``text`` safe inside a Markdown table cell or list item."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, with the report's style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 150,
            "font.size": 10,
            "axes.titlesize": 12,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "svg.hashsalt": "tp-bench",
        }
    )
    return plt


def save(fig: Any, path: Path) -> None:
    """Save ``fig`` as PNG without the matplotlib version, so equal input gives equal bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None}, bbox_inches="tight")


def machine_caption(run: Run) -> str:
    """One line naming the machine and date of ``run``, for the foot of a plot."""
    host = run.data.get("host", {})
    versions = run.data.get("versions", {})
    parts = [f"{host.get('cpus', '?')} CPUs"]
    if host.get("cpu_model"):
        parts[0] += f" ({host['cpu_model']})"
    if host.get("memory_gib"):
        parts.append(f"{host['memory_gib']:g} GiB")
    if versions.get("python"):
        parts.append(f"Python {versions['python']}")
    if versions.get("torch"):
        parts.append(f"torch {versions['torch']}")
    if versions.get("etcd") and versions["etcd"] != "not run":
        parts.append(f"etcd {versions['etcd']}")
    return f"{run.date}; " + ", ".join(parts)


def machine_table(runs: Sequence[tuple[str, Run]]) -> str:
    """The machine, versions and date of every run, a column each."""

    def host(key: str, show: Callable[[Any], str] = str) -> Callable[[Run], str]:
        def cell(run: Run) -> str:
            value = run.data.get("host", {}).get(key)
            return "not recorded" if value is None else show(value)

        return cell

    def versions(run: Run) -> str:
        found = run.data.get("versions", {})
        return ", ".join(f"{name} {version}" for name, version in found.items())

    def load(value: Sequence[float]) -> str:
        return " / ".join(f"{v:g}" for v in value)

    lines: list[tuple[str, Callable[[Run], str]]] = [
        ("date (UTC)", lambda run: run.date),
        ("run took", lambda run: f"{run.data.get('seconds', 0) / 60:.1f} min"),
        ("quick mode (smoke test)", lambda run: "yes" if run.data.get("quick") else "no"),
        ("CPUs", host("cpus")),
        ("CPU model", host("cpu_model")),
        ("memory", host("memory_gib", lambda v: f"{v:g} GiB")),
        ("kernel", host("kernel")),
        ("platform", host("platform")),
        ("load average at start (1/5/15 min)", host("load_average_at_start", load)),
        ("load average at end (1/5/15 min)", host("load_average_at_end", load)),
        ("versions", versions),
    ]
    header = ["", *(title for title, _ in runs)]
    body = [[label, *(escape(show(run)) for _, run in runs)] for label, show in lines]
    return markdown_table(header, body, align="l" * len(header))


def results_table(run: Run) -> str:
    """The metric rows of ``run`` with ours/torch ratios and a verdict each."""
    header = ["metric", "unit", "ours", "PyTorch", "ours / PyTorch", "in words"]
    body = [
        [
            escape(row.name),
            row.unit,
            number(row.ours),
            number(row.torch),
            "—" if row.ratio is None else f"{row.ratio:.3g}",
            verdict(row),
        ]
        for row in run.rows
    ]
    return markdown_table(header, body, align="llrrrl")


def notes_block(run: Run) -> str:
    """The per-row notes of ``run`` (timings' breakdowns, skips, failures), collapsed."""
    items = [
        f"    - {escape(row.name)}, {side}: {escape(note)}"
        for row in run.rows
        for side, note in row.notes.items()
    ]
    if not items:
        return ""
    return '??? note "Notes recorded with each row"\n\n' + "\n".join(items) + "\n"


def config_line(run: Run) -> str:
    """The run's configuration as one line of ``key: value``."""
    config = run.data.get("config", {})
    return "; ".join(f"{key}: {json.dumps(value)}" for key, value in config.items())
