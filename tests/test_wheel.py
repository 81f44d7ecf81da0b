"""A regular (non-editable) install carries the library and every source file, and its library
is the portable build (it will be copied to other CPUs).

Builds the wheel, installs it into a fresh virtual environment (which sees this
environment's dependencies but not this checkout), and runs the harness from another folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_wheel_install_finds_every_source(tmp_path):
    pytest.importorskip("scikit_build_core")
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)])
    (wheel,) = wheels.glob("*.whl")

    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # Dependencies come from this environment through a plain path entry: unlike its
    # site-packages, that does not run this environment's .pth hooks (the editable install).
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)])

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MATMUL_C_LIBRARY")}
    probe = (
        "import json, harness, harness.env.sources as s\n"
        "print(json.dumps({'package': str(s.PACKAGE_DIR), 'checkout': s.in_checkout(),\n"
        "  'missing': [i.source for i in harness.implementations() if i.source and not "
        "s.source_path(i.source).is_file()],\n"
        "  'sources': [i.source for i in harness.implementations() if i.source],\n"
        "  'call_mode': harness.backends.c.clib.call_mode(), 'build_isa': harness.backends.c.clib.build_isa(),\n"
        "  'fast_call': harness.backends.c.clib.fast_call_type() is not None}))\n"
    )
    info = json.loads(_run([str(python), "-c", probe], cwd=elsewhere, env=env).stdout)
    assert Path(info["package"]).is_relative_to(site), info
    assert not info["checkout"] and not info["missing"] and info["sources"]
    assert info["call_mode"] == "compiled glue", info  # the wheel carries the call glue
    assert info["fast_call"], info  # and the compiled common case of a call
    assert info["build_isa"] == [], info  # portable: plain x86-64, whatever CPU built it

    listing = _run([str(python), "-m", "harness", "list"], cwd=elsewhere, env=env).stdout
    assert "c.blocked" in listing and "python.ikj" in listing
    compared = _run(
        [
            str(python),
            "-m",
            "harness",
            "compare",
            "--shapes",
            "33",
            "--impls",
            "c.*",
            "python.ikj",
            "--min-time",
            "0.01",
        ],
        cwd=elsewhere,
        env=env,
    ).stdout
    assert "FAILED" not in compared and "error" not in compared and "c.blocked" in compared
