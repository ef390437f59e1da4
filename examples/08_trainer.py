"""A Hugging Face Trainer, profiled without touching its loop: one callback.

    python examples/08_trainer.py                                 # one window (steps 1-3)
    PROFILED_EVERY=100 python examples/08_trainer.py --steps 400  # windows at 0, 100, ...

``profile_trainer(trainer)`` adds ``instrument.integrations.hf.ProfiledCallback``: each
optimizer step of the Trainer is a profiler step (``PROFILED_*`` choose which are recorded),
its phases are ranges (``hf.data_wait``, ``hf.forward_backward``, ``hf.optimizer``), and each
of the Trainer's logs gets the step time, the data wait and, with FLOP counting on (set here
unless ``PROFILED_WITH_FLOPS`` says otherwise), the FLOP/s and MFU of each step: counted by the
last window, and the Trainer's own estimate (``floating_point_ops``) beside them.

The model is a GPT-2 built from a config (random weights, no download) learning token
sequences that follow a fixed rule, so the loss falls. On a GPU: 12 layers, width 768,
sequences of 512, batch 16, bf16. On a CPU: 2 layers, width 64, sequences of 64, batch 8, fp32
(no peak is known for a CPU, so no MFU unless ``PROFILED_PEAK_TFLOPS`` gives one).
Needs the ``hf`` extra: ``pip install -c constraints.txt -e '.[hf]'``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("PROFILED_WITH_FLOPS", "1")
# the model is built from a config: nothing to fetch
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

try:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
except ImportError as exc:
    sys.exit(
        f"examples/08_trainer.py needs transformers and accelerate ({exc}): "
        "pip install -c constraints.txt -e '.[hf]'; nothing was run"
    )

from instrument.integrations.hf import profile_trainer

GPU = dict(layers=12, width=768, heads=12, vocab=8192, seq=512, batch=16, steps=300, log=25)
CPU = dict(layers=2, width=64, heads=4, vocab=256, seq=64, batch=8, steps=60, log=10)


class RuleTokens(torch.utils.data.Dataset):
    """Sequences where each token is the last one plus 3 (mod vocab), from a start that differs
    per sample: the next token is learnable, so the loss really falls."""

    def __init__(self, vocab: int, seq: int, samples: int) -> None:
        self.vocab, self.seq, self.samples = vocab, seq, samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = (i * 7919 + 3 * torch.arange(self.seq)) % self.vocab
        return {"input_ids": x, "labels": x}


def build_model(sizes: dict) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=sizes["layers"],
        n_embd=sizes["width"],
        n_head=sizes["heads"],
        vocab_size=sizes["vocab"],
        n_positions=sizes["seq"],
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def build_trainer(
    sizes: dict, steps: int, output_dir: str, cuda: bool, bf16: bool | None = None
) -> Trainer:
    """The Trainer at ``sizes``; bf16 mixed precision on a GPU (``bf16`` says otherwise)."""
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=sizes["batch"],
        learning_rate=1e-3,
        logging_steps=sizes["log"],
        report_to="none",
        save_strategy="no",
        use_cpu=not cuda,
        bf16=cuda if bf16 is None else bf16,
        disable_tqdm=True,
        dataloader_num_workers=2 if cuda else 0,
    )
    data = RuleTokens(sizes["vocab"], sizes["seq"], steps * sizes["batch"])
    return Trainer(model=build_model(sizes), args=args, train_dataset=data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="optimizer steps (default: 300 GPU, 60 CPU)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    sizes = GPU if cuda else CPU
    steps = args.steps or sizes["steps"]
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(sizes, steps, out, cuda)
        profile_trainer(trainer)
        print(f"training GPT-2 ({sizes['layers']} layers) for {steps} steps", flush=True)
        trainer.train()
    print_summary(trainer.state.log_history)


def print_summary(history: list[dict]) -> None:
    """One line per log: what the callback added to the Trainer's logs (``-``: not known)."""
    print("\nstep   loss  step ms  data ms  counted TFLOP/s    MFU  Trainer's TFLOP/s    MFU")
    for h in history:
        if "profiled/step_time_s" not in h or "loss" not in h:
            continue
        print(
            f"{h['step']:4d} {h['loss']:6.3f} {h['profiled/step_time_s'] * 1e3:8.2f} "
            f"{h['profiled/data_wait_s'] * 1e3:8.2f} "
            f"{_cell(h.get('profiled/flops_per_s'), 1e-12, 16, '.3f')} "
            f"{_cell(h.get('profiled/mfu'), 100, 5, '.1f%')} "
            f"{_cell(h.get('profiled/declared_flops_per_s'), 1e-12, 18, '.3f')} "
            f"{_cell(h.get('profiled/declared_mfu'), 100, 5, '.1f%')}",
            flush=True,
        )


def _cell(value: float | None, scale: float, width: int, fmt: str) -> str:
    if value is None:
        return f"{'-':>{width + fmt.count('%')}}"
    return f"{value * scale:{width}{fmt.rstrip('%')}}" + "%" * fmt.count("%")


if __name__ == "__main__":
    main()
