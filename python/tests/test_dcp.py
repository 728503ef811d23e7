"""cairn.torch.dcp: torch.distributed.checkpoint saving and loading through
Cairn — resharding across world sizes (FSDP2 with Adam, DTensors) on gloo,
s3://, a CheckpointManager and its memory tier, cairn.train.report, DCP's
own FileSystemReader, bad input, and a SIGKILL loop during dcp.save."""

from __future__ import annotations

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import time
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import cairn  # noqa: E402
from cairn.torch.dcp import Reader, Writer  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
CLI = HERE.parents[1] / "build" / "src" / "cli" / "cairn"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _group(tmp: pathlib.Path, world: int, steps: list[dict[str, Any]], tag: str) -> None:
    """Runs dcp_worker.py as a gloo group of ``world`` processes; each rank's
    failure is raised with its stderr."""
    config = json.dumps({"world": world, "store": str(tmp / f"store-{tag}"), "steps": steps})
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "dcp_worker.py"), config, str(rank)],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(world)
    ]
    errors = []
    for rank, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        if p.returncode != 0:
            errors.append(f"rank {rank} of {tag} exited {p.returncode}:\n{err[-4000:]}")
    assert not errors, "\n".join(errors)


@pytest.fixture(scope="module")
def saved_by_4(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """An FSDP2 model with Adam (f4) and DTensors (d4), each saved by 4 ranks."""
    tmp = tmp_path_factory.mktemp("dcp4")
    _group(
        tmp,
        4,
        [
            {"op": "save", "kind": "fsdp", "dest": str(tmp / "f4"), "ref": str(tmp / "f4.pt")},
            {"op": "save", "kind": "dtensor", "dest": str(tmp / "d4"), "ref": str(tmp / "d4.pt")},
        ],
        "s4",
    )
    return tmp


def test_resharding_4_to_2_and_1_and_back_fsdp2_adam_dtensors_s3_manager_async(
    saved_by_4: pathlib.Path, tmp_path: pathlib.Path, s3_through_python: str
) -> None:
    s4, t = saved_by_4, tmp_path
    s3 = f"{s3_through_python}/d2"
    for name in ("f4", "d4"):
        ck = cairn.Checkpoint(str(s4 / name))
        assert ck.is_committed() and ck.verify() == []
        assert sorted(n for n, _ in ck.files()) == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
            "__2_0.distcp",
            "__3_0.distcp",
        ]

    def load(kind: str, src: pathlib.Path | str, ref: pathlib.Path) -> dict[str, Any]:
        return {"op": "load", "kind": kind, "src": str(src), "ref": str(ref)}

    def save(kind: str, dest: pathlib.Path | str, ref: pathlib.Path) -> dict[str, Any]:
        return {"op": "save", "kind": kind, "dest": str(dest), "ref": str(ref)}

    _group(
        t,
        2,
        [
            load("fsdp", s4 / "f4", s4 / "f4.pt"),
            load("dtensor", s4 / "d4", s4 / "d4.pt"),
            save("fsdp", t / "f2", t / "f2.pt"),
            save("dtensor", s3, t / "d2.pt"),
            {"op": "manager", "dest": str(t / "exp"), "losses": [3.0, 1.0, 2.0]},
            {"op": "async", "dest": str(t / "thread"), "process": False},
            {"op": "async", "dest": str(t / "process"), "process": True},
        ],
        "w2",
    )
    _group(
        t,
        1,
        [
            load("fsdp", s4 / "f4", s4 / "f4.pt"),
            load("dtensor", s4 / "d4", s4 / "d4.pt"),
            load("dtensor", s3, t / "d2.pt"),
            save("fsdp", t / "f1", t / "f1.pt"),
            save("dtensor", t / "d1", t / "d1.pt"),
        ],
        "w1",
    )
    _group(
        t,
        4,
        [
            load("fsdp", t / "f2", t / "f2.pt"),
            load("dtensor", s3, t / "d2.pt"),
            load("fsdp", t / "f1", t / "f1.pt"),
            load("dtensor", t / "d1", t / "d1.pt"),
        ],
        "w4",
    )
    # "dcp.save each step, keep the best 2": the manager kept losses 1 and 2.
    assert json.loads((t / "exp.json").read_text()) == ["checkpoint_000001", "checkpoint_000002"]
    for name in ("thread", "process"):
        assert cairn.Checkpoint(str(t / name)).verify() == []
    assert cairn.Checkpoint(s3).verify() == []


