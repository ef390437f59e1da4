"""The fourth rung: a causal language model from ``transformers``, profiled per layer while it
generates, without editing a line of the model.

    pip install -c constraints.txt -e '.[llm]'     # transformers is an optional extra
    python examples/04_llm.py

The model is a Llama built from a config with random weights: nothing is downloaded
(``HF_HUB_OFFLINE=1`` is set), so the tokens it generates are noise, while the work per token is
that of a real model of that shape. On a GPU: TinyLlama-1.1B's shape (22 layers, hidden 2048,
32 heads, 4 key/value heads), bf16, a 512-token prompt. On a CPU: 2 layers, hidden 128, fp32,
a 32-token prompt.

``instrument_module(model, depth=4, step=True)`` gives every module down to a decoder layer's
attention, MLP and norms a range named by its path (``model.layers.0.mlp``), and makes each
forward of the model end one step (``generate`` runs them, so there is no loop of ours to call
``s.step()`` in): ``generate`` runs one forward for the prompt (step 0, not profiled), then one
per new token; step 1 warms the profiler up and steps 2-4 (three decode steps) are recorded.
The window's table goes to standard error (and a trace file to ./profiled_traces); a per-layer
table, built from the same report, goes to standard output.
"""

from __future__ import annotations

import os
import sys

import torch

from exporters import InMemoryExporter
from exporters.console import format_time_us
from instrument import Config, Schedule, instrument_module, session

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights from a config: never download
try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    sys.exit(
        "examples/04_llm.py needs transformers, an optional extra of torch-profiled:\n"
        "    pip install -c constraints.txt -e '.[llm]'\n"
        "(run from the repository root); nothing was run."
    )

GPU = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    vocab_size=32000,
)
CPU = dict(
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1024,
)


def per_layer_table(report, layers: int) -> str:
    """One row per decoder layer: its time, and its attention's and MLP's share of it."""
    device = any(r.device_time_us for r in report.ranges.values())
    kind = "device" if device else "CPU"

    def t(name: str) -> float:
        r = report.ranges.get(name)
        if r is None:
            return 0.0
        return r.device_time_us if device else r.cpu_time_us

    rows = [
        f"{'decoder layer (' + kind + ' time)':<32} {'calls':>6} {'layer':>11} "
        f"{'self_attn':>11} {'mlp':>11} {'attn %':>7} {'mlp %':>7}"
    ]
    for i in range(layers):
        layer = f"model.layers.{i}"
        total = t(layer)
        attn, mlp = t(layer + ".self_attn"), t(layer + ".mlp")
        calls = report.ranges[layer].calls if layer in report.ranges else 0
        rows.append(
            f"{layer:<32} {calls:>6} {format_time_us(total):>11} {format_time_us(attn):>11} "
            f"{format_time_us(mlp):>11} {100 * attn / (total or 1):>6.0f}% "
            f"{100 * mlp / (total or 1):>6.0f}%"
        )
    for name in ("model.embed_tokens", "model.norm", "lm_head", "LlamaForCausalLM"):
        if name in report.ranges:
            r = report.ranges[name]
            rows.append(f"{name:<32} {r.calls:>6} {format_time_us(t(name)):>11}")
    return "\n".join(rows)


def main() -> None:
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shape, prompt_len, new_tokens = (GPU, 512, 8) if cuda else (CPU, 32, 8)
    torch.manual_seed(0)
    config = LlamaConfig(**shape, max_position_embeddings=2048)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    print(
        f"Llama, {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
        f"{params / 1e6:.1f}M parameters, random weights, {str(dtype).replace('torch.', '')} "
        f"on {device}; prompt {prompt_len} tokens, {new_tokens} new tokens",
        flush=True,
    )

    handle = instrument_module(model, depth=4, step=True)  # each forward of model: one step
    print(
        f"instrument_module: {len(handle.names)} ranges ({', '.join(handle.names[:4])}, ...)",
        flush=True,
    )
    prompt = torch.randint(0, config.vocab_size, (1, prompt_len), device=device)
    mem = InMemoryExporter()
    with (
        session(
            schedule=Schedule(wait=1, warmup=1, active=3),
            exporters=[*Config.from_env().exporters, mem],
        ),
        torch.no_grad(),
    ):
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    handle.remove()
    print(f"generated {out.shape[1] - prompt_len} tokens", flush=True)
    if not mem.reports:
        sys.exit("no window was recorded: " + "; ".join(mem.notices))
    report = mem.reports[0]
    print(f"\nper layer, decode steps {report.steps[0]}-{report.steps[-1]}:")
    print(per_layer_table(report, shape["num_hidden_layers"]))


if __name__ == "__main__":
    main()
