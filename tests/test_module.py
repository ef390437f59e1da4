"""``instrument_module`` and ``@profiled`` on ``nn.Module`` classes, against real profiler
windows."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager

import pytest
import torch
from torch import nn

import instrument
from exporters import TraceFileExporter
from instrument import Schedule, instrument_module, profiled
from instrument.testing import capture, process_status
from tests.conftest import counting_ambient

pytestmark = pytest.mark.filterwarnings("error::instrument.ProfilerWarning")

NEVER = Schedule(skip_first=10**6)  # counts steps, never opens a window


class Block(nn.Module):
    def __init__(self, n: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n, 2 * n)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * n, n)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, n: int = 8, blocks: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(n) for _ in range(blocks))
        self.head = nn.Linear(n, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


ALL = (
    "Net",
    "layers",
    "layers.0",
    "layers.0.fc1",
    "layers.0.act",
    "layers.0.fc2",
    "layers.1",
    "layers.1.fc1",
    "layers.1.act",
    "layers.1.fc2",
    "head",
)


@contextmanager
def recording(**fields):
    """One window that records exactly the block (steps declared by hand)."""
    with capture(schedule=Schedule(wait=0, warmup=1, active=1), **fields) as cap:
        cap.step()
        yield cap
        cap.step()
    assert len(cap.reports) == 1, cap.exporter.notices


def hook_dicts(module):
    """Every per-module hook dict torch keeps, copied (key -> hook object)."""
    return {
        name: dict(getattr(module, name))
        for name in (
            "_forward_pre_hooks",
            "_forward_pre_hooks_with_kwargs",
            "_forward_hooks",
            "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called",
        )
    }


def trace_events(report):
    with open(report.trace_file, encoding="utf-8") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


# ------------------------------------------------------------------------ names and nesting


def test_every_submodule_gets_a_range_named_by_its_path_nested_like_the_model(tmp_path):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(4, 8)
    expected = model(x)
    handle = instrument_module(model)
    assert handle.names == ALL
    with recording(exporters=[TraceFileExporter(str(tmp_path), gzip=False)]) as cap:
        for _ in range(3):
            torch.testing.assert_close(model(x), expected)
    report = cap.reports[0]
    # ModuleList is a container and is never called: it has no range; everything else ran 3x
    assert "layers" not in report.ranges
    assert {n: report.ranges[n].calls for n in ALL if n != "layers"} == {
        n: 3 for n in ALL if n != "layers"
    }
    assert report.ranges["Net"].cpu_time_us >= report.ranges["layers.0"].cpu_time_us
    assert report.ranges["layers.0"].cpu_time_us >= report.ranges["layers.0.fc1"].cpu_time_us

    events = trace_events(report)

    def spans(name):
        found = [e for e in events if e["name"] == name]
        assert found and all(e["cat"] == "user_annotation" for e in found), name
        return [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in found]

    def inside(child, parent):
        for c0, c1 in spans(child):
            assert any(p0 <= c0 and c1 <= p1 for p0, p1 in spans(parent)), (child, parent)

    inside("layers.0", "Net")
    inside("layers.1.fc2", "layers.1")
    inside("head", "Net")
    addmm = [e for e in events if e["name"] == "aten::addmm"]
    assert len(addmm) == 3 * 5  # the Linear layers' kernels run inside their ranges
    for e in addmm:
        t0, t1 = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        assert any(
            p0 <= t0 and t1 <= p1
            for name in ("layers.0.fc1", "layers.0.fc2", "layers.1.fc1", "layers.1.fc2", "head")
            for p0, p1 in spans(name)
        )


def test_prefix_depth_include_and_exclude_select_modules():
    model = Net()
    with instrument_module(model, prefix="net", depth=1) as h:
        assert h.names == ("net", "net.layers", "net.head")
    with instrument_module(model, depth=0) as h:
        assert h.names == ("Net",)
    with instrument_module(model, include="layers.*.fc?") as h:
        assert h.names == ("Net", "layers.0.fc1", "layers.0.fc2", "layers.1.fc1", "layers.1.fc2")
    with instrument_module(model, include=[nn.GELU, "head"]) as h:
        assert h.names == ("Net", "layers.0.act", "layers.1.act", "head")
    with instrument_module(model, include=nn.Linear, exclude=["*.fc2", "head"]) as h:
        assert h.names == ("Net", "layers.0.fc1", "layers.1.fc1")
    assert all(hook_dicts(m) == hook_dicts(nn.Linear(1, 1)) for m in model.modules())


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: instrument_module(lambda x: x), "takes an nn.Module, got function"),
        (lambda: instrument_module(Net(), prefix=""), "prefix must be a non-empty string"),
        (lambda: instrument_module(Net(), depth=-1), "depth must be an int >= 0"),
        (lambda: instrument_module(Net(), depth=True), "depth must be an int >= 0"),
        (lambda: instrument_module(Net(), include=3), "glob patterns over module paths"),
        (lambda: instrument_module(Net(), exclude=[int]), "or nn.Module subclasses"),
        (lambda: instrument_module(Net(), step=1), "step must be a bool"),
    ],
)
def test_bad_arguments_raise_at_once_naming_what_was_wrong(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


# -------------------------------------------------------------------- remove / twice / user hooks


def test_remove_restores_the_hook_dicts_with_the_users_own_hooks_present():
    torch.manual_seed(0)
    model = Net()
    seen = []

    def user_pre(module, args):
        seen.append("pre")
        return (args[0] * 2,)

    def user_post_kwargs(module, args, kwargs, out):
        seen.append("post")
        return out + 1

    def user_always(module, args, out):
        seen.append("always")

    model.register_forward_pre_hook(user_pre)
    model.register_forward_hook(user_post_kwargs, with_kwargs=True)
    model.layers[0].fc1.register_forward_hook(user_always, always_call=True)
    before = {name: hook_dicts(m) for name, m in model.named_modules()}
    x = torch.randn(4, 8)
    expected = model(x)
    assert seen == ["pre", "always", "post"]

    handle = instrument_module(model)
    seen.clear()
    with recording() as cap:
        torch.testing.assert_close(model(x), expected)
    assert seen == ["pre", "always", "post"]  # the user's hooks ran, in order, with effect
    assert cap.reports[0].ranges["layers.0.fc1"].calls == 1
    handle.remove()
    handle.remove()  # twice: nothing more happens
    assert {name: hook_dicts(m) for name, m in model.named_modules()} == before
    with recording() as cap:
        torch.testing.assert_close(model(x), expected)
    assert not any(name in cap.reports[0].ranges for name in ALL)
    # removed modules can be instrumented again
    with instrument_module(model) as again:
        assert again.names == ALL


def test_disabled_adds_no_hook_but_still_checks_its_arguments(monkeypatch):
    monkeypatch.setenv("PROFILED_ENABLED", "0")
    model = Net()
    handle = instrument_module(model)
    assert len(handle) == 0 and handle.names == ()
    assert all(hook_dicts(m) == hook_dicts(nn.Linear(1, 1)) for m in model.modules())
    with pytest.raises(ValueError, match="depth must be"):
        instrument_module(model, depth=-2)


def test_instrumenting_twice_adds_nothing():
    model = Net()
    first = instrument_module(model)
    second = instrument_module(model, prefix="other")
    inner = instrument_module(model.layers[0])
    assert len(second) == 0 and len(inner) == 0
    assert second.already_instrumented[:2] == ("other", "other.layers")
    with recording() as cap:
        model(torch.randn(2, 8))
    ranges = cap.reports[0].ranges
    assert ranges["layers.0.fc1"].calls == 1 and "other" not in ranges
    assert "Block" not in ranges
    second.remove()  # removes nothing of the first handle's
    with recording() as cap:
        model(torch.randn(2, 8))
    assert cap.reports[0].ranges["layers.0.fc1"].calls == 1
    first.remove()
    assert all(hook_dicts(m) == hook_dicts(nn.Linear(1, 1)) for m in model.modules())


def test_a_module_can_be_pickled_and_deep_copied_while_instrumented(tmp_path):
    import copy

    model = Net()
    with instrument_module(model):
        clone = copy.deepcopy(model)
        path = tmp_path / "model.pt"
        torch.save(model, path)
        loaded = torch.load(path, weights_only=False)
    x = torch.randn(2, 8)
    torch.testing.assert_close(clone(x), model(x))
    torch.testing.assert_close(loaded(x), model(x))


# ------------------------------------------------------------------------ exceptions


class Boom(nn.Module):
    def __init__(self, exc):
        super().__init__()
        self.exc = exc
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.fc(x)
        raise self.exc


def _wrapper_of(child):
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = child

        def forward(self, x):
            return self.inner(x)

    return Outer()


def test_a_forward_that_raises_closes_its_ranges_and_the_same_exception_propagates():
    err = ValueError("bad batch")
    model = _wrapper_of(Boom(err))
    instrument_module(model)
    with recording() as cap:
        for _ in range(2):
            with pytest.raises(ValueError) as info:
                model(torch.randn(2, 4))
            assert info.value is err
            assert process_status().open_modules == 0
            assert process_status().depth == 0
    ranges = cap.reports[0].ranges
    assert ranges["Outer"].calls == ranges["inner"].calls == ranges["inner.fc"].calls == 2


def test_a_keyboard_interrupt_in_a_forward_leaves_no_range_or_depth_open():
    """torch runs always_call hooks only for Exception: the next forward cleans up."""
    boom = Boom(KeyboardInterrupt())
    model = _wrapper_of(boom)
    instrument_module(model)
    with counting_ambient() as sess:  # root calls end steps: the hooks track depth
        with pytest.raises(KeyboardInterrupt):
            model(torch.randn(2, 4))
        assert process_status().open_modules == 2  # Outer and inner never reached their hook
        boom.exc = None
        boom.forward = lambda x: boom.fc(x)
        model(torch.randn(2, 4))
        assert process_status().open_modules == 0
        assert process_status().depth == 0
        model(torch.randn(2, 4))
        assert sess.step_index == 2  # the two completed forwards were root calls


# ------------------------------------------------------------------------ steps


def test_the_models_forward_is_a_root_call_and_submodules_never_end_steps():
    model = Net()
    instrument_module(model, include="layers.*.fc1")
    with counting_ambient() as sess:  # where root calls end steps
        for _ in range(5):
            model(torch.randn(2, 8))
        assert sess.step_index == 5  # one step per forward, not one per module

        @profiled("train_step")
        def train_step():
            return model(torch.randn(2, 8))

        for _ in range(3):
            train_step()  # the forward inside is no root call
        assert sess.step_index == 8


def test_only_selected_blocks_end_no_steps_when_the_model_is_not_the_root():
    model = Net()
    instrument_module(model.layers[0])
    instrument_module(model.layers[1])
    with counting_ambient() as sess:  # where root calls end steps
        model(torch.randn(2, 8))
        # two instrumented roots ran side by side: two root calls, like two decorated calls
        assert sess.step_index == 2
        instrument.step()  # the last root call's boundary (no other), and steps declared
        assert sess.step_index == 2
        model(torch.randn(2, 8))  # root calls end no more steps
        assert sess.step_index == 2
        instrument.step()
        assert sess.step_index == 3


def test_step_true_ends_a_step_per_forward_even_with_steps_declared():
    model = Net()
    instrument_module(model, step=True)
    with capture(schedule=Schedule(wait=1, warmup=1, active=2)) as cap:
        for _ in range(4):
            model(torch.randn(2, 8))
    assert [r.steps for r in cap.reports] == [(2, 3)]
    assert cap.reports[0].ranges["Net"].calls == 2


# ------------------------------------------------------------------------ modes


@pytest.mark.parametrize("state", ["idle", "counting", "recording"])
def test_torch_compile_fullgraph_adds_no_graph_break(state):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(4, 8)
    expected = model(x)
    instrument_module(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    if state == "idle":
        instrument.shutdown()
        torch.testing.assert_close(compiled(x), expected)
    elif state == "counting":
        with counting_ambient():
            torch.testing.assert_close(compiled(x), expected)
    else:
        with recording():
            torch.testing.assert_close(compiled(x), expected)
    assert process_status().open_modules == 0


def test_a_compiled_model_is_not_recompiled_when_the_sdk_changes_state():
    """The hooks ask ``is_compiling()`` before any SDK flag, so Dynamo guards on none of them."""
    from torch._dynamo.utils import counters

    model = Net()
    instrument_module(model)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(2, 8)
    compiled(x)  # ambient session, counting
    with capture(schedule=NEVER):
        compiled(x)
    with recording():
        compiled(x)
    instrument.shutdown()  # idle
    compiled(x)
    assert counters["stats"]["unique_graphs"] == 1


def test_step_true_model_compiled_fullgraph_still_ends_its_steps():
    model = Net()
    instrument_module(model, step=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with capture(schedule=NEVER) as cap:
        for _ in range(3):
            compiled(torch.randn(2, 8))
        assert cap.session.step_index == 3


def test_idle_hooks_keep_no_state():
    model = Net()
    instrument_module(model)
    instrument.shutdown()
    assert process_status().calls_idle
    model(torch.randn(2, 8))
    assert process_status().open_modules == 0 and process_status().depth == 0


def test_ranges_appear_in_the_users_own_profiler():
    model = Net()
    instrument_module(model)
    instrument.shutdown()  # no session: only the user's profiler records
    with torch.profiler.profile() as prof:
        model(torch.randn(2, 8))
    names = [e.name for e in prof.events()]
    assert names.count("layers.1.fc2") == 1 and names.count("Net") == 1


def test_threads_record_their_own_nesting():
    """With every thread recorded (``all_threads``; safe here: the window starts before the
    threads run and stops after they end), each thread's module ranges nest on their own."""
    model = Net()
    instrument_module(model)
    errors = []

    def work():
        try:
            for _ in range(5):
                model(torch.randn(2, 8))
            assert process_status().open_modules == 0
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with recording(all_threads=True) as cap:
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert cap.reports[0].ranges["layers.0.fc1"].calls == 15


