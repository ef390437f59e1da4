"""The integrations load their framework only when asked: ``import instrument`` (its runtime,
and ``instrument.integrations`` itself) never imports transformers, lightning or accelerate;
an integration whose framework is missing says what to install."""

from __future__ import annotations

import os

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
