"""The Lightning integration against the real library on CPU: the profiler's regions, their
nesting and counts, steps, the callback's logs, the SimpleProfiler alongside, and devices=2
over gloo (ddp and ddp_spawn) with per-rank files and the cross-rank report."""

from __future__ import annotations

import csv
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import cudatimer
from tests.helpers.extras import needs

pl = needs("lightning.pytorch")

from cudatimer.lightning import CudaTimerCallback, CudaTimerProfiler  # noqa: E402
from tests.helpers.lightning_ddp_script import Tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
BATCH = "run_training_epoch/run_training_batch"
OPT = f"{BATCH}/[LightningModule]Tiny.optimizer_step"


def _fit(tmp_path: Path, **trainer: Any) -> Any:
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    options.update(trainer)
    fit = pl.Trainer(**options)
    data = torch.utils.data.TensorDataset(torch.randn(4 * STEPS, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Lightning's advice (workers, pytree)
        warnings.simplefilter("ignore", DeprecationWarning)
        fit.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
    return fit


def test_profiler_times_every_action_nested_as_lightning_nests_them(tmp_path: Path) -> None:
    """Lightning's actions become regions, nested, with exact counts and one step a batch."""
    _fit(tmp_path, profiler=CudaTimerProfiler())
    s = cudatimer.summary()
    assert s.steps == STEPS
    assert s["run_training_epoch"].calls == 1
    assert s[BATCH].calls == STEPS
    for leaf in (
        "[Strategy]SingleDeviceStrategy.training_step",
        "[Strategy]SingleDeviceStrategy.backward",
    ):
        assert s[f"{OPT}/{leaf}"].calls == STEPS
    # the user's own region nests under the action that ran it
    assert s[f"{OPT}/[Strategy]SingleDeviceStrategy.training_step/loss"].calls == STEPS
    assert s[f"{OPT}/[Strategy]SingleDeviceStrategy.training_step"].clock == "host"
    assert s["run_training_epoch/[_TrainingEpochLoop].train_dataloader_next"].calls >= STEPS
    assert s["[LightningModule]Tiny.configure_optimizers"].depth == 0


def test_summary_is_the_tree_report_with_the_simple_profiler_alongside(tmp_path: Path) -> None:
    """summary() renders the regions; alongside="simple" adds SimpleProfiler's table of the
    same actions, counted the same."""
    profiler = CudaTimerProfiler(alongside="simple")
    _fit(tmp_path, profiler=profiler)
    text = profiler.summary()
    assert "+- run_training_batch" in text  # the tree view
    assert "Profiler Report" in text and "run_training_batch" in text.split("Profiler Report")[1]
    simple = profiler.alongside.recorded_durations  # type: ignore[union-attr]
    assert len(simple["run_training_batch"]) == cudatimer.summary()[BATCH].calls == STEPS


def test_profiler_writes_text_and_json_when_given_a_file(tmp_path: Path) -> None:
    """With dirpath and filename the report is a text file and the run a JSON file."""
    _fit(tmp_path, profiler=CudaTimerProfiler(dirpath=tmp_path, filename="prof"))
    assert "run_training_epoch" in (tmp_path / "fit-prof.txt").read_text()
    saved = cudatimer.load(tmp_path / "fit-prof.json")
    assert saved[BATCH].calls == STEPS and saved.steps == STEPS


def test_callback_logs_each_finished_step_through_the_trainers_logger(tmp_path: Path) -> None:
    """Every step's region times reach the logger once, in order, at that batch's step."""
    from lightning.pytorch.loggers import CSVLogger

    seen: list[int] = []
    callback = CudaTimerCallback(lambda t: seen.append(t.step))
    logger = CSVLogger(str(tmp_path), name="run", version=0)
    _fit(tmp_path, profiler=CudaTimerProfiler(), callbacks=[callback], logger=logger)
    assert seen == [0, 1, 2]
    with open(tmp_path / "run" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["cudatimer/step"], r["step"]) for r in rows] == [("0", "1"), ("1", "2"), ("2", "3")]
    key = f"cudatimer/{OPT}/[Strategy]SingleDeviceStrategy.backward/cpu_ms"
    assert all(float(r[key]) > 0 for r in rows)
    assert cudatimer.summary().steps == STEPS  # the profiler marked the steps, the callback not


def test_callback_marks_steps_without_the_profiler(tmp_path: Path) -> None:
    """Alone, the callback marks one step a training batch and feeds its regions."""
    got: list[tuple[int, tuple[str, ...]]] = []
    callback = CudaTimerCallback(lambda t: got.append((t.step, tuple(r[0] for r in t.rows))))
    _fit(tmp_path, callbacks=[callback])
    assert cudatimer.summary().steps == STEPS
    assert got == [(i, ("loss",)) for i in range(STEPS)]


def test_a_raising_sink_does_not_stop_training(tmp_path: Path) -> None:
    """A sink that raises is reported and the fit completes; it gets every step later."""
    got: list[int] = []
    failed: list[int] = []

    def sink(t: Any) -> None:
        if not failed:
            failed.append(t.step)
            raise RuntimeError("sink down")
        got.append(t.step)

    with pytest.warns(RuntimeWarning, match="sink down"):
        _fit(tmp_path, callbacks=[CudaTimerCallback(sink, log=False)])
    assert failed == [0] and got == [0, 1, 2]


def test_stop_of_an_action_never_started_raises_as_lightnings_profilers_do() -> None:
    """stop() of an unknown action raises ValueError; bad options raise TypeError."""
    profiler = CudaTimerProfiler()
    with pytest.raises(ValueError, match="never started"):
        profiler.stop("run_training_batch")
    with pytest.raises(TypeError, match="alongside must be"):
        CudaTimerProfiler(alongside="advanced")
    with pytest.raises(TypeError, match="mark_steps must be"):
        CudaTimerProfiler(mark_steps="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timer must be"):
        CudaTimerCallback(timer="t")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="each sink must be a callable"):
        CudaTimerCallback("print")  # type: ignore[arg-type]


