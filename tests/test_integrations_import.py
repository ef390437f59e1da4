"""The integrations load their framework only when asked: ``import instrument`` (its runtime,
and ``instrument.integrations`` itself) never imports transformers, lightning or accelerate;
an integration whose framework is missing says what to install; the integrations use only
the public names of ``instrument``."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from tests._proc import REPO

FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning")


def test_importing_instrument_imports_no_framework(run_python):
    out = run_python(
        "import sys\n"
        "import instrument\n"
        "from instrument import profiled, session\n"
        "import instrument.integrations, instrument.integrations._core\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_missing_framework_says_which_extra_to_install(run_python, tmp_path):
    blocked = tmp_path / "blocked"
    for name in ("transformers", "lightning", "pytorch_lightning", "accelerate"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ImportError('no {name} here')\n")
    out = run_python(
        "for mod in ('hf', 'lightning', 'accelerate'):\n"
        "    try:\n"
        "        __import__('instrument.integrations.' + mod)\n"
        "    except ImportError as exc:\n"
        "        print(mod, '|', exc)\n",
        env={"PYTHONPATH": os.pathsep.join([str(blocked), REPO])},
    )
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" | ") for line in out.stdout.strip().splitlines())
    assert "pip install 'torch-profiled[hf]'" in lines["hf"]
    assert "pip install 'torch-profiled[lightning]'" in lines["lightning"]
    assert "pip install 'torch-profiled[hf]'" in lines["accelerate"]


# the one private name the integrations may use outside their package: the SDK's way to warn
# that never raises into the program (shared by both packages, as every SDK module uses it)
SHARED_PRIVATE = {"instrument.base.warn"}


def private_uses(path):
    """Where an integration's source reaches past the public faces of ``instrument`` and
    ``exporters`` (their ``__all__``): imports of their modules or of names not in
    ``__all__``, and attribute reads ``instrument.<name>`` of such names. Its own package's
    ``_core`` is allowed (``from ._core import ...``)."""
    import exporters
    import instrument

    public = {"instrument": set(instrument.__all__), "exporters": set(exporters.__all__)}
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    aliases = {}  # local name -> the package a plain ``import`` bound to it
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if not (node.level == 1 and node.module == "_core"):
                    found.append(f"{where} from {'.' * node.level}{node.module or ''} import")
                continue
            module = node.module or ""
            top = module.split(".")[0]
            if top not in public or module in SHARED_PRIVATE:
                continue
            if module != top:
                if module != "instrument.integrations._core":
                    found.append(f"{where} from {module} import")
                continue
            found += [
                f"{where} from {module} import {a.name}"
                for a in node.names
                if a.name not in public[top]
            ]
        elif isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top not in public:
                    continue
                if a.name != top and a.name not in SHARED_PRIVATE:
                    found.append(f"{where} import {a.name}")
                aliases[a.asname or top] = top
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr not in public[aliases[node.value.id]]
        ):
            found.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def test_the_integrations_use_only_the_public_face_of_instrument():
    """An integration is what a user could write: the runtime's modules move and change
    without it noticing (``instrument.get_config()`` and ``instrument.peak_tflops()`` give
    what it reads of the settings)."""
    paths = sorted((Path(REPO) / "instrument" / "integrations").glob("*.py"))
    assert {p.name for p in paths} >= {"_core.py", "hf.py", "lightning.py", "accelerate.py"}
    assert [use for p in paths for use in private_uses(p)] == []


def test_the_check_sees_private_reads(tmp_path):
    """The check above finds each form a private use can take."""
    source = tmp_path / "sample.py"
    source.write_text(
        "import instrument\n"
        "import instrument.lifetime\n"
        "from instrument import profiled, state\n"
        "from instrument.config import Config\n"
        "from .. import lifetime\n"
        "from ..sessions import ProfilerWarning\n"
        "from ._core import Phases\n"
        "from exporters import Exporter, _base\n"
        "from instrument.base.warn import warn\n"
        "instrument.lifetime.ambient_config()\n"
        "instrument.configure()\n"
    )
    assert [use.split(" ", 1)[1] for use in private_uses(source)] == [
        "import instrument.lifetime",
        "from instrument import state",
        "from instrument.config import",
        "from .. import",
        "from ..sessions import",
        "from exporters import _base",
        "instrument.lifetime",
    ]
