"""cairn.torch: model and optimizer state bit for bit, StateCheckpointManager,
AsyncSaver and sharded saves, over the C++ core."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
import threading
from typing import Any, Callable

import cairn
import cairn.torch as ct
import numpy as np
import pytest

torch = pytest.importorskip("torch")


# ---- save_state / load_state -------------------------------------------------


def _model(seed: int) -> Any:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 2)
    )


def _sparse_model(seed: int) -> Any:
    torch.manual_seed(seed)
    return torch.nn.Embedding(10, 3, sparse=True)


# name -> (model factory, optimizer factory); every optimizer of torch.optim,
# with options that give it its fullest state.
OPTIMIZERS: dict[str, tuple[Callable[[int], Any], Callable[[Any], Any]]] = {
    "SGD": (_model, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True)),
    "Adam": (_model, lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True)),
    "AdamW": (_model, lambda p: torch.optim.AdamW(p, lr=0.01)),
    "Adagrad": (_model, lambda p: torch.optim.Adagrad(p, lr=0.05, lr_decay=0.01)),
    "Adadelta": (_model, lambda p: torch.optim.Adadelta(p)),
    "Adamax": (_model, lambda p: torch.optim.Adamax(p)),
    "ASGD": (_model, lambda p: torch.optim.ASGD(p, lr=0.01, t0=2)),
    "NAdam": (_model, lambda p: torch.optim.NAdam(p)),
    "RAdam": (_model, lambda p: torch.optim.RAdam(p)),
    "RMSprop": (_model, lambda p: torch.optim.RMSprop(p, momentum=0.5, centered=True)),
    "Rprop": (_model, lambda p: torch.optim.Rprop(p)),
    "LBFGS": (
        _model,
        lambda p: torch.optim.LBFGS(
            p, lr=0.5, history_size=4, max_iter=3, line_search_fn="strong_wolfe"
        ),
    ),
    "SparseAdam": (_sparse_model, lambda p: torch.optim.SparseAdam(list(p), lr=0.01)),
}


def _train(model: Any, opt: Any, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        if isinstance(model, torch.nn.Embedding):
            x = torch.randint(0, 10, (6,), generator=g)
            y = torch.randn(6, 3, generator=g)
        else:
            x = torch.randn(5, 4, generator=g)
            y = torch.randn(5, 2, generator=g)

        def closure() -> Any:
            opt.zero_grad()
            loss = (model(x) - y).pow(2).mean()
            loss.backward()
            return loss

        opt.step(closure)


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    """Equal values of equal types, tensors bit for bit."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(
            a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8) if b.dim() else b
        ), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_resuming_from_save_state_is_bitwise_the_run_that_never_stopped(
    name: str, tmp_path: pathlib.Path
) -> None:
    make_model, make_opt = OPTIMIZERS[name]
    model = make_model(0)
    opt = make_opt(model.parameters())
    _train(model, opt, range(0, 3))
    path = tmp_path / "state.safetensors"
    ct.save_state(path, model, opt, metadata={"epoch": 3})

    # A fresh model (other weights) and optimizer loaded from the file.
    model2 = make_model(1)
    opt2 = make_opt(model2.parameters())
    assert ct.load_state(path, model2, opt2) == {"epoch": 3}
    _assert_same(opt.state_dict(), opt2.state_dict(), "optimizer")
    _assert_same(dict(model.state_dict()), dict(model2.state_dict()), "model")

    _train(model, opt, range(3, 6))
    _train(model2, opt2, range(3, 6))
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), k
    _assert_same(opt.state_dict(), opt2.state_dict(), "optimizer after resuming")


