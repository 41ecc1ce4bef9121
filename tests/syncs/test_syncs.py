"""Sync detection on the CPU: attribution, source lines, kinds and global state, driven by a
fake torch (a library module whose "tensors" fire the same hooks torch fires at a sync)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch._utils import CallbackRegistry

import cudatimer
from cudatimer import SyncSite, Timer
from cudatimer.core import _device
from cudatimer.features import _syncs

FAKE_LIBRARY = '''
"""Stands in for torch: each op reports its sync the way torch does."""
import warnings

TRACE = {}  # mechanism -> CallbackRegistry, fired only while ACTIVE (torch: once activated)
ACTIVE = [False]
MODE = [0]  # sync debug mode: 0 default, 1 warn


def _sync(mechanism):
    if mechanism == "stream" and MODE[0] == 1:
        warnings.warn(
            "called a synchronizing CUDA operation (Triggered internally at fake.cpp:1.)",
            UserWarning,
        )
    if ACTIVE[0]:
        TRACE[mechanism].fire_callbacks(*(() if mechanism == "device" else (7,)))


class Tensor:
    def item(self):
        _sync("stream")
        return 0.0

    def cpu(self):
        _sync("stream")
        return self

    def tolist(self):
        _sync("stream")
        return []

    def __bool__(self):
        _sync("stream")
        return True

    def __getitem__(self, key):
        _sync("stream")
        return self


class Stream:
    def synchronize(self):
        _sync("stream")


class Event:
    def synchronize(self):
        _sync("event")


def synchronize():
    _sync("device")


def show(t):
    """Like print(tensor): a library call that syncs twice inside."""
    t.item()
    t.item()


def drain(timeout_s):
    _sync("stream")
    return 0
'''

SOURCE = Path(__file__).read_text().splitlines()


def site(marker: str) -> str:
    """``file:line`` of the line of this file that ends with ``# SITE:<marker>``."""
    hits = [n for n, text in enumerate(SOURCE, 1) if text.endswith(f"# SITE:{marker}")]
    assert len(hits) == 1, marker
    return f"{__file__}:{hits[0]}"


@dataclass
class Fake:
    lib: Any
    registries: dict[str, Any]
    activations: list[int]


