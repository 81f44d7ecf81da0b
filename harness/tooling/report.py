"""``python -m harness report DIR``: gather the experiments' JSON and plots into DIR/REPORT.md."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from harness.env import files
from harness.experiments import EXPERIMENTS


def machine_label(machine: dict, clock: str | None = None) -> str:
    """One line naming the machine: CPU, GPU, BLAS, versions. The clock is measured anew by every
    experiment and differs between them on one machine, so it is passed separately (``clock``)."""
    versions = machine.get("versions", {})
    # NumPy's BLAS (OpenBLAS in its wheels), whichever other BLAS (BLIS, a peer) loaded first
    blas = sorted(machine.get("blas") or [{}], key=lambda entry: entry.get("internal_api") != "openblas")
    parts = [
        f"CPU: {machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores, SIMD "
        f"{' '.join(machine.get('simd', []))}",
        f"clock {clock if clock is not None else machine.get('cpu_clock_ghz_measured', '?')} GHz measured",
        f"BLAS: {blas[0].get('internal_api', '?')} {blas[0].get('version', '')} "
        f"({blas[0].get('architecture', '?')} kernel)",
        "Python "
        + versions.get("python", "?")
        + ", "
        + ", ".join(f"{k} {v}" for k, v in versions.items() if k != "python"),
    ]
    gpu = machine.get("gpu")
    if gpu:
        parts.insert(
            1, "GPU: " + (", ".join(f"{k} {v}" for k, v in gpu.items()) if isinstance(gpu, dict) else str(gpu))
        )
    return "; ".join(parts)


def _machine_lines(machines: list[dict]) -> list[str]:
    """One line per machine the experiments ran on, its clock as the range they measured."""
    same_machine: dict[str, tuple[dict, list[float]]] = {}
    for machine in machines:
        identity = machine_label(machine, clock="")  # what the line says, but for the clock
        clock = machine.get("cpu_clock_ghz_measured")
        same_machine.setdefault(identity, (machine, []))[1].extend([clock] if isinstance(clock, (int, float)) else [])
    lines = ["Machine" + ("s" if len(same_machine) > 1 else "") + ":", ""]
    for machine, clocks in same_machine.values():
        low, high = (min(clocks), max(clocks)) if clocks else (None, None)
        span = "?" if low is None else f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"
        lines.append(f"- {machine_label(machine, clock=span)}")
    return lines + [""]


def _section(directory: Path, name: str, module) -> tuple[str, dict]:
    """(the report's section for one experiment's JSON, its machine); ValueError, with
    the reason, for a file that is not that experiment's JSON (cut short, edited, another's)."""
    path = directory / f"{name}.json"
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    except UnicodeDecodeError:
        raise ValueError("is not text") from None
    if not isinstance(data, dict):
        raise ValueError(f"holds a JSON {type(data).__name__}, not an experiment's results")
    try:
        machine = data.get("machine", {})
        label = machine if isinstance(machine, dict) else {}
        summary = module.summarize(data)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as error:
        raise ValueError(f"is not what `python -m harness {name}` writes ({type(error).__name__}: {error})") from None
    image = f"{name}.png"
    section = [f"## {module.TITLE}", "", f"`python -m harness {name} --out {directory}`", ""]
    if (directory / image).is_file():
        section += [f"![{name}]({image})", ""]
    section += [summary, ""]
    return "\n".join(section), label


def write_report(directory, problems: list[str] | None = None) -> Path:
    """Write DIR/REPORT.md from the experiments' JSON in DIR. A JSON that cannot be read is
    left out, named in the report and appended to ``problems`` (when given), so one bad file
    does not cost the rest; FileNotFoundError when there is nothing to report."""
    directory = Path(directory)
    sections, machines, left_out = [], [], []
    for name, module in EXPERIMENTS.items():
        if not (directory / f"{name}.json").is_file():
            continue
        try:
            section, label = _section(directory, name, module)
        except (OSError, ValueError) as error:
            left_out.append(f"{directory / name}.json {error}")
            continue
        sections.append(section)
        machines.append(label)
    if problems is not None:
        problems.extend(left_out)
    if not sections:
        found = f" ({'; '.join(left_out)})" if left_out else ""
        raise FileNotFoundError(
            f"no readable experiment results (*.json) in {directory}{found}; "
            f"run `python -m harness experiments --out {directory}` first"
        )
    if left_out:
        sections.append("\n".join(["## Left out", "", *(f"- {line}" for line in left_out), ""]))
    header = [
        "# Matmul report",
        "",
        f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} by `python -m harness report {directory}`.",
        "",
        *_machine_lines(machines),
        "",
    ]
    return files.write_text(directory / "REPORT.md", "\n".join(header + sections))
