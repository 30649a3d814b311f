"""The rows every benchmark reports: one measurement of ours and of torch, and their ratio.

``store_bench.py`` and ``rdzv_bench.py`` fill them, print them with
:func:`format_table` and store them in their JSON (:func:`write_results`);
``report.py`` reads them back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Metric:
    """One row: what was measured, in which unit, and which way is better."""

    name: str
    unit: str
    better: str  # "higher" or "lower"
    ours: float | None = None
    torch: float | None = None
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """ours / torch, when both were measured."""
        if self.ours is None or self.torch is None or self.torch == 0:
            return None
        return self.ours / self.torch

    def to_json(self) -> dict[str, Any]:
        """The row as the benchmarks' JSON stores it."""
        return {
            "name": self.name,
            "unit": self.unit,
            "better": self.better,
            "ours": self.ours,
            "torch": self.torch,
            "ratio_ours_over_torch": self.ratio,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> Metric:
        """A row read back from the benchmarks' JSON."""
        return cls(
            name=item["name"],
            unit=item["unit"],
            better=item["better"],
            ours=item.get("ours"),
            torch=item.get("torch"),
            notes=dict(item.get("notes") or {}),
        )


def format_table(metrics: Sequence[Metric]) -> str:
    """The rows as a plain-text table with ours/torch ratios."""

    def cell(value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"

    header = ("metric", "unit", "ours", "torch", "ours/torch", "better")
    rows = [
        (
            m.name,
            m.unit,
            cell(m.ours),
            cell(m.torch),
            "-" if m.ratio is None else f"{m.ratio:.3g}x",
            m.better,
        )
        for m in metrics
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for index, row in enumerate([header, *rows]):
        lines.append(
            "  ".join(
                text.ljust(width) if col < 2 else text.rjust(width)
                for col, (text, width) in enumerate(zip(row, widths, strict=True))
            )
        )
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def write_results(path: Path, document: dict[str, Any]) -> None:
    """Write a benchmark's results to ``path`` as indented JSON, and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")
