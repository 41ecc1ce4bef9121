"""Sinks for :class:`cudatimer.StepFeed`: where finished steps' region times go.

A sink is any callable taking a :class:`cudatimer.StepTimes`; these adapters write one to a
dashboard. Neither imports its library until it is called for (TensorBoard's writer is
passed in; wandb is an optional dependency)::

    from torch.utils.tensorboard import SummaryWriter
    import cudatimer, cudatimer.sinks

    feed = cudatimer.StepFeed(cudatimer.sinks.tensorboard(SummaryWriter("runs/x")))
    for batch in loader:
        with cudatimer.cuda_region("train_step"):
            ...
        feed.step()          # marks the step; sends the steps the GPU has finished
    feed.close()
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .features._feed import Sink, StepTimes
from .features._live import Live, live_sink

if TYPE_CHECKING:
    from .regions._timer import Timer

__all__ = ["Live", "Sink", "StepTimes", "live", "tensorboard", "wandb"]


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    return prefix


def tensorboard(writer: Any, *, prefix: str = "cudatimer/") -> Sink:
    """A sink writing each step's scalars (``StepTimes.scalars(prefix)``) to a
    ``torch.utils.tensorboard.SummaryWriter`` (or anything with its ``add_scalar(tag,
    value, global_step)``), at ``global_step`` = the cudatimer step. The writer flushes on
    its own schedule; nothing here waits on it.

    >>> import cudatimer, cudatimer.sinks
    >>> class Writer:  # a stand-in with SummaryWriter's add_scalar
    ...     def add_scalar(self, tag, value, global_step=None):
    ...         print(tag, global_step)
    >>> sink = cudatimer.sinks.tensorboard(Writer())
    >>> sink(cudatimer.StepTimes(3, ()))   # no regions: nothing written
    """
    add_scalar = getattr(writer, "add_scalar", None)
    if not callable(add_scalar):
        raise TypeError(
            f"writer must be a torch.utils.tensorboard.SummaryWriter (something with "
            f"add_scalar(tag, value, global_step)), got {type(writer).__name__}"
        )
    head = _check_prefix(prefix)
    batched = _one_event_per_step(writer)

    def to_tensorboard(times: StepTimes) -> None:
        scalars = times.scalars(head)
        if not scalars:
            return
        if batched is not None:
            batched(scalars, times.step)
            return
        for tag, value in scalars.items():
            add_scalar(tag, value, global_step=times.step)

    return to_tensorboard


def _one_event_per_step(writer: Any) -> Any:
    """For a real SummaryWriter: write a step's scalars as one event of many values. One
    ``add_scalar`` per value cost ~4.5 ms a step for 248 values on the H200's host (1.11x a
    GPT-2-small step, docs/benchmarks.md); one event of 248 values is 13-20x cheaper (measured
    on the CPU machine). None where the writer is not one (``add_scalar`` is used then)."""
    file_writer = getattr(writer, "file_writer", None)
    add_summary = getattr(file_writer, "add_summary", None)
    if not callable(add_summary):
        return None
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
    except ImportError:
        return None

    def write(scalars: dict[str, float], step: int) -> None:
        values = [Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        current = getattr(writer, "file_writer", None)  # None once the writer is closed
        if current is None:
            raise RuntimeError("the SummaryWriter is closed")
        current.add_summary(Summary(value=values), step)

    return write


def wandb(run: Any = None, *, prefix: str = "cudatimer/") -> Sink:
    """A sink logging each step's scalars to a wandb run (``run``, default: the current
    ``wandb.run`` when the first step arrives), against its own x-axis ``{prefix}step``.

    Finished steps arrive behind the run's own steps (the GPU is behind the host), and
    wandb drops values logged with a ``step=`` lower than its current one: so the values are
    logged without ``step=``, with ``{prefix}step`` set to the cudatimer step and declared
    as their step metric (``define_metric``), once per run.
    """
    head = _check_prefix(prefix)
    if run is not None and not callable(getattr(run, "log", None)):
        raise TypeError(f"run must be a wandb Run (with log()), got {type(run).__name__}")
    defined: list[Any] = []

    def to_wandb(times: StepTimes) -> None:
        target = run
        if target is None:
            import wandb as wandb_module  # optional: only a user of this sink needs it

            target = wandb_module.run
            if target is None:
                raise RuntimeError("no wandb run is active: call wandb.init() first")
        if not any(r is target for r in defined):
            target.define_metric(f"{head}step")
            target.define_metric(f"{head}*", step_metric=f"{head}step")
            defined.append(target)
        values: dict[str, float] = {f"{head}step": times.step}
        values.update(times.scalars(head))
        target.log(values)

    return to_wandb


def live(
    path: str | os.PathLike[str],
    *,
    timer: Timer | None = None,
    every_s: float = 1.0,
    steps: int = 50,
    warmup: int = 5,
) -> Live:
    """A sink publishing each step it is given to ``path`` for ``cudatimer watch``, as
    ``cudatimer.live`` does for a Timer it polls itself: for the Lightning and Hugging Face
    callbacks, which own their ``StepFeed``. ``timer``: the one whose open regions the file
    shows (default: the module's; pass the callback's). The file appears with the first
    step; ``{rank}`` in ``path`` becomes the global rank; ``close()`` writes the final state
    (exit, an uncaught exception and SIGTERM write it too).

    >>> import cudatimer, cudatimer.sinks, json, os, tempfile
    >>> timer = cudatimer.Timer(name="live-sink-doc")
    >>> sink = cudatimer.sinks.live(os.path.join(tempfile.mkdtemp(), "live.json"), timer=timer)
    >>> feed = cudatimer.StepFeed(sink, timer=timer)
    >>> with timer.region("train_step"):
    ...     pass
    >>> _ = feed.step()
    >>> sink.close()
    >>> json.load(open(sink.path))["finished"]
    1
    """
    return live_sink(path, timer, every_s=every_s, steps=steps, warmup=warmup)
