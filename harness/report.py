"""``python -m harness report DIR``: gather the experiments' JSON and plots into DIR/REPORT.md."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from .experiments import EXPERIMENTS


def machine_label(machine: dict) -> str:
    versions = machine.get("versions", {})
    blas = machine.get("blas") or [{}]
    parts = [
        f"CPU: {machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores, SIMD {' '.join(machine.get('simd', []))}",
        f"clock {machine.get('cpu_clock_ghz_measured', '?')} GHz measured",
        f"BLAS: {blas[0].get('internal_api', '?')} {blas[0].get('version', '')} ({blas[0].get('architecture', '?')} kernel)",
        "Python " + versions.get("python", "?") + ", " + ", ".join(f"{k} {v}" for k, v in versions.items() if k != "python"),
    ]
    gpu = machine.get("gpu")
    if gpu:
        parts.insert(1, "GPU: " + (", ".join(f"{k} {v}" for k, v in gpu.items()) if isinstance(gpu, dict) else str(gpu)))
    return "; ".join(parts)


def write_report(directory) -> Path:
    directory = Path(directory)
    sections, machines = [], []
    for name, module in EXPERIMENTS.items():
        path = directory / f"{name}.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        machines.append(machine_label(data.get("machine", {})))
        image = f"{name}.png"
        command = f"python -m harness {name} --out {directory}"
        section = [f"## {module.TITLE}", "", f"`{command}`", ""]
        if (directory / image).is_file():
            section += [f"![{name}]({image})", ""]
        section += [module.summarize(data), ""]
        sections.append("\n".join(section))
    if not sections:
        raise FileNotFoundError(f"no experiment results (*.json) in {directory}; run `python -m harness experiments --out {directory}` first")
    header = [
        "# Matmul report", "",
        f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} by `python -m harness report {directory}`.", "",
        "Machine" + ("s" if len(set(machines)) > 1 else "") + ":", "",
        *(f"- {label}" for label in dict.fromkeys(machines)),
        "",
    ]
    report = directory / "REPORT.md"
    report.write_text("\n".join(header + sections))
    return report
