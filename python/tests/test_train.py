"""cairn.train: Ray Train's loop over the C++ Trainer, in forked worker processes.

Each test runs a real run: worker processes forked by the C++ runtime run a
Python function, report collectively, and the driver commits checkpoints
manifest-last into a temporary experiment folder.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import cairn
import pytest
from cairn import train
from cairn.train import (
    Checkpoint,
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)

sys.path.insert(0, os.path.dirname(__file__))
import driver_process

torch = pytest.importorskip("torch")
from cairn.train.torch import TorchTrainer, prepare_data_loader, prepare_model  # noqa: E402


def _run(
    tmp_path: pathlib.Path, fn: Any, config: Any = None, workers: int = 2, **run: Any
) -> train.Result:
    return TorchTrainer(
        fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name="exp", storage_path=tmp_path, **run),
    ).fit()


def _run_failing(
    tmp_path: pathlib.Path, fn: Any, config: Any = None, workers: int = 2, **run: Any
) -> train.Result:
    """A run that fails: fit() raises, as Ray's; returns the error's Result."""
    with pytest.raises(train.TrainingFailedError) as failed:
        _run(tmp_path, fn, config, workers, **run)
    result = failed.value.result
    assert result is not None and result.error is not None
    assert str(result.error) in str(failed.value)
    return result


def test_workers_report_collectively_and_the_best_checkpoints_are_kept(
    tmp_path: pathlib.Path,
) -> None:
    def loop(config: dict[str, Any]) -> None:
        ctx = train.get_context()
        for step in range(config["steps"]):
            # Every rank passes a checkpoint: the files of all go into one.
            folder = tmp_path / f"scratch_{ctx.get_world_rank()}_{step}"
            folder.mkdir()
            (folder / f"rank{ctx.get_world_rank()}.txt").write_text(str(step))
            score = [0.5, 0.1, 0.9, 0.3][step]
            train.report(
                {"step": step, "score": score, "rank": ctx.get_world_rank()},
                checkpoint=Checkpoint.from_directory(folder),
            )

    result = _run(
        tmp_path,
        loop,
        {"steps": 4},
        checkpoint_config=CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="min"
        ),
    )
    assert result.error is None
    assert result.metrics["step"] == 3 and result.metrics["rank"] == 0  # rank 0's metrics
    # Ray's order: the worst kept first, the best last.
    assert [m["score"] for _, m in result.best_checkpoints] == [0.3, 0.1]
    best = result.get_best_checkpoint("score", "min")
    assert best is not None and best == result.best_checkpoints[-1][0]
    assert result.get_best_checkpoint("score", "max") == result.best_checkpoints[0][0]
    assert result.get_best_checkpoint("no such metric", "max") is None
    with pytest.raises(ValueError):
        result.get_best_checkpoint("score", "best")
    assert result.config == {"train_loop_config": {"steps": 4}}
    assert result.checkpoint is not None and result.checkpoint.verify() == []
    with result.checkpoint.as_directory() as d:
        assert sorted(os.listdir(d)) == [".cairn", "rank0.txt", "rank1.txt"]
        assert pathlib.Path(d, "rank1.txt").read_text() == "3"
    assert [row["step"] for row in result.metrics_history] == [0, 1, 2, 3]
    assert result.path == str(tmp_path / "exp")
    again = train.Result.from_path(tmp_path / "exp")
    assert again.metrics["step"] == 3
    assert [m["score"] for _, m in again.best_checkpoints] == [0.3, 0.1]


def test_the_context_names_each_rank_and_torch_distributed_is_initialised(
    tmp_path: pathlib.Path,
) -> None:
    def loop() -> None:  # a function without a config argument
        import torch.distributed as dist

        ctx = train.get_context()
        assert dist.is_initialized() and dist.get_world_size() == ctx.get_world_size()
        t = torch.tensor([float(ctx.get_world_rank() + 1)])
        dist.all_reduce(t)
        train.report(
            {
                "sum": float(t[0]),
                "world": ctx.get_world_size(),
                "local": ctx.get_local_rank(),
                "node": ctx.get_node_rank(),
                "name": ctx.get_experiment_name(),
                "env_rank": os.environ["RANK"],
            }
        )

    result = _run(tmp_path, loop, workers=3)
    assert result.error is None, result.error
    seen = {k: result.metrics[k] for k in ("sum", "world", "local", "node", "name", "env_rank")}
    assert seen == {"sum": 6.0, "world": 3, "local": 0, "node": 0, "name": "exp", "env_rank": "0"}


def test_asynchronous_reports_commit_every_checkpoint_while_the_loop_goes_on(
    tmp_path: pathlib.Path,
) -> None:
    def loop(config: dict[str, Any]) -> None:
        rank = train.get_context().get_world_rank()
        for step in range(5):
            folder = tmp_path / f"scratch_{rank}_{step}"
            folder.mkdir()
            (folder / f"part{rank}.txt").write_text(f"{step}")
            train.report(
                {"step": step},
                checkpoint=Checkpoint.from_directory(folder),
                async_report=True,
                max_in_flight=2,
            )
            # The report froze the files: the loop may delete them at once.
            shutil.rmtree(folder)
        train.wait_for_reports()

    result = _run(tmp_path, loop, {})
    assert result.error is None, result.error
    assert [row["step"] for row in result.metrics_history] == [0, 1, 2, 3, 4]
    manager = cairn.CheckpointManager(tmp_path / "exp")
    try:
        records = manager.history()
        assert [r.metrics["step"] for r in records] == [0, 1, 2, 3, 4]
        for r in records:
            with r.checkpoint.as_directory() as d:
                for rank in (0, 1):
                    text = pathlib.Path(d, f"part{rank}.txt").read_text()
                    assert text == str(r.metrics["step"]), (r.name, rank)
    finally:
        manager.close()


def test_a_worker_exception_ends_the_run_with_its_traceback_in_result_error(
    tmp_path: pathlib.Path,
) -> None:
    def loop(config: dict[str, Any]) -> None:
        train.report({"step": 0}, checkpoint=Checkpoint.from_dict({"step": 0}))
        if train.get_context().get_world_rank() == 1:
            raise ValueError("bad batch in shard 7")
        train.report({"step": 1})

    result = _run_failing(tmp_path, loop, {})
    assert isinstance(result.error, train.TrainingFailedError)
    message = str(result.error)
    assert "rank 1" in message and "ValueError" in message, message
    assert "bad batch in shard 7" in message and "Traceback" in message, message
    # What was committed before the failure is kept.
    assert result.checkpoint is not None and result.checkpoint.to_dict() == {"step": 0}


def _make_model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _data() -> Any:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def _ddp_loop(config: dict[str, Any]) -> None:
    """Two ranks train with DDP; a checkpoint (model + optimizer) every step.

    With ``kill_at`` rank 1 SIGKILLs itself at that step of the first attempt.
    """
    import cairn.torch as ct

    ctx = train.get_context()
    model = prepare_model(_make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = prepare_data_loader(torch.utils.data.DataLoader(_data(), batch_size=8))
    start = 0
    if (ckpt := train.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            extra = ct.load_state(pathlib.Path(d) / "state.safetensors", model.module, optimizer)
        start = extra["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        if epoch == config.get("kill_at") and ctx.attempt == 0 and ctx.get_world_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint = None
        if ctx.get_world_rank() == 0:
            folder = pathlib.Path(config["scratch"]) / f"epoch_{epoch}_{ctx.attempt}"
            folder.mkdir(parents=True)
            ct.save_state(
                folder / "state.safetensors", model.module, optimizer, metadata={"epoch": epoch}
            )
            checkpoint = Checkpoint.from_directory(folder)
        train.report({"epoch": epoch}, checkpoint=checkpoint)


def _final_weights(result: train.Result) -> dict[str, Any]:
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        return cairn.load(pathlib.Path(d) / "state.safetensors", mmap=False)


def test_a_worker_killed_mid_run_restarts_from_the_latest_checkpoint_bit_for_bit(
    tmp_path: pathlib.Path,
) -> None:
    config = {"epochs": 4, "scratch": str(tmp_path / "a")}
    clean = _run(tmp_path / "clean", _ddp_loop, config)
    assert clean.error is None, clean.error

    config = {"epochs": 4, "kill_at": 2, "scratch": str(tmp_path / "b")}
    failed_once = _run(
        tmp_path / "failed", _ddp_loop, config, failure_config=FailureConfig(max_failures=1)
    )
    assert failed_once.error is None, failed_once.error
    assert [row["epoch"] for row in failed_once.metrics_history] == [0, 1, 2, 3]

    want, got = _final_weights(clean), _final_weights(failed_once)
    assert sorted(want) == sorted(got)
    for name in want:
        assert torch.equal(want[name], got[name]), name

    # Without a restart allowed, the kill is the run's error, naming the signal.
    config = {"epochs": 4, "kill_at": 1, "scratch": str(tmp_path / "c")}
    dead = _run_failing(tmp_path / "dead", _ddp_loop, config)
    assert dead.error is not None and "rank 1" in str(dead.error), dead.error
    assert dead.checkpoint is not None  # epoch 0's stays


def test_restore_goes_on_from_the_latest_checkpoint_with_the_saved_config(
    tmp_path: pathlib.Path,
) -> None:
    def loop(config: dict[str, Any]) -> None:
        ckpt = train.get_checkpoint()
        start = 0 if ckpt is None else ckpt.to_dict()["step"] + 1
        for step in range(start, config["steps"]):
            if step == config["fail_at"] and ckpt is None:
                raise RuntimeError("the machine went away")
            train.report(
                {"step": step, "resumed": ckpt is not None},
                checkpoint=Checkpoint.from_dict({"step": step}),
            )

    first = _run_failing(tmp_path, loop, {"steps": 4, "fail_at": 2})
    assert first.error is not None
    path = tmp_path / "exp"
    assert TorchTrainer.can_restore(path)
    with pytest.raises(cairn.InvalidArgumentError, match="train_loop_per_worker"):
        TorchTrainer.restore(path)
    result = TorchTrainer.restore(path, loop).fit()
    assert result.error is None, result.error
    assert (result.metrics["step"], result.metrics["resumed"]) == (3, True)
    assert [row["step"] for row in result.metrics_history] == [0, 1, 2, 3]
    assert result.checkpoint is not None and result.checkpoint.to_dict() == {"step": 3}


def test_a_driver_killed_mid_run_is_restored_from_its_latest_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    import train_driver

    hold = tmp_path / "hold"
    hold.touch()
    # Steps before HOLD_AT are committed, then the workers wait.
    last = (
        tmp_path / "exp" / f"checkpoint_{train_driver.HOLD_AT - 1:06d}" / ".cairn" / "manifest.json"
    )
    with driver_process.started(train_driver.__file__, str(tmp_path)) as driver:
        driver_process.wait_for(driver, last)
        driver.kill()  # its workers die with it (PR_SET_PDEATHSIG)
    hold.unlink()

    latest = train.Result.from_path(tmp_path / "exp").checkpoint
    assert latest is not None
    committed = latest.to_dict()["step"]
    assert committed == train_driver.HOLD_AT - 1
    assert TorchTrainer.can_restore(tmp_path / "exp")
    result = TorchTrainer.restore(tmp_path / "exp", train_driver.loop).fit()
    assert result.error is None, result.error
    assert result.checkpoint is not None
    assert result.checkpoint.to_dict() == {"step": train_driver.STEPS - 1}
    # The restored run went on after the latest committed step, with the saved config.
    restored = [row for row in result.metrics_history if row["start"] > 0]
    assert restored and all(row["start"] == committed + 1 for row in restored), restored
    assert [row["step"] for row in restored] == list(range(committed + 1, train_driver.STEPS))


def test_ctrl_c_in_the_driver_saves_an_emergency_checkpoint_then_raises_keyboard_interrupt(
    tmp_path: pathlib.Path,
) -> None:
    import train_driver

    first = tmp_path / "exp" / "checkpoint_000000" / ".cairn" / "manifest.json"
    with driver_process.started(train_driver.__file__, str(tmp_path), "interruptible") as driver:
        driver_process.wait_for(driver, first)
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=300)
    assert driver.returncode != 0
    assert "KeyboardInterrupt" in err.decode(), err.decode()
    result = train.Result.from_path(tmp_path / "exp")
    assert result.preempted
    assert result.checkpoint is not None and result.checkpoint.to_dict()["preempted"] is True
    assert result.checkpoint.verify() == []


# The program the launcher tests start in every process, and where it
# finds this package.
_LAUNCHED_PROGRAM = os.path.join(os.path.dirname(__file__), "mpi_train.py")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cairn.__file__)))


def _expect_one_group_trained(
    tmp_path: pathlib.Path, done: subprocess.CompletedProcess[str]
) -> None:
    """Both processes of a launched mpi_train.py run returned the same clean
    result (the ranks' all-reduce, 1 + 2) and the last checkpoint is step 2's."""
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        got = (tmp_path / f"result_{rank}.txt").read_text()
        assert got == "3.0 None", (rank, got, done.stdout + done.stderr)
    result = train.Result.from_path(tmp_path / "mpi")
    assert result.checkpoint is not None and result.checkpoint.to_dict() == {"step": 2}


def _free_port_pair() -> int:
    """A port on 127.0.0.1 free with the next one: torchrun's static
    rendezvous keeps its store at MASTER_PORT, the driver takes the next."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
        if port >= 65535:
            continue
        with socket.socket() as b:
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports on 127.0.0.1")


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed")
def test_under_mpirun_every_process_gets_the_same_result(tmp_path: pathlib.Path) -> None:
    # Every MPI process runs the program and calls fit(); rank 0 drives.
    args = [
        "mpirun",
        "-np",
        "2",
        "--oversubscribe",
        "--bind-to",
        "none",
        "--mca",
        "btl_vader_single_copy_mechanism",
        "none",
        "-x",
        f"PYTHONPATH={_PACKAGE_ROOT}",
        "-x",
        "PYTHONDONTWRITEBYTECODE=1",
    ]
    if os.geteuid() == 0:
        args.append("--allow-run-as-root")
    done = subprocess.run(
        args + [sys.executable, _LAUNCHED_PROGRAM, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    _expect_one_group_trained(tmp_path, done)


# The torchrun of the interpreter's torch (the project venv's).
_TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def test_under_torchrun_the_launchers_processes_train_as_one_group(
    tmp_path: pathlib.Path,
) -> None:
    # torchrun starts the processes and sets RANK, WORLD_SIZE, MASTER_ADDR and
    # MASTER_PORT; ScalingConfig's launcher stays "auto".
    assert os.path.exists(_TORCHRUN), f"{_TORCHRUN} is missing (scripts/install-deps.sh)"
    env = dict(os.environ, PYTHONPATH=_PACKAGE_ROOT, PYTHONDONTWRITEBYTECODE="1")
    args = [
        _TORCHRUN,
        "--nnodes=1",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port_pair()}",
        "--redirects=1",
        "--tee=1",
        f"--log_dir={tmp_path / 'torchrun-logs'}",
        _LAUNCHED_PROGRAM,
        str(tmp_path),
        "auto",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    _expect_one_group_trained(tmp_path, done)


def test_an_elastic_group_that_loses_a_process_finishes_with_the_others(
    tmp_path: pathlib.Path,
) -> None:
    # Three processes started by hand, torchrun-style; rank 2's is killed as
    # a lost node would be: the group restarts with ranks 0 and 1, whose
    # DDP all-reduce then counts 2.
    env = dict(
        os.environ,
        PYTHONPATH=_PACKAGE_ROOT,
        PYTHONDONTWRITEBYTECODE="1",
        WORLD_SIZE="3",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port_pair()),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, _LAUNCHED_PROGRAM, str(tmp_path), "elastic"],
            env=dict(env, RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(3)
    ]
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "kill-me").exists() and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        procs[2].kill()
        outputs = [p.communicate(timeout=240)[0] for p in procs[:2]]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for rank in (0, 1):
        got = (tmp_path / f"result_{rank}.txt").read_text()
        assert got == "2.0 None [2]", (rank, got, outputs)
    assert "the group restarts with 2 rank(s)" in outputs[0], outputs[0]
    result = train.Result.from_path(tmp_path / "elastic")
    assert result.checkpoint is not None and result.checkpoint.to_dict() == {"step": 3}


_SLURM_CLUSTER = os.path.join(
    os.path.dirname(__file__), "..", "..", "tests", "train", "slurm_cluster.sh"
)


@pytest.mark.skipif(
    shutil.which("slurmctld") is None or os.geteuid() != 0,
    reason="a Slurm cluster needs slurm-wlm's daemons and root",
)
def test_under_srun_a_slurm_steps_tasks_train_as_one_group(tmp_path: pathlib.Path) -> None:
    # A one-node Slurm cluster of its own; srun without MPI starts the two
    # processes and sets only Slurm's variables, which place the ranks.
    env = dict(os.environ, PYTHONPATH=_PACKAGE_ROOT, PYTHONDONTWRITEBYTECODE="1")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    args = [
        "bash",
        _SLURM_CLUSTER,
        str(tmp_path / "slurm"),
        "srun",
        "--ntasks=2",
        "--overcommit",
        sys.executable,
        _LAUNCHED_PROGRAM,
        str(tmp_path),
        "auto",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    _expect_one_group_trained(tmp_path, done)


def test_worker_calls_outside_a_run_and_bad_arguments_are_clear_errors(
    tmp_path: pathlib.Path,
) -> None:
    with pytest.raises(cairn.Error):
        train.report({"x": 1})
    with pytest.raises(cairn.Error):
        train.get_context()
    with pytest.raises(TypeError, match="'train_loop_per_worker' must be a callable, got int"):
        TorchTrainer(42)  # type: ignore[arg-type]
    with pytest.raises(cairn.InvalidArgumentError, match="launcher"):
        TorchTrainer(lambda: None, scaling_config=ScalingConfig(launcher="yarn"))

    def loop() -> None:
        train.report({"not json": object()})

    result = _run_failing(tmp_path, loop, workers=1)
    assert result.error is not None and "TypeError" in str(result.error), result.error


def test_an_elastic_range_starts_its_largest_group_and_a_bad_range_is_named(
    tmp_path: pathlib.Path,
) -> None:
    def loop() -> None:
        train.report({"world": train.get_context().get_world_size()})

    result = TorchTrainer(
        loop,
        scaling_config=ScalingConfig(num_workers=(1, 2)),
        run_config=RunConfig(name="exp", storage_path=tmp_path),
    ).fit()
    assert result.error is None, result.error
    assert result.metrics["world"] == 2
    # Stored for TorchTrainer.restore, with the range.
    restored = TorchTrainer.restore(str(tmp_path / "exp"), loop)
    assert restored._impl.config["min_workers"] == 1
    assert restored._impl.config["num_workers"] == 2
    with pytest.raises(cairn.InvalidArgumentError, match="min_workers is 3"):
        TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=(3, 2)))
    with pytest.raises(TypeError, match="ScalingConfig.*'num_workers' must be int or tuple"):
        TorchTrainer(loop, scaling_config=ScalingConfig(num_workers="2"))  # type: ignore[arg-type]


