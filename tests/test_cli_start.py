"""Issue 31, item 5: the ``torch-profiled`` command starts without torch.

Real processes: ``python -m instrument`` and the console script's own code (``from
instrument.cli import main``) run ``--version``, ``summarize`` (table and ``--json``, of the
SDK's gzip trace files and of a plain torch.profiler trace), ``diff`` and ``report``, and no
module of torch is imported (``-X importtime`` lists every import; the console form also reads
``sys.modules`` as the command ends). ``--version`` then costs a fraction of ``import torch``,
measured side by side here. The lazy package face still installs the trigger's handler at
``import instrument`` (issue 29), before torch, and a request made then opens a window once
the program runs its steps.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch

from tests import _early, _proc
from tests._proc import REPO

DATA = os.path.join(REPO, "tests", "data", "gate_h100")

# the console script ``torch-profiled`` (pyproject: instrument.cli:main), as pip writes it,
# then what it has imported of torch once the command is over
CONSOLE = (
    "import sys\n"
    "from instrument.cli import main\n"
    "try:\n"
    "    rc = main()\n"
    "finally:\n"
    "    print('TORCH', sorted(m for m in sys.modules if m.partition('.')[0] == 'torch'),\n"
    "          file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def _torch_imports(importtime: str) -> list[str]:
    """The torch modules a ``-X importtime`` log names (``import time: self | cum | name``)."""
    names = [
        line.rsplit("|", 1)[1].strip()
        for line in importtime.splitlines()
        if line.startswith("import time:") and "|" in line
    ]
    return [n for n in names if n.partition(".")[0] == "torch"]


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory):
    """A trace of plain torch.profiler (no SDK), made here: the child never makes one."""
    path = tmp_path_factory.mktemp("plain") / "plain.json"
    x = torch.randn(32, 32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with torch.profiler.record_function("mm_range"):
                x @ x
    prof.export_chrome_trace(str(path))
    return str(path)


def _commands(plain: str, out_dir) -> dict[str, tuple[list[str], str]]:
    """name -> (arguments, a text the command's output or its file must hold)."""
    base, heavier = os.path.join(DATA, "base"), os.path.join(DATA, "heavier")
    return {
        "version": (["--version"], "torch-profiled "),
        "summarize": (["summarize", base], "train_step"),
        "summarize-json": (["summarize", "--json", plain], '"mm_range"'),
        "summarize-range": (["summarize", "--range", "mm_range", plain], "mm_range"),
        "diff": (["diff", base, heavier], "train_step"),
        "report": (["report", base, "-o", str(out_dir / "report.html")], "train_step"),
    }


@pytest.mark.parametrize("form", ["-m instrument", "console script"])
def test_no_command_imports_torch(plain_trace, tmp_path, form):
    for name, (args, expect) in _commands(plain_trace, tmp_path).items():
        if form == "-m instrument":
            result = _proc.run("-X", "importtime", "-m", "instrument", *args, cwd=tmp_path)
            loaded = _torch_imports(result.stderr)
        else:
            result = _proc.run("-c", CONSOLE, *args, cwd=tmp_path)
            (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("TORCH ")]
            loaded = eval(line[len("TORCH ") :])
        assert result.returncode == 0, (name, result.stderr[-3000:])
        shown = result.stdout
        if name == "report":
            shown = (tmp_path / "report.html").read_text(encoding="utf-8")
        assert expect in shown, (name, shown[:2000])  # the command did its work
        assert loaded == [], f"{form} {' '.join(args)} imported torch: {loaded[:10]}"


def _wall(*args: str) -> float:
    start = time.perf_counter()
    result = _proc.run(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    return time.perf_counter() - start


def test_version_costs_a_fraction_of_importing_torch():
    """Side by side: ``--version`` (best of three) takes under half of what one bare ``import
    torch`` takes (measured ~0.1 s against ~1.2 s on a 2-core VM; it took more than the import
    when the package face imported torch). One sample of the baseline: noise only lengthens
    it, which loosens the bound, never tightens it."""
    torch_import = _wall("-c", "import torch")
    version = [_wall("-m", "instrument", "--version") for _ in range(3)]
    assert min(version) < 0.5 * torch_import, (version, torch_import)


# A job signalled while it loads (before any of the SDK's runtime, hence torch, is there):
# it goes on, and the request opens a window at its first steps.
EARLY = r"""
import json, os, signal, sys
import instrument
sig = getattr(signal, os.environ["SIG"])
installed = signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN, None)
os.kill(os.getpid(), sig)
early = {"torch": "torch" in sys.modules, "installed": installed}
if os.environ["PROFILED_ENABLED"] == "1":
    import torch
    from instrument import profiled
    from exporters import InMemoryExporter
    mem = InMemoryExporter()
    instrument.configure(exporters=[mem])

    @profiled("train_step", step=True)
    def train_step(x):
        return x @ x

    x = torch.randn(4, 4)
    for _ in range(4):
        train_step(x)
    instrument.flush()
    early["reasons"] = [r.reason.kind for r in mem.reports]
print(json.dumps(early), flush=True)
"""


WIRED = [("SIGUSR2", "1"), ("SIGUSR1", "0")]
for _name, _enabled in WIRED:  # each its own program, run early (tests/_early.py)
    _early.add(
        __name__,
        f"test_the_trigger_is_wired_at_import_before_torch[{_name}-{_enabled}]",
        *("-c", EARLY),
        env=_proc.sdk_env(
            SIG=_name,
            PROFILED_TRIGGER=_name,
            PROFILED_ENABLED=_enabled,
            PROFILED_SAMPLE_RATE="0",
            PROFILED_SCHEDULE="warmup=0,active=1",
        ),
    )


@pytest.mark.parametrize("name, enabled", WIRED)
def test_the_trigger_is_wired_at_import_before_torch(request, name, enabled):
    result, _cwd = _early.result(request)  # EARLY, signalled with {name} as it loads
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert result.returncode != -getattr(signal, name)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["installed"] and out["torch"] is False, out
    if enabled == "1":
        assert out["reasons"] == ["trigger"], (out, result.stderr[-2000:])
    else:
        lines = [ln for ln in result.stderr.splitlines() if "arrived while profiling is off" in ln]
        assert len(lines) == 1 and "PROFILED_ENABLED=0" in lines[0], result.stderr[-2000:]
