"""Hugging Face ``transformers.Trainer`` integration: the step phases as GPU-timed regions, and
each finished step's region times in the Trainer's logs.

``CudaTimerCallback`` is a ``TrainerCallback``. Of a training step, the Trainer shows its
callbacks three moments, so the callback times three regions: ``train_step`` (from
``on_step_begin`` to ``on_step_end``: every micro-batch of a gradient-accumulation step, the
optimizer, the scheduler, ``zero_grad``), inside it ``forward_backward`` (to
``on_pre_optimizer_step``: the micro-batches' forward and backward and gradient clipping)
and ``optimizer_step`` (to ``on_optimizer_step``). Your own regions (``instrument(model)``)
nest inside them. Each step is marked; as the GPU finishes steps, their region times are
added to the next ``logs`` the Trainer makes (the mean per step since the previous log,
``cudatimer/<region>/gpu_ms``), so they reach every ``report_to`` integration, and go to
any extra ``sinks``. Nothing waits for the GPU, except once at the last step, for at most
``flush_timeout_s``, so the final log holds the last steps.

    import cudatimer.hf
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    cudatimer.hf.attach(trainer)        # the callback, first in line
    trainer.train()

``attach`` puts the callback first: the Trainer calls callbacks in order, and the
``report_to`` integrations come before callbacks passed in ``callbacks=[...]``, so a
callback given there adds its times after they have written the logs. This module imports
``transformers``; ``import cudatimer`` does not.
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

from .features._feed import Sink, StepFeed, StepTimes
from .regions._timer import Region, Timer, check_name

__all__ = ["PHASES", "CudaTimerCallback", "attach"]

#: The regions of a step, outermost first: (step, before the optimizer, the optimizer).
PHASES = ("train_step", "forward_backward", "optimizer_step")


class CudaTimerCallback(TrainerCallback):  # type: ignore[misc]
    """Times the Trainer's step phases as regions, marks steps, and adds finished steps'
    region times to the Trainer's logs (and sends them to ``sinks``).

    ``timer``: the cudatimer Timer (default: the module's). ``log``: add the times to the
    logs (the mean per finished step since the last log, keys ``{prefix}{path}/gpu_ms`` and
    ``/cpu_ms``, with ``{prefix}step``: the last step included). ``match``: only regions
    whose path matches this glob. ``names``: the three region names (``PHASES``).
    ``flush_timeout_s``: the most the last step waits for the GPU.

    >>> import cudatimer.hf
    >>> callback = cudatimer.hf.CudaTimerCallback(match="train_step")
    """

    def __init__(
        self,
        *sinks: Sink,
        timer: Timer | None = None,
        log: bool = True,
        match: str | None = None,
        prefix: str = "cudatimer/",
        names: tuple[str, str, str] = PHASES,
        flush_timeout_s: float = 60.0,
    ) -> None:
        if timer is None:
            from .regions._timer import default_timer

            timer = default_timer()
        if not isinstance(log, bool):
            raise TypeError(f"log must be True or False, got {type(log).__name__}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if not (isinstance(names, tuple) and len(names) == 3):
            raise TypeError(f"names must be a tuple of 3 region names, got {names!r}")
        for name in names:
            check_name(name, "each of names")
        if isinstance(flush_timeout_s, bool) or not isinstance(flush_timeout_s, (int, float)):
            raise TypeError(
                f"flush_timeout_s must be a number of seconds, got {type(flush_timeout_s).__name__}"
            )
        self.feed = StepFeed(*sinks, self._collect, timer=timer, match=match)
        self.timer = self.feed.timer
        self.log = log
        self.prefix = prefix
        self.flush_timeout_s = float(flush_timeout_s)
        self._step_region, self._fb_region, self._opt_region = (self.timer.region(n) for n in names)
        self._open: list[Region] = []  # this callback's regions open now, innermost last
        self._unlogged: list[StepTimes] = []  # finished steps not in a log yet

    # -- the step's phases -------------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_all()
        self._enter(self._step_region)
        self._enter(self._fb_region)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_to(self._step_region)
        if self._open:
            self._enter(self._opt_region)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_to(self._step_region)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_all()
        self.timer.step()
        if state.max_steps and state.global_step >= state.max_steps:
            # The last step: wait (bounded) for the GPU so the final log holds every step.
            self.feed.close(self.flush_timeout_s)
        else:
            self.feed.poll()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close_all()
        self.feed.close(self.flush_timeout_s)

    # -- the logs ----------------------------------------------------------------------------
    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if not self.log or logs is None or not self._unlogged:
            return
        added = self._means(self._unlogged)
        self._unlogged = []
        logs.update(added)
        # The Trainer copied ``logs`` into its history just before this call: add them there too.
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(added)

    def _collect(self, times: StepTimes) -> None:
        if self.log:
            self._unlogged.append(times)

    def _means(self, steps: list[StepTimes]) -> dict[str, float]:
        sums: dict[str, float] = {}
        for times in steps:
            for key, value in times.scalars(self.prefix).items():
                sums[key] = sums.get(key, 0.0) + value
        n = len(steps)
        out = {key: total / n for key, total in sums.items() if math.isfinite(total)}
        out[f"{self.prefix}step"] = steps[-1].step
        return out

    # -- regions -----------------------------------------------------------------------------
    def _enter(self, region: Region) -> None:
        region.__enter__()
        self._open.append(region)

    def _close_to(self, keep: Region) -> None:
        """Exit the open regions inside ``keep`` (innermost first)."""
        while self._open and self._open[-1] is not keep:
            self._open.pop().__exit__(None, None, None)

    def _close_all(self) -> None:
        while self._open:
            self._open.pop().__exit__(None, None, None)


def attach(trainer: Any, *sinks: Sink, **options: Any) -> CudaTimerCallback:
    """Make a :class:`CudaTimerCallback` (``sinks`` and ``options`` as there) and put it
    first among ``trainer``'s callbacks, so its times are in the logs before the ``report_to``
    integrations write them; returns it."""
    handler = getattr(trainer, "callback_handler", None)
    callbacks = getattr(handler, "callbacks", None)
    if not isinstance(callbacks, list):
        raise TypeError(
            f"trainer must be a transformers.Trainer (with callback_handler.callbacks), got "
            f"{type(trainer).__name__}"
        )
    callback = CudaTimerCallback(*sinks, **options)
    callbacks.insert(0, callback)
    return callback