def test_tensors_are_stored_under_flat_names_and_the_rest_as_typed_json(
    tmp_path: pathlib.Path,
) -> None:
    model = _model(0)
    opt = torch.optim.LBFGS(model.parameters(), history_size=3, max_iter=2)
    _train(model, opt, range(2))
    sched_opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(sched_opt, step_size=2)
    sched_opt.step()
    sched.step()
    extra = {
        "scheduler": sched.state_dict(),
        "numbers": (1, 1.0, float("inf"), float("-inf"), float("nan"), None, True, "x"),
        "by_int": {3: [torch.arange(3)], 7: {"k": torch.tensor(2.5, dtype=torch.float64)}},
        "rng": torch.get_rng_state(),
    }
    path = tmp_path / "s.safetensors"
    ct.save_state(path, model, opt, extra=extra)

    names = set(cairn.load(path))
    assert "model.0.weight" in names and "model.1.num_batches_tracked" in names
    assert "optimizer.state.0.d" in names and "optimizer.state.0.old_dirs.0" in names
    assert {"extra.by_int.3.0", "extra.by_int.7.k", "extra.rng"} <= names
    meta = cairn.load_metadata(path)
    assert meta["cairn.torch"]["optimizer_type"] == "LBFGS"

    back: dict[str, Any] = {}
    ct.load_state(path, extra=back)
    _assert_same(extra, back, "extra")
    model2, opt2 = _model(1), torch.optim.LBFGS(_model(2).parameters())
    ct.load_state(path, model2, opt2)  # LBFGS: options from the file, too
    _assert_same(opt.state_dict(), opt2.state_dict(), "optimizer")
    versions = model2[1].state_dict()._metadata  # type: ignore[attr-defined]
    assert versions == model[1].state_dict()._metadata  # type: ignore[attr-defined]


def test_load_state_refuses_what_the_file_does_not_hold(tmp_path: pathlib.Path) -> None:
    model = _model(0)
    opt = torch.optim.Adam(model.parameters())
    path = tmp_path / "s.safetensors"
    ct.save_state(path, model, opt)
    with pytest.raises(cairn.InvalidArgumentError, match="saved was Adam, not SGD"):
        ct.load_state(path, optimizer=torch.optim.SGD(model.parameters(), lr=1))
    with pytest.raises(cairn.InvalidArgumentError, match="holds no extra state"):
        ct.load_state(path, extra={})
    cairn.save({"w": torch.zeros(2)}, tmp_path / "plain.safetensors")
    with pytest.raises(cairn.InvalidArgumentError, match="not a file written by cairn.torch"):
        ct.load_state(tmp_path / "plain.safetensors", model)
    with pytest.raises(cairn.InvalidArgumentError, match="reserved"):
        ct.save_state(path, model, metadata={"cairn.torch": 1})
    with pytest.raises(TypeError, match="extra.bad: a builtins.object is not a tensor"):
        ct.save_state(path, extra={"bad": object()})
    with pytest.raises(RuntimeError, match="size mismatch"):
        ct.load_state(
            path,
            torch.nn.Sequential(
                torch.nn.Linear(4, 9),
                torch.nn.BatchNorm1d(9),
                torch.nn.Tanh(),
                torch.nn.Linear(9, 2),
            ),
        )


# ---- StateCheckpointManager --------------------------------------------------


def _state(seed: float) -> dict[str, Any]:
    return {
        "model": {"w": torch.full((3, 4), seed), "b": torch.arange(4, dtype=torch.int64)},
        "ema": np.full(5, seed, dtype=np.float64),
    }


