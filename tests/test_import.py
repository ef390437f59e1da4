"""``import instrument`` stays cheap: it loads no part of torch that ``import torch`` did not,
so Dynamo (about a second) comes only when the program compiles or a window starts (torch's
own profiler loads it then); the SDK's hook into Dynamo is registered when Dynamo loads."""

from __future__ import annotations

import pytest

from tests import _proc


@pytest.fixture(scope="module")
def ahead(request, tmp_path_factory):
    """Every program of this module (each its own interpreter, as before), run two at a time
    as the module starts; a test reads its own."""
    with _proc.Ahead(request, tmp_path_factory) as ahead:
        memory = {"PROFILED_EXPORTERS": "memory"}
        for enabled in ("1", "0"):
            env = _proc.sdk_env(memory, PROFILED_ENABLED=enabled)
            key = f"test_import_loads_nothing_heavy_of_torch[{enabled}]"
            ahead.add(key, "-c", NOTHING_HEAVY, env=env)
        ahead.add(
            "test_a_step_function_compiled_after_the_import_still_ends_its_steps",
            *("-c", COMPILED_STEPS),
            env=_proc.sdk_env(memory),
            timeout=300,
        )
        ahead.add(
            "test_the_package_face_is_lazy_and_binds_what_it_always_bound",
            *("-c", LAZY_FACE),
            env=_proc.sdk_env(memory),
        )
        yield ahead


NOTHING_HEAVY = (
    "import sys, torch\n"
    "before = {m for m in sys.modules if m.startswith('torch')}\n"
    "import instrument\n"
    "from instrument import profiled\n"
    "@profiled('f')\n"
    "def f():\n"
    "    return 1\n"
    "added = sorted({m for m in sys.modules if m.startswith('torch')} - before)\n"
    "print('added', added)\n"
)


@pytest.mark.parametrize("enabled", ["1", "0"])
def test_import_loads_nothing_heavy_of_torch(ahead, request, enabled):
    result, _cwd = ahead[request.node.name]  # NOTHING_HEAVY
    assert result.returncode == 0, result.stderr
    added = result.stdout.split("added", 1)[1]
    assert "torch._dynamo" not in added and "torch._inductor" not in added, added


COMPILED_STEPS = (
    "import sys, torch, instrument\n"
    "from instrument import profiled, Schedule\n"
    "from instrument.testing import capture\n"
    "assert 'torch._dynamo' not in sys.modules\n"
    "@profiled('s', step=True)\n"
    "def s(x):\n"
    "    return (x @ x).relu()\n"
    "compiled = torch.compile(s, fullgraph=True, backend='eager')\n"
    "with capture(schedule=Schedule(wait=1, warmup=1, active=2)) as cap:\n"
    "    seen = []\n"
    "    for _ in range(5):\n"
    "        compiled(torch.randn(4, 4))\n"
    "        seen.append(cap.session.step_index)\n"
    "print('seen', seen[:4], [r.steps for r in cap.reports])\n"
)


def test_a_step_function_compiled_after_the_import_still_ends_its_steps(ahead, request):
    """The Dynamo hook is registered when the program's torch.compile loads Dynamo: a
    ``step=True`` function compiled with ``fullgraph=True`` (which fails on a graph break)
    ends one step per call."""
    result, _cwd = ahead[request.node.name]  # COMPILED_STEPS
    assert result.returncode == 0, result.stderr[-3000:]
    assert "seen [1, 2, 3, 4] [(2, 3)]" in result.stdout, result.stdout


LAZY_FACE = (
    "import importlib, sys\n"
    "import instrument\n"
    "runtime = ('torch', 'instrument.runtime.decorator', 'instrument.runtime.lifetime',\n"
    "           'instrument.runtime.state')\n"
    "print('after import', [m for m in runtime if m in sys.modules])\n"
    "homes = {'profiled': 'runtime.decorator', 'session': 'runtime.lifetime',\n"
    "         'Session': 'runtime.profiling_session', 'Schedule': 'runtime.sampling',\n"
    "         'WindowReport': 'base.report', 'ModuleHandle': 'runtime.module',\n"
    "         'Config': 'runtime.config', 'step': 'runtime.lifetime',\n"
    "         'ProfilerWarning': 'runtime.profiling_session'}\n"
    "def home(m):\n"
    "    return importlib.import_module('instrument.' + m)\n"
    "same = all(getattr(instrument, n) is getattr(home(m), n) for n, m in homes.items())\n"
    "print('after use', [m for m in runtime if m in sys.modules], same)\n"
    "ns = {}\n"
    "exec('from instrument import *', ns)\n"
    "star = sorted(n for n in ns if not n.startswith('__'))\n"
    "print('star', star == sorted(instrument.__all__))\n"
    "print('dir', set(instrument.__all__) <= set(dir(instrument)))\n"
    "print('sub', instrument.testing.__name__)\n"
    "try:\n"
    "    instrument.no_such_thing\n"
    "except AttributeError as exc:\n"
    "    print('missing', exc)\n"
)


def test_the_package_face_is_lazy_and_binds_what_it_always_bound(ahead, request):
    """``import instrument`` loads no torch and none of the runtime; the first public name
    loads it all at once, each name the very object its module defines; ``import *``, ``dir``
    and submodules as attributes work as with an eager face; a name that is nowhere is an
    AttributeError (not an import error)."""
    result, _cwd = ahead[request.node.name]  # LAZY_FACE
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "after import []" in out, out
    assert (
        "after use ['torch', 'instrument.runtime.decorator', 'instrument.runtime.lifetime', " in out
    ), out
    assert "'instrument.runtime.state'] True" in out, out
    assert "star True" in out and "dir True" in out and "sub instrument.testing" in out, out
    assert "missing module 'instrument' has no attribute 'no_such_thing'" in out, out
