"""Benchmark records: one verified measurement (Record), a run's records with its environment (Report),
and their JSON and CSV forms."""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence, TextIO

import numpy as np

from .._backend import simulated
from .._device import versions
from .._limit import device_info
from .timing import Timing

if TYPE_CHECKING:
    from .ceilings import Ceilings

__all__ = ["Record", "Report", "environment", "simulated_label", "write_json_array", "write_csv_table",
           "write_json_document", "write_csv_rows"]


def _commit() -> str:
    """The l2ctl commit measured: $L2CTL_COMMIT (set where the source travels without its git history),
    else HEAD of l2ctl's own checkout when the package runs from one, else "unknown"."""
    given = os.environ.get("L2CTL_COMMIT", "").strip()
    if given:
        return given
    checkout = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    if not os.path.isfile(os.path.join(checkout, "src", "l2ctl", "kernels.cu")):  # installed: not our checkout
        return "unknown"
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _frameworks() -> dict[str, str]:
    """Versions of the frameworks the process has imported (never imports one)."""
    modules = {name: sys.modules.get(name) for name in ("torch", "cupy")}
    return {name: str(getattr(module, "__version__", "?")) for name, module in modules.items() if module is not None}


def environment(device: object = None) -> dict[str, Any]:
    """Device, driver, runtime, commit and package versions for a benchmark record."""
    from .. import __version__

    info = device_info(device)
    v = versions()
    return {
        "device": {
            "index": info.index,
            "name": info.name,
            "compute_capability": f"{info.compute_capability[0]}.{info.compute_capability[1]}",
            "multiprocessor_count": info.multiprocessor_count,
            "l2_cache_size": info.l2_cache_size,
            "persisting_l2_cache_max_size": info.persisting_l2_cache_max_size,
            "access_policy_max_window_size": info.access_policy_max_window_size,
            "persisting_limit_at_start": info.persisting_l2_cache_size,
            "set_aside_granularity": info.set_aside_granularity,
            "total_memory": info.total_memory,
            "pci_bus_id": info.pci_bus_id,
            "uuid": info.uuid,
        },
        "simulated": simulated(),  # "" on a GPU; what the model is, on the simulator
        "driver_version": v["driver"],
        "runtime_version": v["runtime"],
        "l2ctl_version": __version__,
        "commit": _commit(),
        "frameworks": _frameworks(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "host": platform.node(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def simulated_label(env: dict[str, Any]) -> str:
    """"simulated (<the simulated GPU>)" for a result the simulator made, "" for one measured on a GPU: what every
    printed or drawn result says of itself, so that a simulated figure never passes for a measured one."""
    if not env.get("simulated"):
        return ""
    name = str(env.get("device", {}).get("name", "a GPU"))
    return f"simulated ({name.removesuffix(' (simulated)')})"


@dataclass
class Record:
    """One verified measurement."""

    benchmark: str
    variant: str
    config: dict[str, Any]
    median_ms: float
    min_ms: float
    max_ms: float
    spread: float
    repeat: int
    verified: bool
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_timing(cls, benchmark: str, variant: str, config: dict[str, Any], timing: Timing,
                    metrics: dict[str, Any], verified: bool = True) -> "Record":
        return cls(benchmark, variant, config, timing.median_ms, timing.min_ms, timing.max_ms, timing.spread,
                   len(timing.times_ms), verified, metrics)

    def flat(self) -> dict[str, Any]:
        row = {k: v for k, v in asdict(self).items() if k not in ("config", "metrics")}
        row.update({f"config.{k}": v for k, v in self.config.items()})
        row.update({f"metrics.{k}": v for k, v in self.metrics.items()})
        return row


@dataclass
class Report:
    benchmark: str
    environment: dict[str, Any]
    records: list[Record]
    ceilings: Optional[Ceilings] = None
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "environment": self.environment,
            "ceilings": None if self.ceilings is None else asdict(self.ceilings),
            "summary": self.summary,
            "records": [asdict(r) for r in self.records],
        }

    def to_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            self.write_json(f)

    def write_json(self, file: TextIO) -> None:
        write_json_document(self.to_dict(), file)

    def to_csv(self, path: str) -> None:
        with open(path, "w", newline="", encoding="utf-8") as f:
            self.write_csv(f)

    def write_csv(self, file: TextIO) -> None:
        """One row per record; every row names the device and, for a simulated one, what simulated it (a
        simulated number must never pass for a measured one, in a spreadsheet too)."""
        write_csv_table([self], file)

    def csv_rows(self) -> list[dict[str, Any]]:
        """The CSV's rows: one per record, the device (and what simulated it) first."""
        device = {"device": self.environment.get("device", {}).get("name", ""),
                  "simulated": self.environment.get("simulated", "")}
        return [{**device, **r.flat()} for r in self.records]

    def find(self, variant: str, **config: Any) -> Record:
        for r in self.records:
            if r.variant == variant and all(r.config.get(k) == v for k, v in config.items()):
                return r
        raise KeyError(f"no record {variant} {config}")


def write_json_array(reports: Sequence[Report], file: TextIO) -> None:
    """Several reports as one JSON document (an array of what ``write_json`` writes for each): what a reader
    of one stream can parse, where the documents one after another could not be."""
    write_json_document([r.to_dict() for r in reports], file)


def write_csv_table(reports: Sequence[Report], file: TextIO) -> None:
    """The records of ``reports`` as one CSV table under one header (the device columns when there is no record)."""
    write_csv_rows([row for r in reports for row in r.csv_rows()], file, ("device", "simulated"))


def write_json_document(document: Any, file: TextIO) -> None:
    """``document`` as every JSON file l2ctl writes: indented, NumPy numbers as numbers, ending with a newline."""
    json.dump(document, file, indent=2, default=_json_default)
    file.write("\n")


def write_csv_rows(rows: Sequence[dict[str, Any]], file: TextIO, empty: Sequence[str] = ()) -> None:
    """``rows`` as one CSV table: a header of every column any row has (``empty``'s when there is none), the rows."""
    writer = csv.DictWriter(file, fieldnames=list(dict.fromkeys(k for row in rows for k in row)) or list(empty))
    writer.writeheader()
    writer.writerows(rows)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")