def test_manager_saves_keeps_max_to_keep_and_restores_in_place(tmp_path: pathlib.Path) -> None:
    with ct.StateCheckpointManager(
        tmp_path / "run", max_to_keep=2, checkpoint_interval=10, keep_checkpoint_every_n_hours=1e6
    ) as mgr:
        assert mgr.latest is None
        assert mgr.save(0, _state(0.0), metrics={"loss": 1.0}) is not None
        assert mgr.save(5, _state(5.0)) is None  # fewer than 10 steps after 0
        assert mgr.save(10, _state(10.0), metadata={"lr": 0.1}) is not None
        rec = mgr.save(20, _state(20.0))
        assert rec is not None and rec.metrics["step"] == 20
        assert [r.metrics["step"] for r in mgr.checkpoints] == [10, 20]
        assert mgr.latest is not None and mgr.latest.name == rec.name
        assert mgr.last_step == 20

        target = _state(-1.0)
        w = target["model"]["w"]
        assert mgr.restore(target) == 20
        assert target["model"]["w"] is w  # in place
        assert torch.equal(w, torch.full((3, 4), 20.0))
        assert (target["ema"] == 20.0).all()

        meta: dict[str, Any] = {}
        assert mgr.restore(target, checkpoint=mgr.checkpoints[0], metadata=meta) == 10
        assert meta == {"lr": 0.1, "step": 10}
        assert torch.equal(w, torch.full((3, 4), 10.0))

    # A new manager sees the checkpoints.
    with ct.StateCheckpointManager(tmp_path / "run") as mgr:
        assert mgr.restore(_state(0.0)) == 20


def test_restore_is_strict_and_writes_nothing_on_a_mismatch(tmp_path: pathlib.Path) -> None:
    with ct.StateCheckpointManager(tmp_path / "run") as mgr:
        with pytest.raises(cairn.NotFoundError, match="no checkpoint"):
            mgr.restore(_state(0.0))
        mgr.save(1, _state(1.0))
        target = _state(-1.0)
        target["model"]["w"] = torch.zeros(4, 3)
        target["new"] = torch.zeros(1)
        del target["ema"]
        with pytest.raises(cairn.InvalidArgumentError) as e:
            mgr.restore(target)
        for name in ("model.w", "new", "ema"):
            assert name in str(e.value)
        assert torch.equal(target["model"]["b"], torch.arange(4))  # untouched: as made
        assert torch.equal(target["model"]["w"], torch.zeros(4, 3))
        with pytest.raises(cairn.InvalidArgumentError, match="not contiguous"):
            mgr.restore({"model": {"w": torch.zeros(4, 3).t(), "b": torch.zeros(4)}})
        ro = np.zeros(5)
        ro.flags.writeable = False
        with pytest.raises(cairn.InvalidArgumentError, match="read-only"):
            mgr.restore({"ema": ro})


def test_a_model_restores_in_place_through_its_state_dict(tmp_path: pathlib.Path) -> None:
    model = _model(0)
    with ct.StateCheckpointManager(tmp_path / "run") as mgr:
        mgr.save(7, {"model": model.state_dict()})
        other = _model(1)
        assert mgr.restore({"model": other.state_dict()}) == 7
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)


def test_a_second_manager_on_one_directory_is_locked(tmp_path: pathlib.Path) -> None:
    with ct.StateCheckpointManager(tmp_path / "run"):
        with pytest.raises(cairn.LockedError):
            ct.StateCheckpointManager(tmp_path / "run")


# ---- AsyncSaver ----------------------------------------------------------------


def test_async_save_snapshots_so_the_caller_may_change_tensors_at_once(
    tmp_path: pathlib.Path,
) -> None:
    w = torch.arange(1 << 20, dtype=torch.float32)
    a = np.arange(1000, dtype=np.int32)
    with cairn.CheckpointManager(tmp_path, "exp") as manager, ct.AsyncSaver() as saver:
        h = saver.save(
            {"w": w, "nested": {"a": a}}, manager, metrics={"loss": 0.5}, metadata={"step": 1}
        )
        w.fill_(-1.0)  # right after save() returned
        a[:] = -1
        rec = h.wait()
        assert h.done() and not h.skipped()
        assert rec is not None and rec.metrics == {"loss": 0.5}
        with rec.checkpoint.as_directory() as d:
            back = cairn.load(pathlib.Path(d) / "state.safetensors")
            assert cairn.load_metadata(pathlib.Path(d) / "state.safetensors") == {"step": 1}
        assert torch.equal(back["w"], torch.arange(1 << 20, dtype=torch.float32))
        assert torch.equal(back["nested.a"], torch.arange(1000, dtype=torch.int32))

        # Into a checkpoint folder of one's own.
        h2 = saver.save({"w": w}, tmp_path / "mine")
        w.fill_(3.0)
        assert h2.wait() is None
        assert h2.checkpoint.is_committed()
        assert (cairn.load(tmp_path / "mine" / "state.safetensors")["w"] == -1.0).all()
        # The files say which framework wrote them, as Hugging Face's do.
        saver.save({"a": a}, tmp_path / "numpy").wait()
        for folder, fmt in (("mine", "pt"), ("numpy", "np")):
            header = cairn._cairn.read_tensor_header(str(tmp_path / folder / "state.safetensors"))
            assert header[2].get("format") == fmt, folder