@pytest.fixture(scope="module")
def fake_module(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    folder = tmp_path_factory.mktemp("fake_torch")
    path = folder / "fake_torch_ops.py"
    path.write_text(textwrap.dedent(FAKE_LIBRARY))
    spec = importlib.util.spec_from_file_location("fake_torch_ops", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake(fake_module: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    """CUDA 'available', torch's trace hooks and sync debug mode replaced by the fake's."""
    lib = fake_module
    lib_dir = str(Path(lib.__file__).parent) + "/"
    monkeypatch.setattr(_syncs, "LIBRARY_DIRS", [*_syncs.LIBRARY_DIRS, lib_dir])
    monkeypatch.setattr(_syncs, "_file_kind", {})
    monkeypatch.setattr(_syncs, "_cuda_usable", lambda: True)
    registries = {m: CallbackRegistry(m) for m in ("device", "stream", "event")}
    others = [CallbackRegistry("event record"), CallbackRegistry("memory allocation")]
    lib.TRACE.clear()
    lib.TRACE.update(registries)
    lib.ACTIVE[0] = False
    lib.MODE[0] = 0
    activations: list[int] = []

    def activate() -> None:
        activations.append(1)
        lib.ACTIVE[0] = True

    def find_trace() -> _syncs.TraceHooks:
        return _syncs.TraceHooks(activate, registries, [*registries.values(), *others])

    def set_mode(mode: int | str) -> None:
        lib.MODE[0] = {"default": 0, "warn": 1, "error": 2}.get(mode, mode)  # type: ignore[call-overload]

    monkeypatch.setattr(_syncs, "find_trace", find_trace)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: lib.MODE[0])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    yield Fake(lib, registries, activations)
    cudatimer.detect_syncs(False)  # while the fakes are still in place


def sites_of(timer: Timer) -> set[SyncSite]:
    return set(timer.summary().sync_sites)


def test_sync_is_counted_in_the_innermost_region_at_the_user_line(fake: Fake) -> None:
    """A sync counts once, against the innermost open region, at the test's own line."""
    timer = Timer(name="nested")
    t = fake.lib.Tensor()
    with cudatimer.detect_syncs(timer=timer):
        with timer.region("outer"):
            with timer.region("inner"):
                t.item()  # SITE:inner-item
            t.cpu()  # SITE:outer-cpu
        t.item()  # outside every region: not counted
    s = timer.summary()
    assert (s["outer"].syncs, s["outer/inner"].syncs) == (1, 1)
    assert set(s.sync_sites) == {
        SyncSite(site("inner-item"), "item", "outer/inner", 1),
        SyncSite(site("outer-cpu"), "cpu", "outer", 1),
    }


def test_repeated_syncs_at_one_line_add_up(fake: Fake) -> None:
    """A sync in a loop is one site whose count is the number of iterations."""
    timer = Timer(name="loop")
    t = fake.lib.Tensor()
    with cudatimer.detect_syncs(timer=timer):
        for _ in range(5):
            with timer.region("step"):
                t.item()  # SITE:loop
    assert timer.summary()["step"].syncs == 5
    assert sites_of(timer) == {SyncSite(site("loop"), "item", "step", 5)}


def test_sync_is_counted_on_the_thread_that_caused_it(fake: Fake) -> None:
    """A worker's sync goes to the worker's region, never to a region open on another thread."""
    timer = Timer(name="threads")
    t = fake.lib.Tensor()

    def worker() -> None:
        t.item()  # no region open on this thread: not counted against "main"
        with timer.region("worker"):
            t.item()  # SITE:worker

    with cudatimer.detect_syncs(timer=timer), timer.region("main"):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    s = timer.summary()
    assert (s["main"].syncs, s["worker"].syncs) == (0, 1)
    assert set(s.sync_sites) == {SyncSite(site("worker"), "item", "worker", 1)}


def test_every_live_timer_or_only_the_chosen_one(fake: Fake) -> None:
    """Without timer= every Timer with an open region counts; with it only that Timer."""
    a, b = Timer(name="a"), Timer(name="b")
    t = fake.lib.Tensor()
    with a.region("ra"), b.region("rb"):
        with cudatimer.detect_syncs():
            t.item()
        with cudatimer.detect_syncs(timer=a):
            t.item()
    assert (a.summary()["ra"].syncs, b.summary()["rb"].syncs) == (2, 1)


def test_disabled_timer_counts_nothing(fake: Fake) -> None:
    """A disabled Timer records no syncs, as it records no times."""
    timer = Timer(name="off", enabled=False)
    with cudatimer.detect_syncs(timer=timer), timer.region("r"):
        fake.lib.Tensor().item()
    assert not timer.summary().sync_sites


def test_kind_names_the_call_or_the_mechanism(fake: Fake) -> None:
    """Kinds: the call at the user's line, a truth test, a subscript, or the sync mechanism."""
    lib = fake.lib
    timer = Timer(name="kinds")
    t = lib.Tensor()
    with cudatimer.detect_syncs(timer=timer), timer.region("r"):
        lib.synchronize()  # SITE:device
        lib.Event().synchronize()  # SITE:event
        lib.Stream().synchronize()  # SITE:stream
        if t:  # SITE:bool
            pass
        _ = t[0]  # SITE:index
        lib.show(t)  # SITE:show
        _ = [t.tolist()]  # SITE:tolist
    assert sites_of(timer) == {
        SyncSite(site("device"), "synchronize", "r", 1),
        SyncSite(site("event"), "event.synchronize", "r", 1),
        SyncSite(site("stream"), "stream.synchronize", "r", 1),
        SyncSite(site("bool"), "bool", "r", 1),
        SyncSite(site("index"), "index", "r", 1),
        SyncSite(site("show"), "show", "r", 2),
        SyncSite(site("tolist"), "tolist", "r", 1),
    }


def test_kind_of_a_call_spread_over_lines(fake: Fake) -> None:
    """A call written over several lines is still named by its function."""
    timer = Timer(name="multiline")
    t = fake.lib.Tensor()
    with cudatimer.detect_syncs(timer=timer), timer.region("r"):
        fake.lib.show(  # SITE:multi-first
            t,
        )  # SITE:multi-last
    (found,) = timer.summary().sync_sites
    first = int(site("multi-first").rsplit(":", 1)[1])
    last = int(site("multi-last").rsplit(":", 1)[1])
    path, line = found.location.rsplit(":", 1)
    assert (path, found.kind, found.count) == (__file__, "show", 2)
    assert first <= int(line) <= last


def test_library_function_timed_by_cudatimer_counts_at_its_caller(fake: Fake) -> None:
    """cudatimer's wrappers are looked through: the sync is the caller's, in the wrapped region."""
    timer = Timer(name="wrapped")
    show = timer.timed(fake.lib.show)
    with cudatimer.detect_syncs(timer=timer):
        show(fake.lib.Tensor())  # SITE:wrapped
    assert timer.summary()["show"].syncs == 2
    assert sites_of(timer) == {SyncSite(site("wrapped"), "show", "show", 2)}


def test_cudatimer_own_waits_are_never_counted(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync made by cudatimer's report code is not counted; the same call by the user is."""
    timer = Timer(name="own")
    monkeypatch.setattr(_device, "drain", fake.lib.drain)
    with cudatimer.detect_syncs(timer=timer), timer.region("outer"):
        timer.summary()  # drains through the fake: a sync from cudatimer's own frame
        fake.lib.drain(0.0)  # SITE:user-drain
    assert sites_of(timer) == {SyncSite(site("user-drain"), "drain", "outer", 1)}


def test_nothing_is_counted_once_detection_is_off(fake: Fake) -> None:
    """After detection stops, syncs inside regions leave no trace."""
    timer = Timer(name="after")
    with cudatimer.detect_syncs(timer=timer):
        pass
    with timer.region("r"):
        fake.lib.Tensor().item()
        fake.lib.synchronize()
    assert timer.summary()["r"].syncs == 0 and not timer.summary().sync_sites


def test_trace_source_adds_its_callbacks_once_and_removes_only_its_own(fake: Fake) -> None:
    """Switching on twice registers one callback per registry; switching off restores them."""

    def foreign(*args: object) -> None:
        return None

    for registry in fake.registries.values():
        registry.add_callback(foreign)
    before = {k: list(r.callback_list) for k, r in fake.registries.items()}
    first = cudatimer.detect_syncs()
    second = cudatimer.detect_syncs()
    assert (first.source, second.source) == ("trace", "trace")
    assert all(len(r.callback_list) == 2 for r in fake.registries.values())
    assert fake.activations  # torch's trace switched on
    cudatimer.detect_syncs(False)
    assert {k: list(r.callback_list) for k, r in fake.registries.items()} == before


def test_trace_is_switched_off_again_where_torch_allows_it(fake: Fake) -> None:
    """With a torch that can deactivate the trace, stopping does so when nobody else listens."""
    deactivated: list[int] = []
    hooks = _syncs.TraceHooks(
        lambda: None, fake.registries, list(fake.registries.values()), lambda: deactivated.append(1)
    )
    hooks.start()
    hooks.stop()
    assert deactivated == [1]
    fake.registries["event"].add_callback(lambda *a: None)  # another tool listens
    hooks.start()
    hooks.stop()
    assert deactivated == [1]


def test_debug_mode_source_counts_every_warning_and_restores_state(fake: Fake) -> None:
    """The public source counts each sync warning (none shown) and puts warnings and the mode
    back; it cannot see a device sync."""
    timer = Timer(name="debug")
    t = fake.lib.Tensor()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        filters_before = list(warnings.filters)
        show_before = warnings.showwarning
        with cudatimer.detect_syncs(timer=timer, source="debug_mode") as detection:
            assert (detection.source, fake.lib.MODE[0]) == ("debug_mode", 1)
            with timer.region("r"):
                for _ in range(3):
                    t.item()  # SITE:debug-loop
                fake.lib.synchronize()  # no warning for a device sync: not seen
                warnings.warn("unrelated", UserWarning, stacklevel=1)
        assert fake.lib.MODE[0] == 0
        assert warnings.filters == filters_before
        assert warnings.showwarning is show_before
    assert [str(w.message) for w in shown] == ["unrelated"]
    assert sites_of(timer) == {SyncSite(site("debug-loop"), "item", "r", 3)}
    assert not any(fake.registries[m].callback_list for m in fake.registries)


def test_debug_mode_keeps_the_mode_and_warnings_the_user_asked_for(fake: Fake) -> None:
    """A user who set the sync debug mode to "warn" keeps it, and still sees the warnings."""
    fake.lib.MODE[0] = 1
    timer = Timer(name="user-warn")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with cudatimer.detect_syncs(timer=timer, source="debug_mode"), timer.region("r"):
            fake.lib.Tensor().item()
    assert fake.lib.MODE[0] == 1
    assert timer.summary()["r"].syncs == 1
    assert any(str(w.message).startswith(_syncs.SYNC_WARNING) for w in shown)


def test_auto_falls_back_to_debug_mode_and_trace_is_refused_without_hooks(
    fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without torch's trace hooks, source="trace" raises and "auto" uses the debug mode."""
    monkeypatch.setattr(_syncs, "find_trace", lambda: None)
    with pytest.raises(RuntimeError, match="no GPU-trace hooks"):
        cudatimer.detect_syncs(source="trace")
    assert not _syncs._STATE.on
    with cudatimer.detect_syncs() as detection:
        assert detection.source == "debug_mode"


def test_context_manager_puts_the_previous_setting_back(fake: Fake) -> None:
    """Leaving a with block restores what was on before it: Timer choice, then off."""
    a, b = Timer(name="a"), Timer(name="b")
    t = fake.lib.Tensor()
    with a.region("ra"), b.region("rb"):
        with cudatimer.detect_syncs():
            with cudatimer.detect_syncs(timer=a):
                t.item()  # a only
            t.item()  # both again
        t.item()  # off
    assert (a.summary()["ra"].syncs, b.summary()["rb"].syncs) == (2, 1)
    assert not _syncs._STATE.on


def test_switching_source_stops_the_old_one(fake: Fake) -> None:
    """Going from the trace to the debug mode removes the trace callbacks, and back."""
    cudatimer.detect_syncs(source="trace")
    assert all(r.callback_list for r in fake.registries.values())
    cudatimer.detect_syncs(source="debug_mode")
    assert not any(r.callback_list for r in fake.registries.values())
    assert fake.lib.MODE[0] == 1
    cudatimer.detect_syncs(source="trace")
    assert fake.lib.MODE[0] == 0


def test_syncs_reach_the_summary_and_the_json_export(fake: Fake, tmp_path: Path) -> None:
    """Region sync counts and sync sites survive save() and load()."""
    timer = Timer(name="json")
    with cudatimer.detect_syncs(timer=timer), timer.region("r"):
        fake.lib.Tensor().cpu()  # SITE:json
    saved = timer.save(tmp_path / "s.json")
    loaded = cudatimer.load(str(tmp_path / "s.json"))
    assert loaded.sync_sites == saved.sync_sites == (SyncSite(site("json"), "cpu", "r", 1),)
    assert loaded["r"].syncs == 1


def test_without_cuda_detection_does_nothing_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No CUDA: one RuntimeWarning, nothing switched on, no global state touched."""
    monkeypatch.setattr(_syncs, "_cuda_usable", lambda: False)
    monkeypatch.setattr(_syncs, "_no_cuda_told", False)
    monkeypatch.setattr(_syncs, "find_trace", lambda: pytest.fail("looked for the trace"))
    filters, show = list(warnings.filters), warnings.showwarning
    with pytest.warns(RuntimeWarning, match="CUDA is not available"):
        detection = cudatimer.detect_syncs()
    assert (detection.active, detection.source, _syncs._STATE.on) == (False, None, False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with cudatimer.detect_syncs() as again:  # the second time: silent
            assert not again.active
    assert warnings.filters == filters and warnings.showwarning is show


def test_bad_arguments_are_refused() -> None:
    """enabled must be a bool, timer a Timer, source a known name."""
    with pytest.raises(TypeError, match="enabled must be a bool"):
        cudatimer.detect_syncs("yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"timer must be a cudatimer\.Timer"):
        cudatimer.detect_syncs(timer="default")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="source must be one of auto, trace, debug_mode"):
        cudatimer.detect_syncs(source="cupti")
    assert not _syncs._STATE.on


def test_real_torch_hooks_are_found_where_this_torch_has_them() -> None:
    """find_trace finds this torch's GPU-trace registries (torch >= 2.0 has them)."""
    hooks = _syncs.find_trace()
    if not hasattr(torch._C, "_activate_gpu_trace"):
        pytest.skip(f"torch {torch.__version__} has no GPU-trace hooks")
    assert hooks is not None
    assert set(hooks.registries) == {"device", "stream", "event"}
    assert all(r in hooks.every_registry for r in hooks.registries.values())
    assert sys.modules.get("torch.cuda._gpu_trace") or sys.modules.get("torch.utils._cuda_trace")
