"""Lightning integration: every action Lightning names becomes a GPU-timed region.

``CudaTimerProfiler`` plugs into ``Trainer(profiler=...)`` through Lightning's own
``Profiler`` interface: each ``start(action)``/``stop(action)`` (training step, backward,
optimizer step, validation, dataloader fetch, every hook) enters and exits a cudatimer
region named after the action, nested as Lightning nests them, so your own regions inside
``training_step`` nest under it too. Nothing waits for the GPU; ``summary()`` (Lightning
prints it at the end of ``fit``) resolves the times. ``CudaTimerCallback`` marks steps and
logs each finished step's region times through the trainer's loggers, as the run goes on.

    import lightning.pytorch as pl
    from cudatimer.lightning import CudaTimerCallback, CudaTimerProfiler

    trainer = pl.Trainer(profiler=CudaTimerProfiler(), callbacks=[CudaTimerCallback()])

With ``devices>1`` every rank times its own actions; the summary is the cross-rank table
(on rank 0), and with ``dirpath``/``filename`` each rank also writes its JSON file
(``{stage}-{filename}-rank{N}.json``, read by ``python -m cudatimer.distributed show``).
This module imports ``lightning`` (or, without it, ``pytorch_lightning``); ``import
cudatimer`` does not.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.profilers import Profiler, SimpleProfiler
except ImportError:  # the older package name; Trainer checks the base class of its own
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]
    from pytorch_lightning.profilers import Profiler, SimpleProfiler  # type: ignore[assignment]

from .features._feed import Sink, StepFeed, StepTimes
from .regions._timer import Region, Timer

__all__ = ["STEP_ACTION", "CudaTimerCallback", "CudaTimerProfiler"]

#: The action that is one training batch: the profiler marks a step when it stops.
STEP_ACTION = "run_training_batch"


def _default_timer() -> Timer:
    from .regions._timer import default_timer

    return default_timer()


def _check_timer(timer: object) -> Timer | None:
    if timer is not None and not isinstance(timer, Timer):
        raise TypeError(f"timer must be a cudatimer.Timer or None, got {type(timer).__name__}")
    return timer


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}")
    return value


def _region_name(action: str) -> str:
    """Lightning's action names become region names; '/' separates nesting levels in region
    paths, so a '/' in an action (a callback's state key may hold a path) becomes '|'."""
    return action.replace("/", "|") if action.strip() else "(unnamed action)"


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class CudaTimerProfiler(Profiler):
    """A Lightning profiler timing every action as a cudatimer region (GPU time on CUDA,
    host time without), never synchronizing.

    ``timer``: the cudatimer Timer the regions go to (default: the module's, so
    ``cudatimer.report()`` shows them with your own regions). ``mark_steps``: mark a
    cudatimer step each time a training batch ends (the ``run_training_batch`` action), so
    windows (``last=``, ``warmup=``) and per-step series work. ``all_ranks``: under
    ``devices>1`` the summary is the cross-rank table (every rank takes part, rank 0 gets
    the text). ``alongside``: another Lightning profiler (or ``"simple"`` for
    ``SimpleProfiler``) fed the same actions, its summary printed after this one: the
    host-clock numbers next to the GPU ones, on the same run. ``report_options``: options of
    ``cudatimer.report`` (``view`` is ``"tree"`` by default; ``fmt``, ``sort``, ``match``,
    ``min_share``, ``warmup``...).

    ``dirpath``/``filename`` as for Lightning's profilers: the text goes to
    ``{stage}-{filename}[-{local_rank}].txt`` (else to the log), and each rank's results are
    saved as ``{stage}-{filename}[-rank{N}].json`` next to it (``cudatimer show`` reads it).

    >>> from cudatimer.lightning import CudaTimerProfiler
    >>> profiler = CudaTimerProfiler()
    >>> with profiler.profile("run_training_batch"):
    ...     with profiler.profile("[Strategy]SingleDeviceStrategy.backward"):
    ...         pass
    >>> import cudatimer
    >>> cudatimer.summary()["run_training_batch/[Strategy]SingleDeviceStrategy.backward"].calls
    1
    >>> cudatimer.reset()
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        *,
        timer: Timer | None = None,
        mark_steps: bool = True,
        all_ranks: bool = True,
        alongside: Profiler | str | None = None,
        **report_options: Any,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.alongside: Profiler | None = None  # set first: Profiler.__del__ tears it down
        self._timer = _check_timer(timer)
        self.mark_steps = _check_bool("mark_steps", mark_steps)
        self.all_ranks = _check_bool("all_ranks", all_ranks)
        if alongside == "simple":
            alongside = SimpleProfiler(extended=True)
        elif alongside is not None and not isinstance(alongside, Profiler):
            raise TypeError(
                f'alongside must be a Lightning Profiler, "simple" or None, got {alongside!r}'
            )
        self.alongside = alongside
        self.report_options: dict[str, Any] = {"view": "tree", **report_options}
        self._regions: dict[str, Region] = {}
        self._open: list[tuple[str, Region]] = []
        self._warned_order = False

    @property
    def timer(self) -> Timer:
        """The Timer the actions are timed into."""
        return self._timer if self._timer is not None else _default_timer()

    # -- Lightning's Profiler interface -----------------------------------------------------
    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank=local_rank, log_dir=log_dir)
        if self.alongside is not None:
            self.alongside.setup(stage, local_rank=local_rank, log_dir=log_dir)

    def start(self, action_name: str) -> None:
        """Enter the action's region (made once per action name, then a dict hit)."""
        region = self._regions.get(action_name)
        if region is None:
            region = self._regions[action_name] = self.timer.region(_region_name(action_name))
        if self.alongside is not None:
            self.alongside.start(action_name)
        region.__enter__()
        self._open.append((action_name, region))

    def stop(self, action_name: str) -> None:
        """Exit the action's region; at the end of a training batch, mark a step."""
        opened = self._open
        at = len(opened) - 1
        while at >= 0 and opened[at][0] != action_name:
            at -= 1
        if at < 0:
            raise ValueError(
                f"Attempting to stop recording an action ({action_name}) which was never started."
            )
        _, region = opened.pop(at)
        try:
            region.__exit__(None, None, None)
        except RuntimeError as exc:  # stopped before an action started inside it: recorded
            if not self._warned_order:
                self._warned_order = True
                warnings.warn(f"{exc} (action {action_name!r})", RuntimeWarning, stacklevel=2)
        finally:
            if self.alongside is not None:
                self.alongside.stop(action_name)
        if self.mark_steps and action_name == STEP_ACTION:
            self.timer.step()

    def summary(self) -> str:
        """The report: cross-rank on rank 0 under ``devices>1`` (every rank must call it, as
        Lightning's teardown does), else this process's; the ``alongside`` profiler's after
        it. Also saves this rank's JSON when ``dirpath`` and ``filename`` are set."""
        rank, world = _world()
        if self.dirpath is not None and self.filename:
            self._save(rank, world)
        out = io.StringIO()
        if world > 1 and self.all_ranks:
            from .distributed import report

            text = report(self.timer, file=out, **self.report_options)
        else:
            text = self.timer.report(file=out, **self.report_options)
        if self.alongside is not None:
            other = self.alongside.summary()
            if other:
                text = f"{text}\n\n{other}" if text else other
        return text

    def teardown(self, stage: str | None) -> None:
        if self.alongside is not None:
            self.alongside.teardown(stage)
        super().teardown(stage)

    # -- inside -------------------------------------------------------------------------------
    def _save(self, rank: int, world: int) -> None:
        from .distributed import save

        parts = [p for p in (self._stage, self.filename) if p]
        if world > 1:
            parts.append(f"rank{rank}")
        path = os.path.join(os.fspath(self.dirpath or "."), "-".join(parts) + ".json")
        save(path, self.timer)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable for ``strategy="ddp_spawn"`` (the trainer travels to each process):
        regions and open actions are per process, made again there. A Timer cannot travel;
        with the default one, each process times into its own default Timer."""
        if self._timer is not None:
            raise TypeError(
                "CudaTimerProfiler(timer=...) cannot be sent to another process (a Timer holds "
                "per-process state); with ddp_spawn, leave timer unset: each process then times "
                "into its own default Timer"
            )
        state = dict(self.__dict__)
        state.update(_regions={}, _open=[], _output_file=None, _write_stream=None)
        return state


class CudaTimerCallback(Callback):
    """Marks a cudatimer step at the end of each training batch and sends each finished
    step's region times (``StepTimes.scalars(prefix)``, plus ``{prefix}step``) to every
    logger of the trainer (``logger.log_metrics(..., step=trainer.global_step)`` of that
    batch), as the GPU finishes them: a step or two behind, never waiting. Extra ``sinks``
    (callables taking a ``cudatimer.StepTimes``, e.g. ``cudatimer.sinks.tensorboard(w)``)
    get every step too. At the end of training it waits at most ``flush_timeout_s`` for the
    last steps.

    ``mark_steps``: None (default) marks steps unless the trainer's profiler is a
    ``CudaTimerProfiler`` on the same Timer that marks them already. ``log``: False sends to
    ``sinks`` only. ``match``: only regions whose path matches this glob. Loggers write on
    rank 0 only (Lightning's rule); ``sinks`` are called on every rank.
    """

    def __init__(
        self,
        *sinks: Sink,
        timer: Timer | None = None,
        mark_steps: bool | None = None,
        log: bool = True,
        match: str | None = None,
        prefix: str = "cudatimer/",
        flush_timeout_s: float = 60.0,
    ) -> None:
        super().__init__()
        self._timer = _check_timer(timer)
        if mark_steps is not None:
            _check_bool("mark_steps", mark_steps)
        self.mark_steps = mark_steps
        self.log = _check_bool("log", log)
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if isinstance(flush_timeout_s, bool) or not isinstance(flush_timeout_s, (int, float)):
            raise TypeError(
                f"flush_timeout_s must be a number of seconds, got {type(flush_timeout_s).__name__}"
            )
        self.prefix = prefix
        self.flush_timeout_s = float(flush_timeout_s)
        self.match = match
        self.sinks = sinks
        StepFeed(*sinks, timer=self.timer, match=match)  # checks sinks and match now
        self.feed: StepFeed | None = None
        self._marks = True
        self._trainer: Any = None
        self._global_step: dict[int, int] = {}  # cudatimer step -> trainer.global_step

    @property
    def timer(self) -> Timer:
        return self._timer if self._timer is not None else _default_timer()

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        profiler = trainer.profiler
        profiler_marks = (
            isinstance(profiler, CudaTimerProfiler)
            and profiler.mark_steps
            and profiler.timer is self.timer
        )
        self._marks = not profiler_marks if self.mark_steps is None else self.mark_steps
        self._trainer = trainer
        if self.feed is None:
            sinks = (*self.sinks, self._to_loggers) if self.log else self.sinks
            self.feed = StepFeed(*sinks, timer=self.timer, match=self.match)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        feed = self.feed
        if feed is None:
            return
        if self._marks:
            self.timer.step()
        self._global_step[self.timer.recorder.store.step - 1] = int(trainer.global_step)
        feed.poll()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.feed is not None:
            self.feed.close(self.flush_timeout_s)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._trainer = None

    def _to_loggers(self, times: StepTimes) -> None:
        global_step = self._global_step.pop(times.step, None)
        trainer = self._trainer
        if trainer is None or not times.rows:
            return
        metrics = times.scalars(self.prefix)
        metrics[f"{self.prefix}step"] = times.step
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=global_step)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable for ``strategy="ddp_spawn"``: the feed is made again in each process."""
        if self._timer is not None:
            raise TypeError(
                "CudaTimerCallback(timer=...) cannot be sent to another process; with "
                "ddp_spawn, leave timer unset (each process feeds its own default Timer)"
            )
        state = dict(self.__dict__)
        state.update(feed=None, _trainer=None, _global_step={})
        return state
