"""Probe (GPU run of issue 15): a window started by a thread that then ends, on this torch
and device; later windows on the main thread must still record."""

import threading

import torch

from instrument import Schedule, profiled
from instrument.runtime import _torch
from instrument.testing import capture

dev = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.randn(512, 512, device=dev)


@profiled("w", step=True)
def w():
    return x @ x


with capture(schedule=Schedule(wait=1, warmup=1, active=2, repeat=3)) as cap:
    t = threading.Thread(target=lambda: [w() for _ in range(2)])
    t.start()
    t.join()
    print("after the thread's end: ours live", len(_torch._LIVE), flush=True)
    for _ in range(16):
        w()
print("reports", [(r.steps, r.ranges["w"].calls if "w" in r.ranges else 0) for r in cap.reports])
