"""The ladder's rungs, plain torch.profiler next to torch-profiled, on one machine and run.

    python bench/ladder_tables.py               # every rung; GPU: the examples' GPU sizes
    python bench/ladder_tables.py linear mlp    # some rungs (linear, mlp, mlp_compiled, llm)

Each rung is one unit of work called five times: ``nn.Linear`` with bias (examples/02), the
GeGLU MLP eager and ``torch.compile``d (examples/03), one decode step of the Llama of
examples/04 (its KV cache filled by a prompt first). For each: torch's own
``key_averages().table()`` for a window of three recorded steps (schedule wait=1, warmup=1,
active=3, the unit inside ``record_function``), how long ``key_averages`` + ``table`` took, then
torch-profiled's console table for a window of the same shape over the same calls (the unit
inside ``profiled``; the Llama also with ``instrument_module(model, depth=4)``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function, schedule  # noqa: E402

from exporters import ConsoleExporter  # noqa: E402
from instrument import Schedule, instrument_module, profiled, session  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPE = torch.bfloat16 if CUDA else torch.float32


def example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        name.replace(".py", ""), os.path.join(REPO, "examples", name)
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A rung yields (title, unit, module to instrument or None); a unit is one call of the work.
Rung = Callable[[], Iterator[tuple[str, Callable[[], Any], Any]]]


def linear() -> Iterator[tuple[str, Callable[[], Any], Any]]:
    for n in (64, 4096) if CUDA else (64, 1024):
        layer = torch.nn.Linear(n, n, device=DEVICE, dtype=DTYPE)
        x = torch.randn(n, n, device=DEVICE, dtype=DTYPE)
        yield f"linear {n}x{n}", lambda layer=layer, x=x: layer(x), None


def _mlp(compiled: bool) -> Iterator[tuple[str, Callable[[], Any], Any]]:
    ex = example("03_mlp.py")
    tokens, dim, hidden = (2048, 4096, 11008) if CUDA else (128, 256, 1024)
    torch.manual_seed(0)
    model = ex.GeGLU(dim, hidden).to(DEVICE, DTYPE)
    x = torch.randn(tokens, dim, device=DEVICE, dtype=DTYPE)
    if compiled:
        model = torch.compile(model, backend=ex.compile_backend(DEVICE))
        model(x)  # compile outside both windows
    yield f"mlp{' compiled' if compiled else ''} {tokens}x{dim}->{hidden}", lambda: model(x), None


def mlp() -> Iterator[tuple[str, Callable[[], Any], Any]]:
    return _mlp(False)


def mlp_compiled() -> Iterator[tuple[str, Callable[[], Any], Any]]:
    return _mlp(True)


def llm() -> Iterator[tuple[str, Callable[[], Any], Any]]:
    ex = example("04_llm.py")
    shape, prompt_len = (ex.GPU, 512) if CUDA else (ex.CPU, 32)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = ex.LlamaForCausalLM(ex.LlamaConfig(**shape, max_position_embeddings=2048))
    model = model.to(DTYPE).eval()
    # transformers 5.24 renames past_key_values to cache; the GPU host's 5.17 knows only the
    # old name, which 5.24 still takes (with this warning, on every call)
    warnings.filterwarnings("ignore", message=".*past_key_values.* is deprecated")
    prompt = torch.randint(0, shape["vocab_size"], (1, prompt_len), device=DEVICE)
    out = model(input_ids=prompt, use_cache=True)
    state = {"cache": out.past_key_values, "tok": out.logits[:, -1:].argmax(-1)}

    def decode() -> Any:
        o = model(input_ids=state["tok"], past_key_values=state["cache"], use_cache=True)
        state["cache"], state["tok"] = o.past_key_values, o.logits[:, -1:].argmax(-1)
        return o

    yield f"llm decode step ({shape['num_hidden_layers']} layers)", decode, model


RUNGS: dict[str, Rung] = {"linear": linear, "mlp": mlp, "mlp_compiled": mlp_compiled, "llm": llm}


def plain(name: str, unit: Callable[[], Any]) -> None:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            with record_function(name):
                unit()
            prof.step()
    t0 = time.perf_counter()
    table = prof.key_averages().table(
        sort_by="cuda_time_total" if CUDA else "cpu_time_total", row_limit=12
    )
    took = time.perf_counter() - t0
    print(table)
    print(f"(key_averages + table: {took * 1e3:.1f} ms)")


def ours(name: str, unit: Callable[[], Any], module: Any) -> None:
    handle = instrument_module(module, depth=4) if module is not None else None
    try:
        with session(
            schedule=Schedule(wait=1, warmup=1, active=3),
            exporters=[ConsoleExporter(stream=sys.stdout)],
        ) as s:
            for _ in range(5):
                with profiled(name):
                    unit()
                s.step()
    finally:
        if handle is not None:
            handle.remove()


def main(argv: list[str]) -> int:
    names = argv or list(RUNGS)
    unknown = [n for n in names if n not in RUNGS]
    if unknown:
        print(f"unknown rung(s) {', '.join(unknown)}; rungs: {', '.join(RUNGS)}", file=sys.stderr)
        return 2
    print(
        f"torch {torch.__version__} on "
        f"{torch.cuda.get_device_name() if CUDA else 'cpu'}, {str(DTYPE).replace('torch.', '')}"
    )
    with torch.no_grad():
        for rung in names:
            for title, unit, module in RUNGS[rung]():
                print(f"\n=== {title} on {DEVICE}: plain torch.profiler ===", flush=True)
                plain(rung, unit)
                print(f"\n=== {title} on {DEVICE}: torch-profiled ===", flush=True)
                ours(rung, unit, module)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