def test_reserving_ahead_readies_the_first_async_save(tmp_path: pathlib.Path) -> None:
    w = torch.arange(1 << 18, dtype=torch.float32)
    with ct.AsyncSaver() as saver:
        saver.reserve({"w": w})  # in the background: returns at once
        saver.save({"w": w}, tmp_path / "a").wait()
        # The save waited for the reservation and allocated nothing itself.
        assert saver.stats()["staging_allocations"] == 1
        assert torch.equal(cairn.load(tmp_path / "a" / "state.safetensors")["w"], w)
        saver.reserve({"w": torch.zeros(1 << 20)}, background=False)
        assert saver.stats()["staging_allocations"] == 2
        with pytest.raises(cairn.InvalidArgumentError):
            saver.reserve({"w": w}, buffers=2)  # one save in flight: one buffer
    manager = ct.StateCheckpointManager(tmp_path / "run")
    manager.reserve({"w": w}, metadata={"epoch": 1})
    for step in (1, 2):
        h = manager.save_async(step, {"w": w * step}, metadata={"epoch": step})
        assert h is not None
        h.wait()
    into = {"w": torch.zeros_like(w)}
    assert manager.restore(into) == 2
    assert torch.equal(into["w"], w * 2)
    manager.close()


def test_repeated_async_saves_of_the_same_tensors_save_their_values_of_the_moment(
    tmp_path: pathlib.Path,
) -> None:
    # The binding reuses the last state's entries when the tensors are the
    # same (names, dtypes, shapes, addresses): what is saved must still be
    # each save's values, and metadata, and a changed set must be seen.
    w = torch.zeros(1000)
    b = torch.zeros(10, dtype=torch.float64)
    with cairn.CheckpointManager(tmp_path, "exp") as manager, ct.AsyncSaver() as saver:
        for step in range(4):
            w.fill_(float(step))
            state = {"w": w, "b": b} if step < 3 else {"w": w}
            saver.save(state, manager, metrics={"step": step}, metadata={"step": step}).wait()
        history = manager.history()
        assert [r.metrics["step"] for r in history] == [0, 1, 2, 3]
        for r in history:
            with r.checkpoint.as_directory() as d:
                f = pathlib.Path(d) / "state.safetensors"
                back = cairn.load(f, mmap=False)
                step = r.metrics["step"]
                assert cairn.load_metadata(f) == {"step": step}
                assert (back["w"] == float(step)).all()
                assert sorted(back) == (["b", "w"] if step < 3 else ["w"])


def test_a_manager_closed_during_an_async_save_stays_open_for_it(
    tmp_path: pathlib.Path,
) -> None:
    saver = ct.AsyncSaver()
    manager = cairn.CheckpointManager(tmp_path, "exp")
    h = saver.save({"w": torch.ones(1 << 20)}, manager)
    manager.close()
    rec = h.wait()
    assert rec is not None and rec.checkpoint.is_committed()
    saver.close()  # lets go of the manager: its lock is released
    with cairn.CheckpointManager(tmp_path, "exp") as again:
        latest = again.latest()
        assert latest is not None and latest.name == rec.name


