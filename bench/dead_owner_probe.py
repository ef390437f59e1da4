"""Probe (GPU run of issue 15): a thread-local profiler whose thread ended, then the SDK's
recovery, then a new window: which torch call fails on this torch, with what."""

import threading
import traceback

import torch
from torch.profiler import ProfilerActivity, profile

acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
box = []


def run():
    p = profile(activities=acts)
    p.start()
    torch.ones(3, device="cuda" if len(acts) > 1 else "cpu") + 1
    box.append(p)


t = threading.Thread(target=run)
t.start()
t.join()
torch.autograd.profiler._is_profiler_enabled = False
for what in ("clear-cpu", "window1", "window2"):
    try:
        p = profile(activities=[ProfilerActivity.CPU] if what == "clear-cpu" else acts)
        p.start()
        torch.ones(3) + 1
        p.stop()
        print(what, "ok", len(p.events()))
    except Exception:
        print(what, "raised:")
        traceback.print_exc()
print("end")