# ------------------------------------------------------------------------ @profiled on a class


def test_profiled_on_a_module_class_profiles_its_forward():
    @profiled("mlp")
    class MLP(nn.Module):
        """A two-layer MLP."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).relu()

    @profiled
    class Plain(nn.Linear):  # forward inherited from nn.Linear
        pass

    assert isinstance(MLP, type) and MLP.__doc__ == "A two-layer MLP."
    mlp, plain = MLP(), Plain(4, 4)
    assert isinstance(mlp, nn.Module) and list(mlp.state_dict()) == ["fc.weight", "fc.bias"]
    x = torch.randn(2, 4)
    with recording() as cap:
        for _ in range(2):
            torch.testing.assert_close(mlp(x), mlp.fc(x).relu())
            plain(x)
    ranges = cap.reports[0].ranges
    assert ranges["mlp"].calls == 2
    name = "test_profiled_on_a_module_class_profiles_its_forward.<locals>.Plain"
    assert ranges[name].calls == 2
    assert nn.Linear.forward is not Plain.forward  # nn.Linear itself is left alone


def test_profiled_step_true_on_a_module_class_ends_steps_and_disabled_returns_it_unchanged(
    monkeypatch,
):
    @profiled("net", step=True)
    class Stepper(nn.Module):
        def forward(self, x):
            return x + 1

    with capture(schedule=NEVER) as cap:
        Stepper()(torch.ones(1))
        Stepper()(torch.ones(1))
        assert cap.session.step_index == 2

    monkeypatch.setenv("PROFILED_ENABLED", "0")

    class Off(nn.Module):
        def forward(self, x):
            return x

    original = Off.forward
    assert profiled("off")(Off) is Off and Off.forward is original


# ------------------------------------------------------------------------ on a GPU


@pytest.mark.cuda
def test_module_ranges_get_the_device_time_of_their_kernels_on_cuda():
    torch.manual_seed(0)
    model = Net(n=256).cuda()
    x = torch.randn(512, 256, device="cuda")
    model(x)
    torch.cuda.synchronize()
    instrument_module(model)
    with recording() as cap:
        for _ in range(3):
            model(x)
    ranges = cap.reports[0].ranges
    for name in ("layers.0.fc1", "layers.1.fc2", "head"):
        assert ranges[name].calls == 3
        assert ranges[name].kernel_launches >= 3 and ranges[name].device_time_us > 0, name
    # a block's kernels are its layers' kernels plus its own residual add
    block = ranges["layers.0"]
    parts = sum(ranges[f"layers.0.{p}"].device_time_us for p in ("fc1", "act", "fc2"))
    assert parts - 1e-3 <= block.device_time_us <= ranges["Net"].device_time_us + 1e-3