def _plain_d4() -> dict[str, Any]:
    """d4's state as plain tensors (a single process loads a sharded save whole)."""
    return {
        "dt": {
            "a": torch.zeros(37, 11),
            "b": torch.zeros(5, 23, dtype=torch.bfloat16),
            "r": torch.zeros(17, dtype=torch.int64),
        },
        "step": 0,
        "note": "",
        "blob": b"",
    }


def test_a_committed_checkpoint_is_what_dcps_filesystem_reader_reads(
    saved_by_4: pathlib.Path,
) -> None:
    ref = torch.load(saved_by_4 / "d4.pt", weights_only=False)
    for reader in (Reader(str(saved_by_4 / "d4")), dcp.FileSystemReader(str(saved_by_4 / "d4"))):
        state = _plain_d4()
        dcp.load(state, storage_reader=reader)
        for k in ("a", "b", "r"):
            assert torch.equal(state["dt"][k], ref["dt"][k]), (type(reader).__name__, k)
        assert (state["step"], state["note"], state["blob"]) == (7, ref["note"], ref["blob"])


def test_cairn_verify_ls_and_cp_take_a_dcp_checkpoint(
    saved_by_4: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    src = saved_by_4 / "d4"
    for args in (
        ["verify", str(src)],
        ["ls", str(saved_by_4)],
        ["cp", str(src), str(tmp_path / "c")],
    ):
        run = subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (args, run.stdout, run.stderr)
    state = _plain_d4()
    dcp.load(state, storage_reader=Reader(str(tmp_path / "c")))
    assert state["step"] == 7


def _damaged(saved_by_4: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    copy = tmp_path / "d4"
    shutil.copytree(saved_by_4 / "d4", copy)
    return copy


def test_a_missing_rank_file_is_named_with_its_rank_and_tensors(
    saved_by_4: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    copy = _damaged(saved_by_4, tmp_path)
    (copy / "__2_0.distcp").unlink()
    with pytest.raises(CheckpointException) as e:
        dcp.load(_plain_d4(), storage_reader=Reader(str(copy)))
    msg = str(e.value)
    assert "__2_0.distcp" in msg and "written by rank 2" in msg and "missing" in msg, msg
    assert "dt.a" in msg, msg
    run = subprocess.run([str(CLI), "verify", str(copy)], capture_output=True, text=True)
    assert run.returncode == 1 and "__2_0.distcp" in run.stdout + run.stderr


def test_a_checksum_mismatch_is_named_with_its_rank_and_tensors(
    saved_by_4: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    copy = _damaged(saved_by_4, tmp_path)
    path = copy / "__1_0.distcp"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointException) as e:
        dcp.load(_plain_d4(), storage_reader=Reader(str(copy)))
    msg = str(e.value)
    assert "__1_0.distcp" in msg and "written by rank 1" in msg and "checksum" in msg, msg
    assert "dt.a" in msg, msg


def test_a_planner_asking_for_a_tensor_the_checkpoint_lacks_is_named(
    saved_by_4: pathlib.Path,
) -> None:
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    # DCP's own planner names a key the checkpoint lacks before any read.
    state = _plain_d4()
    state["dt"]["ghost"] = torch.zeros(3)
    with pytest.raises(CheckpointException, match="dt.ghost"):
        dcp.load(state, storage_reader=Reader(str(saved_by_4 / "d4")))

    class Greedy(DefaultLoadPlanner):
        """Asks for a chunk the checkpoint has no record of."""

        def create_local_plan(self) -> Any:
            plan = super().create_local_plan()
            ghost = ReadItem(
                type=LoadItemType.TENSOR,
                dest_index=MetadataIndex("dt.a", torch.Size([0, 0])),
                dest_offsets=torch.Size([0, 0]),
                storage_index=MetadataIndex("dt.a", torch.Size([99, 0])),
                storage_offsets=torch.Size([0, 0]),
                lengths=torch.Size([1, 1]),
            )
            plan.items.append(ghost)
            return plan

    with pytest.raises(CheckpointException) as e:
        dcp.load(_plain_d4(), storage_reader=Reader(str(saved_by_4 / "d4")), planner=Greedy())
    msg = str(e.value)
    assert "rank 0" in msg and "'dt.a' at offsets [99, 0]" in msg, msg


class _Point:
    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Point) and other.x == self.x


def test_objects_round_trip_and_an_unpicklable_one_is_refused_by_name(
    tmp_path: pathlib.Path,
) -> None:
    state = {
        "t": torch.arange(6.0),
        "i": 3,
        "f": 0.25,
        "s": "text",
        "raw": b"\x00\x01",
        "none": None,
        "point": _Point(4),
        "seq": [1, "two", 3.0],
    }
    dcp.save(state, storage_writer=Writer(str(tmp_path / "ok")))
    back: dict[str, Any] = {k: None for k in state}
    back["t"] = torch.zeros(6)
    back["seq"] = [0, "", 0.0]
    dcp.load(back, storage_reader=Reader(str(tmp_path / "ok")))
    assert torch.equal(back.pop("t"), state.pop("t"))
    assert back == state

    bad = {"t": torch.zeros(2), "opt": {"fn": lambda x: x}}
    with pytest.raises(CheckpointException) as e:
        dcp.save(bad, storage_writer=Writer(str(tmp_path / "bad")))
    assert "opt.fn" in str(e.value), str(e.value)
    assert not cairn.Checkpoint(str(tmp_path / "bad")).is_committed()
    with pytest.raises(CheckpointException, match="not a committed Cairn checkpoint"):
        dcp.load({"t": torch.zeros(2)}, storage_reader=Reader(str(tmp_path / "bad")))


def test_a_wrong_argument_type_is_a_type_error_naming_the_parameter() -> None:
    with pytest.raises(TypeError, match="'dest'"):
        Writer(123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'src'"):
        Reader(4.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'metrics'"):
        Writer("x", metrics=[1])  # type: ignore[arg-type]


def test_a_committed_checkpoint_is_never_overwritten(tmp_path: pathlib.Path) -> None:
    dest = str(tmp_path / "c")
    dcp.save({"t": torch.ones(3)}, storage_writer=Writer(dest))
    with pytest.raises(CheckpointException, match="already a committed checkpoint"):
        dcp.save({"t": torch.zeros(3)}, storage_writer=Writer(dest))
    back = {"t": torch.zeros(3)}
    dcp.load(back, storage_reader=Reader(dest))
    assert torch.equal(back["t"], torch.ones(3))


def test_the_memory_tier_takes_a_dcp_save(tmp_path: pathlib.Path) -> None:
    (tmp_path / "shm").mkdir()
    tier = cairn.MemoryTierConfig(num_to_keep=2, persist_every_n=2, root=str(tmp_path / "shm"))
    config = cairn.CheckpointConfig(num_to_keep=3, memory_tier=tier)
    with cairn.CheckpointManager(str(tmp_path / "exp"), config=config) as m:
        for step in range(3):
            w = Writer(m, metrics={"step": step})
            dcp.save({"t": torch.full((5,), float(step))}, storage_writer=w)
            assert w.record is not None and w.record.metrics == {"step": step}
        latest = m.latest()
        assert latest is not None and latest.tier == "memory"
        back = {"t": torch.zeros(5)}
        dcp.load(back, storage_reader=Reader(latest))
        assert torch.equal(back["t"], torch.full((5,), 2.0))
        m.wait_for_persistence()
    # Closing persisted the newest: it reads back from the experiment's storage.
    with cairn.CheckpointManager(str(tmp_path / "exp"), config=cairn.CheckpointConfig()) as m:
        latest = m.latest()
        assert latest is not None and latest.metrics == {"step": 2}
        back = {"t": torch.zeros(5)}
        dcp.load(back, storage_reader=Reader(latest))
        assert torch.equal(back["t"], torch.full((5,), 2.0))


def _report_loop(config: dict[str, Any]) -> None:
    import tempfile

    import torch.distributed as dist
    from cairn import train
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    full = torch.arange(60.0).reshape(6, 10)
    state = {"w": distribute_tensor(full, mesh, [Shard(0)]), "epoch": 1}
    staging = tempfile.mkdtemp(prefix="dcp-report-")
    try:
        dcp.save(state, storage_writer=Writer(staging, commit=False))
        train.report({"epoch": 1}, checkpoint=cairn.Checkpoint.from_directory(staging))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def test_each_rank_reports_its_dcp_files_and_the_driver_commits_them(
    tmp_path: pathlib.Path,
) -> None:
    from cairn.train import RunConfig, ScalingConfig
    from cairn.train.torch import TorchTrainer

    result = TorchTrainer(
        _report_loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="dcp", storage_path=str(tmp_path)),
    ).fit()
    assert result.error is None
    ck = result.checkpoint
    assert ck is not None and ck.verify() == []
    assert sorted(n for n, _ in ck.files()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    back = {"w": torch.zeros(6, 10), "epoch": 0}
    dcp.load(back, storage_reader=Reader(ck))
    assert torch.equal(back["w"], torch.arange(60.0).reshape(6, 10)) and back["epoch"] == 1


def test_sigkill_during_dcp_save_leaves_every_committed_checkpoint_whole(
    tmp_path: pathlib.Path,
) -> None:
    sys.path.insert(0, str(HERE))
    try:
        from dcp_kill_server import KEEP, state_for
    finally:
        sys.path.pop(0)
    kills = int(os.environ.get("CAIRN_DCP_KILLS", "200"))
    exp = str(tmp_path / "exp")
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, str(HERE / "dcp_kill_server.py"), exp],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    rng = random.Random(1234)
    assert server.stdin is not None and server.stdout is not None
    last_step, commits_seen = -1, 0
    # Every committed checkpoint is verified (sizes, checksums) after each
    # kill, and loaded through dcp.load the first time it is seen.
    loaded: set[str] = set()
    started = time.monotonic()
    try:
        for i in range(kills):
            # The server forks a saver and SIGKILLs it at a random instant.
            server.stdin.write(f"{rng.uniform(0.0, 0.15):.4f}\n")
            server.stdin.flush()
            status = server.stdout.readline().split()
            assert status[0] == "exit", status
            assert os.WIFSIGNALED(int(status[1])) and os.WTERMSIG(int(status[1])) == 9, (
                f"kill {i}: the saver ended by itself ({status}); see {tmp_path}/server.log"
            )
            with cairn.CheckpointManager(exp, config=cairn.CheckpointConfig(num_to_keep=KEEP)) as m:
                history = m.history()
                latest = m.latest()
                assert (latest is None) == (not history)
                if latest is None:
                    continue
                assert latest.name in [r.name for r in history]
                step = latest.metrics["step"]
                assert step >= last_step, f"kill {i}: committed step {last_step} was lost"
                commits_seen += step > last_step
                last_step = step
                for r in history:
                    assert r.checkpoint.verify() == [], f"kill {i}: {r.name} is damaged"
                    if r.name in loaded:
                        continue
                    loaded.add(r.name)
                    want = state_for(r.metrics["step"])
                    got = {"w": torch.zeros_like(want["w"]), "b": torch.zeros_like(want["b"])}
                    got.update(step=-1, tag="")
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        dcp.load(got, storage_reader=Reader(r))
                    assert got["step"] == want["step"] and got["tag"] == want["tag"]
                    assert torch.equal(got["w"], want["w"]) and torch.equal(got["b"], want["b"])
    finally:
        server.stdin.close()
        server.wait(timeout=60)
        log.close()
    print(
        f"{kills} kills in {time.monotonic() - started:.1f} s; the latest committed step "
        f"moved {commits_seen} times, to {last_step}"
    )
    assert last_step > 0