def test_a_slash_in_an_action_name_stays_one_level() -> None:
    """A '/' in an action name (region paths use it for nesting) becomes '|'."""
    profiler = CudaTimerProfiler()
    with profiler.profile("[Callback]Saver{'dir': 'ckpt/x'}.on_train_end"):
        pass
    assert cudatimer.summary().names == ("[Callback]Saver{'dir': 'ckpt|x'}.on_train_end",)


def test_profiler_and_callback_pickle_for_spawned_processes() -> None:
    """Both travel to spawned processes (ddp_spawn) without their per-process state."""
    profiler = CudaTimerProfiler(alongside="simple")
    with profiler.profile("x"):
        clone = pickle.loads(pickle.dumps(profiler))
    assert clone._open == [] and clone.timer is cudatimer.default_timer()
    assert pickle.loads(pickle.dumps(CudaTimerCallback())).feed is None
    with pytest.raises(TypeError, match="cannot be sent to another process"):
        pickle.dumps(CudaTimerProfiler(timer=cudatimer.Timer(name="own")))


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_two_cpu_processes_write_per_rank_files_and_the_cross_rank_report(
    tmp_path: Path, strategy: str
) -> None:
    """devices=2 over gloo: one JSON per rank, and rank 0's text is the cross-rank table."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    script = ROOT / "tests" / "helpers" / "lightning_ddp_script.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), strategy],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        saved = cudatimer.load(tmp_path / f"fit-prof-rank{rank}.json")
        assert saved[BATCH].calls == STEPS and saved.steps == STEPS
        assert dict(saved.meta)["rank"] == str(rank)
    table = (tmp_path / "fit-prof-0.txt").read_text()
    row = next(line for line in table.splitlines() if line.startswith(f"{BATCH} "))
    assert row.split()[1:5] == ["host", "2/2", str(2 * STEPS), str(STEPS)]
    assert (tmp_path / "fit-prof-1.txt").read_text() == ""  # only rank 0 prints