def test_a_failed_async_save_raises_a_cairn_error_once(tmp_path: pathlib.Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    saver = ct.AsyncSaver()
    with pytest.raises(cairn.Error):
        saver.save({"w": torch.zeros(4)}, tmp_path / "file" / "ckpt").wait()
    saver.close()  # the error was seen: not raised again
    with pytest.raises(cairn.FailedPreconditionError):
        saver.save({"w": torch.zeros(4)}, tmp_path / "later")


def test_manager_save_async_commits_in_the_background(tmp_path: pathlib.Path) -> None:
    w = torch.ones(1000)
    with ct.StateCheckpointManager(tmp_path / "run", max_to_keep=1) as mgr:
        h = mgr.save_async(3, {"w": w})
        assert h is not None
        w.zero_()
        rec = h.wait()
        assert rec is not None and rec.metrics["step"] == 3
        out = {"w": torch.empty(1000)}
        assert mgr.restore(out) == 3
        assert (out["w"] == 1).all()


# ---- the GIL -------------------------------------------------------------------


class _Ticker:
    """Counts how often another Python thread runs.

    Python hands the GIL to a waiting thread only every switch interval, or
    when the holder releases it: with a long interval, the ticker counts
    during a call only if the call releases the GIL.
    """

    def __init__(self, interval: float) -> None:
        self.ticks = 0
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.ticks += 1

    def __enter__(self) -> _Ticker:
        self._saved = sys.getswitchinterval()
        sys.setswitchinterval(self._interval)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._saved)

    def during(self, call: Callable[[], Any]) -> int:
        before = self.ticks
        call()
        return self.ticks - before


def test_saves_restores_and_waits_release_the_gil(tmp_path: pathlib.Path) -> None:
    big = {"w": torch.ones(16 << 20, dtype=torch.uint8)}
    with ct.StateCheckpointManager(tmp_path / "run") as mgr, _Ticker(0.1) as t:
        assert t.during(lambda: mgr.save(1, big)) > 0
    with ct.StateCheckpointManager(tmp_path / "run") as mgr, _Ticker(0.1) as t:
        assert t.during(lambda: mgr.restore(big)) > 0
    with _Ticker(0.1) as t:
        assert t.during(lambda: ct.save_state(tmp_path / "s.safetensors", extra=big)) > 0
    with _Ticker(0.1) as t:
        assert t.during(lambda: ct.save_sharded(tmp_path / "sh", 0, big)) > 0


def test_waiting_for_an_async_save_releases_the_gil(tmp_path: pathlib.Path) -> None:
    # The background write must still run when wait() starts, so the switch
    # interval stays short here (a long one would let the ticker keep the GIL
    # for that long once save() released it). A wait() holding the GIL would
    # still count no tick: the ticker cannot run without it.
    big = {"w": torch.ones(64 << 20, dtype=torch.uint8)}
    with ct.AsyncSaver() as saver, _Ticker(sys.getswitchinterval()) as t:
        h = saver.save(big, tmp_path / "async")
        if h.done():
            pytest.skip("the background save finished before wait() was called")
        assert t.during(h.wait) > 0


# ---- sharded saves ---------------------------------------------------------------


