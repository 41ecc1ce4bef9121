"""The Hugging Face Trainer integration against the real library on CPU, with a tiny model
built from a config (no download): the step phases' regions and nesting, exact step counts,
times in the logs that reach report_to (TensorBoard), extra sinks, and a sink that raises."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import cudatimer
from tests.helpers.extras import needs

transformers = needs("transformers")

import cudatimer.hf  # noqa: E402

STEPS = 3


class _Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token ids for a causal LM: 12 examples of 8 tokens, labels = inputs."""

    def __init__(self) -> None:
        self.ids = torch.randint(0, 64, (12, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(tmp_path: Path, report_to: list[str] | None = None, **args: Any) -> Any:
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    options: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        logging_steps=1,
        save_strategy="no",
        report_to=report_to or [],
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
    )
    options.update(args)
    training_args = transformers.TrainingArguments(**options)
    return transformers.Trainer(model=model, args=training_args, train_dataset=_Tokens())


def _train(trainer: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        trainer.train()


def test_step_phases_are_regions_nested_with_exact_counts(tmp_path: Path) -> None:
    """train_step holds forward_backward and optimizer_step; one step marked per step."""
    trainer = _trainer(tmp_path)
    cudatimer.hf.attach(trainer)
    cudatimer.instrument(trainer.model, depth=1)
    _train(trainer)
    s = cudatimer.summary()
    assert s.steps == STEPS
    assert s["train_step"].calls == STEPS
    assert s["train_step/forward_backward"].calls == STEPS
    assert s["train_step/optimizer_step"].calls == STEPS
    assert (
        s["train_step/forward_backward/GPT2LMHeadModel/transformer"].calls == STEPS
    )  # the model's own
    assert s["train_step/optimizer_step"].depth == 1


def test_gradient_accumulation_keeps_one_step_per_optimizer_step(tmp_path: Path) -> None:
    """With 2 micro-batches a step, each step is still one train_step region and one step."""
    trainer = _trainer(tmp_path, gradient_accumulation_steps=2)
    cudatimer.hf.attach(trainer)
    cudatimer.instrument(trainer.model, depth=1)
    _train(trainer)
    s = cudatimer.summary()
    assert s.steps == STEPS and s["train_step"].calls == STEPS
    assert s["train_step/forward_backward/GPT2LMHeadModel/transformer"].calls == 2 * STEPS


def test_times_reach_the_logs_and_report_to_tensorboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each log holds the finished steps' region times; TensorBoard (report_to) gets them."""
    needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logs))  # transformers >= 5
    trainer = _trainer(tmp_path, report_to=["tensorboard"])
    sent: list[int] = []
    cudatimer.hf.attach(trainer, lambda t: sent.append(t.step))
    _train(trainer)
    assert sent == [0, 1, 2]
    steps_logged = [h["cudatimer/step"] for h in trainer.state.log_history if "cudatimer/step" in h]
    assert steps_logged == [0, 1, 2]  # logging_steps=1 and no GPU lag on the host clock
    acc = EventAccumulator(str(next(p for p in logs.rglob("events.out.tfevents.*")).parent))
    acc.Reload()
    tag = "train/cudatimer/train_step/cpu_ms"
    assert tag in acc.Tags()["scalars"]
    assert [e.step for e in acc.Scalars(tag)] == [1, 2, 3]  # the Trainer's global steps


def test_a_callback_given_to_the_trainer_works_too(tmp_path: Path) -> None:
    """callbacks=[CudaTimerCallback()] times and marks steps like attach()."""
    config_trainer = _trainer(tmp_path)
    callback = cudatimer.hf.CudaTimerCallback(log=False)
    config_trainer.add_callback(callback)
    _train(config_trainer)
    assert cudatimer.summary()["train_step"].calls == STEPS
    assert callback.feed.sent == STEPS


def test_a_raising_sink_is_reported_and_training_goes_on(tmp_path: Path) -> None:
    """A sink that raises gets a warning, training completes, the sink gets every step."""
    trainer = _trainer(tmp_path)
    got: list[int] = []

    def sink(t: Any) -> None:
        if not got:
            got.append(-1)
            raise ValueError("no route to dashboard")
        got.append(t.step)

    cudatimer.hf.attach(trainer, sink)
    with pytest.warns(RuntimeWarning, match="no route to dashboard"):
        _train(trainer)
    assert got == [-1, 0, 1, 2]


def test_bad_arguments_name_what_was_expected() -> None:
    """attach() needs a Trainer; names must be three region names."""
    with pytest.raises(TypeError, match=r"trainer must be a transformers\.Trainer"):
        cudatimer.hf.attach(object())
    with pytest.raises(TypeError, match="names must be a tuple of 3"):
        cudatimer.hf.CudaTimerCallback(names=("a", "b"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="contains '/'"):
        cudatimer.hf.CudaTimerCallback(names=("a", "b/c", "d"))
