"""Run-time range names inside ``torch.compile``d code (issue 29, item 19 in part).

No range records inside compiled code, so the SDK never reads a context form's name there:
read, each new name was a guard on ``_Profiled.__enter__``, recompiled per name until Dynamo's
``recompile_limit``. What Dynamo does with the user's own values stays (an int formatted into
the name is a guard on that int, a name passed in is a guard on the string): README known limits.
Counted in a real program from Dynamo's own recompile log.
"""

from __future__ import annotations

import re

from tests import _early, _proc

PROGRAM = r"""
import torch
from instrument import profiled

def formatted(x, i):
    with profiled(f"step{i}"):
        return x * 2

def given(x, name):
    with profiled(name, step=True):
        return x + 1

def given_fullgraph(x, name):
    with profiled(name):
        return x - 1

x = torch.ones(3)
a = torch.compile(formatted, backend="eager")
b = torch.compile(given, backend="eager")
c = torch.compile(given_fullgraph, backend="eager", fullgraph=True)
limit = torch._dynamo.config.recompile_limit
for i in range(2 * limit + 4):  # more distinct names than Dynamo's limit
    assert a(x, i).sum().item() == 6
    assert b(x, f"block{i}").sum().item() == 6
    assert c(x, f"block{i}").sum().item() == 0
print("LIMIT", limit)
"""


_early.add(
    __name__,
    "test_run_time_names_in_compiled_code_recompile_no_sdk_frame",
    *("-c", PROGRAM),
    env=_proc.sdk_env(TORCH_LOGS="recompiles", PROFILED_EXPORTERS="none"),
)


def test_run_time_names_in_compiled_code_recompile_no_sdk_frame(request):
    proc, _cwd = _early.result(request)  # PROGRAM, Dynamo's recompiles logged
    assert proc.returncode == 0, proc.stderr[-4000:]
    limit = int(re.search(r"LIMIT (\d+)", proc.stdout).group(1))
    recompiled = re.findall(r"Recompiling function (\S+) in (\S+):\d+", proc.stderr)
    assert "formatted" in dict(recompiled), proc.stderr[-2000:]  # Dynamo's log is read
    ours = [(fn, path) for fn, path in recompiled if "instrument" in path.split("/")]
    assert ours == []  # was __enter__ once per new name, up to the limit
    # a name passed in is never read in compiled code, so it is no guard: no recompile at all
    # (was one per name up to the limit, then eager; fullgraph=True then failed)
    assert [fn for fn, _ in recompiled if fn.startswith("given")] == []
    # an int formatted into the name is Dynamo's own guard (README known limits): whatever it
    # costs, not one recompile per name
    assert len([fn for fn, _ in recompiled if fn == "formatted"]) < limit
