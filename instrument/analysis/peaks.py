"""What a device could do: dense peak FLOP/s per dtype and memory bandwidth, for MFU.

MFU (model FLOPs utilisation) is a range's achieved FLOP/s over its kernels' device time,
divided by the device's *dense* peak for the dtype its FLOPs ran in (no 2:4 sparsity). The
peaks below are the vendors' data-sheet figures for common data-centre GPUs; a device not in
the table has no peak ("peak unknown") unless ``PROFILED_PEAK_TFLOPS`` gives one, which then
applies to every dtype. ``fp32`` is the plain FP32 rate: PyTorch runs fp32 matrix products
without TF32 unless ``torch.backends.cuda.matmul.allow_tf32`` (or
``torch.set_float32_matmul_precision("high")``) says otherwise, and a trace does not say which;
with TF32 on, set ``PROFILED_PEAK_TFLOPS`` to the card's TF32 figure.

The ridge point (peak FLOP/s over memory bandwidth, FLOPs per byte) splits compute-heavy from
memory-heavy work for that device and dtype (``verdict.judge``).

No torch imports: the CLI applies it to saved traces (their ``deviceProperties`` name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEVICES", "DTYPES", "DevicePeak", "dtype_name", "lookup"]

# The dtype names a report uses, from the trace's operator input types.
DTYPES: dict[str, str] = {
    "double": "fp64",
    "float": "fp32",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "signed char": "int8",
}


def dtype_name(torch_type: str) -> str:
    """``c10::BFloat16`` -> ``bf16``; "" for types FLOPs are not counted in."""
    return DTYPES.get(torch_type, "")


@dataclass(frozen=True)
class DevicePeak:
    """One device's dense peaks (TFLOP/s per dtype) and memory bandwidth (TB/s)."""

    name: str  # as the table names it
    tflops: dict[str, float]
    bandwidth_tb_s: float

    def flops_per_s(self, dtype: str) -> float | None:
        tflops = self.tflops.get(dtype)
        return tflops * 1e12 if tflops else None

    def ridge(self, dtype: str) -> float | None:
        """FLOPs per byte at which ``dtype`` work stops being memory-bound here."""
        peak = self.flops_per_s(dtype)
        if peak is None or not self.bandwidth_tb_s:
            return None
        return peak / (self.bandwidth_tb_s * 1e12)


def _gpu(fp64: float, fp32: float, tf32: float, bf16: float, fp8: float, int8: float) -> dict:
    out = {"fp64": fp64, "fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16}
    out.update({k: v for k, v in (("fp8", fp8), ("int8", int8)) if v})
    return out


# (substring of the device's name, most specific first) -> dense peaks. NVIDIA and AMD data
# sheets; fp64 is the tensor-core/matrix rate where the card has one.
DEVICES: tuple[tuple[str, DevicePeak], ...] = (
    ("B200", DevicePeak("NVIDIA B200", _gpu(40, 80, 1100, 2250, 4500, 4500), 8.0)),
    ("H200", DevicePeak("NVIDIA H200", _gpu(67, 67, 494.7, 989.4, 1978.9, 1978.9), 4.8)),
    ("H100 PCIe", DevicePeak("NVIDIA H100 PCIe", _gpu(51, 51, 378, 756, 1513, 1513), 2.0)),
    ("H100 NVL", DevicePeak("NVIDIA H100 NVL", _gpu(60, 60, 417.5, 835, 1670.5, 1670.5), 3.9)),
    ("H100", DevicePeak("NVIDIA H100 SXM", _gpu(67, 67, 494.7, 989.4, 1978.9, 1978.9), 3.35)),
    ("H20", DevicePeak("NVIDIA H20", _gpu(1, 44, 74, 148, 296, 296), 4.0)),
    ("A100-SXM4-40GB", DevicePeak("NVIDIA A100 40GB", _gpu(19.5, 19.5, 156, 312, 0, 624), 1.555)),
    (
        "A100 80GB PCIe",
        DevicePeak("NVIDIA A100 80GB PCIe", _gpu(19.5, 19.5, 156, 312, 0, 624), 1.935),
    ),
    ("A100", DevicePeak("NVIDIA A100 80GB SXM", _gpu(19.5, 19.5, 156, 312, 0, 624), 2.039)),
    ("L40S", DevicePeak("NVIDIA L40S", _gpu(1.4, 91.6, 183, 362, 733, 733), 0.864)),
    ("L4", DevicePeak("NVIDIA L4", _gpu(0.5, 30.3, 60, 121, 242.5, 242.5), 0.3)),
    ("A10", DevicePeak("NVIDIA A10", _gpu(0.98, 31.2, 62.5, 125, 0, 250), 0.6)),
    ("V100", DevicePeak("NVIDIA V100", {"fp64": 7.8, "fp32": 15.7, "fp16": 125}, 0.9)),
    ("T4", DevicePeak("NVIDIA T4", {"fp32": 8.1, "fp16": 65, "int8": 130}, 0.32)),
    ("MI325X", DevicePeak("AMD MI325X", _gpu(81.7, 163.4, 653.7, 1307.4, 2614.9, 2614.9), 6.0)),
    ("MI300X", DevicePeak("AMD MI300X", _gpu(81.7, 163.4, 653.7, 1307.4, 2614.9, 2614.9), 5.3)),
    (
        "MI250X",
        DevicePeak("AMD MI250X", {"fp64": 95.7, "fp32": 95.7, "bf16": 383, "fp16": 383}, 3.2),
    ),
)


def _names(key: str, device: str) -> bool:
    """``key`` stands in ``device`` as a model name: "A10" is not in "A100", "L4" not in
    "L40S"."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![0-9A-Za-z])", device) is not None


def lookup(device: str, override_tflops: float | None = None) -> DevicePeak | None:
    """The peaks of the device named ``device`` (torch's or the trace's name); with
    ``override_tflops`` (``PROFILED_PEAK_TFLOPS``) that figure for every dtype. None: unknown."""
    found = next((peak for key, peak in DEVICES if _names(key, device)), None)
    if override_tflops is not None:
        flat = dict.fromkeys(
            ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8"), override_tflops
        )
        bandwidth = found.bandwidth_tb_s if found is not None else 0.0
        return DevicePeak(f"PROFILED_PEAK_TFLOPS={override_tflops:g}", flat, bandwidth)
    return found