def test_two_ranks_save_and_three_ranks_load_their_shards_of_the_global_tensors(
    tmp_path: pathlib.Path,
) -> None:
    W = torch.arange(7 * 5, dtype=torch.float32).reshape(7, 5)
    E = torch.arange(9 * 2, dtype=torch.int64).reshape(9, 2)
    bias = torch.tensor([1.5, -2.0])
    dest = tmp_path / "sharded"

    def rank_state(rank: int, world: int) -> dict[str, Any]:
        (wo, ws), (eo, es) = (
            ct.even_split(W.shape, 0, rank, world),
            ct.even_split(E.shape, 1, rank, world),
        )
        w = W[wo[0] : wo[0] + ws[0]].contiguous()
        e = E[:, eo[1] : eo[1] + es[1]].contiguous()
        return {
            "layer": {"w": ct.Shard(w, W.shape, wo), "bias": bias},
            "emb": ct.Shard(e, E.shape, eo),
        }

    reports = [ct.save_sharded(dest, r, rank_state(r, 2)) for r in range(2)]
    with pytest.raises(cairn.InvalidArgumentError, match="saved by no rank"):
        ct.commit_sharded(dest, reports[:1])  # rank 1's rows missing
    ct.commit_sharded(dest, reports, metrics={"step": 4})
    assert cairn.Checkpoint.from_directory(dest).is_committed()

    for rank in range(3):
        # Rows split three ways now, and the embedding along dim 0 instead of 1.
        wo, ws = ct.even_split(W.shape, 0, rank, 3)
        eo, es = ct.even_split(E.shape, 0, rank, 3)
        local = {
            "layer": {"w": ct.Shard(torch.zeros(ws), W.shape, wo), "bias": torch.zeros(2)},
            "emb": ct.Shard(torch.zeros(es, dtype=torch.int64), E.shape, eo),
        }
        ct.load_sharded(dest, local)
        assert torch.equal(local["layer"]["w"].tensor, W[wo[0] : wo[0] + ws[0]])
        assert torch.equal(local["emb"].tensor, E[eo[0] : eo[0] + es[0]])
        assert torch.equal(local["layer"]["bias"], bias)

    whole = {"emb": torch.zeros(9, 2, dtype=torch.int64)}
    ct.load_sharded(dest, whole, strict=False)  # one rank, a subset
    assert torch.equal(whole["emb"], E)
    with pytest.raises(cairn.InvalidArgumentError, match="emb"):
        ct.load_sharded(dest, {"emb": torch.zeros(9, 2)})  # float, not int64


_RANK_PROGRAM = """
import json, sys
import torch
import cairn.torch as ct

dest, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
W = torch.arange(10 * 3, dtype=torch.float64).reshape(10, 3)
offsets, shape = ct.even_split(W.shape, 0, rank, world)
box = W[offsets[0]:offsets[0] + shape[0]].contiguous()
report = ct.save_sharded(dest, rank, {"w": ct.Shard(box, W.shape, offsets),
                                      "step": torch.tensor(7)})
print(json.dumps(report))
"""


def test_ranks_in_separate_processes_save_shards_that_one_commit_makes_whole(
    tmp_path: pathlib.Path,
) -> None:
    # As under a launcher: each rank its own process, writing into the same
    # uncommitted checkpoint at once; the reports travel as JSON.
    dest = tmp_path / "ckpt"
    world = 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_PROGRAM, str(dest), str(r), str(world)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    reports = []
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"rank {r}: {err}"
        reports.append(json.loads(out))
    assert not cairn.Checkpoint.from_directory(dest).is_committed()
    ct.commit_sharded(dest, reports)
    assert cairn.Checkpoint.from_directory(dest).verify() == []
    assert sorted(f.name for f in dest.glob("rank_*.safetensors")) == [
        f"rank_{r:05d}.safetensors" for r in range(world)
    ]
    whole = {"w": torch.zeros(10, 3, dtype=torch.float64), "step": torch.tensor(0)}
    ct.load_sharded(dest, whole)
    assert torch.equal(whole["w"], torch.arange(30, dtype=torch.float64).reshape(10, 3))
    assert int(whole["step"]) == 7


# ---- without torch ------------------------------------------------------------


def test_cairn_and_cairn_torch_import_without_torch(tmp_path: pathlib.Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, cairn, cairn.torch as ct\n"
        f"m = ct.StateCheckpointManager({str(tmp_path / 'np')!r})\n"
        "m.save(1, {'a': np.arange(3.0)}); out = {'a': np.zeros(3)}\n"
        "assert m.restore(out) == 1 and out['a'].tolist() == [0.0, 1.0, 2.0]\n"
        "m.close(); print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