def test_metrics_dataframe_is_the_history_in_pandas_or_names_what_is_missing(
    tmp_path: pathlib.Path,
) -> None:
    def loop() -> None:
        for step in range(3):
            train.report({"step": step, "eval": {"acc": step / 10}})

    result = _run(tmp_path, loop, workers=1)
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pandas"):
            _ = result.metrics_dataframe
        return
    frame = result.metrics_dataframe
    assert list(frame["step"]) == [0, 1, 2]
    assert list(frame["eval/acc"]) == [0.0, 0.1, 0.2]


_FORK_AFTER_OPENMP = """
import sys
import torch
from cairn import train, tune
from cairn.train import RunConfig, ScalingConfig
from cairn.train.torch import TorchTrainer

assert torch.get_num_threads() > 1, torch.get_num_threads()
# The driver runs a parallel region: GNU OpenMP's thread team now exists here.
assert float((torch.ones(4_000_000) * 2).sum()) == 8_000_000


def loop(config):
    # A forked worker's parallel region: it hangs where the team is inherited.
    total = float(torch.full((4_000_000,), 3.0).sum())
    train.report({"total": total, "threads": torch.get_num_threads()})


result = TorchTrainer(
    loop,
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(name="exp", storage_path=sys.argv[1]),
).fit()
assert result.metrics["total"] == 12_000_000, result.metrics
grid = tune.Tuner(loop, run_config=RunConfig(name="tune", storage_path=sys.argv[1])).fit()
assert grid[0].metrics["total"] == 12_000_000, grid[0].metrics
print("threads in a forked worker:", result.metrics["threads"])
"""


def test_workers_forked_after_the_driver_ran_torch_threads_do_not_hang(
    tmp_path: pathlib.Path,
) -> None:
    # torch's CPU wheel parallelises on GNU OpenMP, whose thread team does
    # not survive fork(): a forked worker runs torch on one thread, as Ray's
    # one-CPU workers do. Bounded: a hang fails the test after 120 s.
    env = dict(os.environ, PYTHONPATH=_PACKAGE_ROOT, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-c", _FORK_AFTER_OPENMP, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "threads in a forked worker: 1" in done.stdout, done.stdout
