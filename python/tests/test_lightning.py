"""Lightning 2.6 through Cairn: the CheckpointIO plugins and Ray's Lightning names.

The fits are lightning_fit.py's tiny deterministic module (seed_everything,
deterministic=True) with the real Lightning Trainer and ModelCheckpoint; the
crash test SIGKILLs real child processes; the Ray guide's Lightning example
runs under cairn.train with 2 workers.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
from typing import Any

import cairn
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")
import lightning_fit as lf  # noqa: E402
from cairn import train  # noqa: E402
from cairn.lightning import AsyncCairnCheckpointIO, CairnCheckpointIO  # noqa: E402
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

HERE = pathlib.Path(__file__).parent
EPOCHS = 6
# Enough epochs that a fit killed a few saves in (an epoch takes milliseconds,
# so a fit runs on a few epochs before its kill lands) still has saves left.
CRASH_EPOCHS = 16


def _equal(a: Any, b: Any, at: str = "") -> None:
    """Asserts ``a`` and ``b`` equal: same types, keys in order, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), at
        assert (a.dtype, a.shape, a.device, a.requires_grad) == (
            b.dtype,
            b.shape,
            b.device,
            b.requires_grad,
        ), at
        assert torch.equal(a.detach(), b.detach()) if a.numel() else True, at
        return
    assert type(a) is type(b), (at, type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b), at
        for k in a:
            _equal(a[k], b[k], f"{at}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), at
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{at}/{i}")
    elif isinstance(a, float) and a != a:
        assert b != b, at
    else:
        assert a == b, (at, a, b)


def _plugin(kind: str) -> Any:
    return lf.make_plugin(kind)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The final state of an uninterrupted fit of EPOCHS epochs."""
    trainer, model = lf.fit(CairnCheckpointIO(), str(tmp_path_factory.mktemp("ref")), EPOCHS)
    return lf.final_state(trainer, model)


@pytest.fixture(scope="module")
def reference_long(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The final state of an uninterrupted fit of CRASH_EPOCHS epochs."""
    trainer, model = lf.fit(CairnCheckpointIO(), str(tmp_path_factory.mktemp("ref")), CRASH_EPOCHS)
    return lf.final_state(trainer, model)


def _is_cairn_checkpoint(path: pathlib.Path) -> bool:
    return path.is_dir() and train.Result.from_path(path).checkpoint is not None


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fit_top_k_last_and_resume_bit_for_bit(
    kind: str, tmp_path: pathlib.Path, reference: dict[str, Any]
) -> None:
    half = EPOCHS // 2
    lf.fit(_plugin(kind), str(tmp_path), half)
    names = sorted(p.name for p in tmp_path.iterdir())
    # save_top_k=2 by val_loss (which falls every epoch) and last.ckpt: the
    # losers were removed through the plugin.
    assert names == [f"epoch={half - 2}-step=8.ckpt", f"epoch={half - 1}-step=12.ckpt", "last.ckpt"]
    assert all(_is_cairn_checkpoint(tmp_path / n) for n in names)
    last = CairnCheckpointIO().load_checkpoint(tmp_path / "last.ckpt")
    assert last["epoch"] == half - 1 and last["global_step"] == half * lf.STEPS_PER_EPOCH
    trainer, model = lf.fit(_plugin(kind), str(tmp_path), EPOCHS, ckpt_path="last")
    _equal(lf.final_state(trainer, model), reference)
    assert sorted(p.name for p in tmp_path.iterdir())[-1] == "last.ckpt"


def test_the_dict_comes_back_as_torch_checkpoint_io_gives_it(tmp_path: pathlib.Path) -> None:
    trainer, _ = lf.fit(CairnCheckpointIO(), str(tmp_path / "fit"), 2)
    checkpoint = trainer._checkpoint_connector.dump_checkpoint()
    shared = torch.arange(6.0)
    checkpoint["extra"] = {
        "bf16": torch.ones(3, dtype=torch.bfloat16),
        "int": torch.tensor([1, -2], dtype=torch.int64),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
        "complex": torch.tensor([1 + 2j]),  # no safetensors dtype: pickled
        "param": torch.nn.Parameter(torch.ones(2)),  # requires_grad: pickled
        "same": [shared, shared],
        "objects": (argparse.Namespace(a=1), pathlib.PurePosixPath("x/y"), None, float("inf")),
        0: "int key",
    }
    TorchCheckpointIO().save_checkpoint(checkpoint, tmp_path / "torch.ckpt")
    expected = TorchCheckpointIO().load_checkpoint(tmp_path / "torch.ckpt", weights_only=False)
    for kind in ("sync", "async"):
        plugin = _plugin(kind)
        plugin.save_checkpoint(checkpoint, tmp_path / f"{kind}.ckpt")
        got = plugin.load_checkpoint(tmp_path / f"{kind}.ckpt")
        _equal(expected, got)
        assert got["extra"]["same"][0] is got["extra"]["same"][1]  # one tensor, as saved
        plugin.teardown()
    # The engine holds the tensors, named by where they sit; pickle the rest.
    (record,) = (tmp_path / "sync.ckpt").glob("checkpoint_0*")
    names = set(cairn.load(record / "state.safetensors"))
    assert "state_dict/net.0.weight" in names and "extra/bf16" in names
    assert "optimizer_states/0/state/0/exp_avg" in names and "extra/complex" not in names
    # weights_only: torch's restricted unpickler, with Lightning's own types refused as torch does.
    del checkpoint["extra"]
    CairnCheckpointIO().save_checkpoint(checkpoint, tmp_path / "plain.ckpt")
    TorchCheckpointIO().save_checkpoint(checkpoint, tmp_path / "plain_torch.ckpt")
    _equal(
        TorchCheckpointIO().load_checkpoint(tmp_path / "plain_torch.ckpt", weights_only=True),
        CairnCheckpointIO().load_checkpoint(tmp_path / "plain.ckpt", weights_only=True),
    )
    # map_location moves tensors as torch.load's does.
    moved = CairnCheckpointIO().load_checkpoint(tmp_path / "plain.ckpt", map_location="meta")
    assert moved["state_dict"]["net.0.weight"].device.type == "meta"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_every_n_train_steps_keeps_the_newest_and_link_mode_links(
    kind: str, tmp_path: pathlib.Path, reference: dict[str, Any]
) -> None:
    steps = ModelCheckpoint(dirpath=tmp_path / "steps", every_n_train_steps=3, save_top_k=1)
    trainer, _ = lf.fit(_plugin(kind), str(tmp_path / "steps"), 2, checkpoint=steps)
    assert [p.name for p in (tmp_path / "steps").iterdir()] == ["epoch=1-step=6.ckpt"]
    linked = ModelCheckpoint(
        dirpath=tmp_path / "link", monitor="val_loss", save_top_k=1, save_last="link"
    )
    lf.fit(_plugin(kind), str(tmp_path / "link"), 3, checkpoint=linked)
    last = tmp_path / "link" / "last.ckpt"
    assert last.is_symlink() and os.readlink(last) == "epoch=2-step=12.ckpt"
    assert sorted(p.name for p in (tmp_path / "link").iterdir()) == [
        "epoch=2-step=12.ckpt",
        "last.ckpt",
    ]
    linked = ModelCheckpoint(
        dirpath=tmp_path / "link", monitor="val_loss", save_top_k=1, save_last="link"
    )
    trainer, model = lf.fit(
        _plugin(kind), str(tmp_path / "link"), EPOCHS, ckpt_path="last", checkpoint=linked
    )
    _equal(lf.final_state(trainer, model), reference)
    assert os.readlink(last) == f"epoch={EPOCHS - 1}-step={EPOCHS * lf.STEPS_PER_EPOCH}.ckpt"


def test_s3_save_overwrite_load_and_resume(
    s3_through_python: str, tmp_path: pathlib.Path, reference: dict[str, Any]
) -> None:
    root = s3_through_python
    trainer, model = lf.fit(CairnCheckpointIO(), str(tmp_path), EPOCHS // 2)
    for kind in ("sync", "async"):
        plugin = _plugin(kind)
        trainer.strategy.checkpoint_io = plugin
        trainer.save_checkpoint(f"{root}/{kind}.ckpt")
        trainer.save_checkpoint(f"{root}/{kind}.ckpt")  # overwritten: a new commit
        plugin.teardown()
        expected = trainer._checkpoint_connector.dump_checkpoint()
        _equal(expected, plugin.load_checkpoint(f"{root}/{kind}.ckpt"))
        assert len(train.Result.from_path(f"{root}/{kind}.ckpt").best_checkpoints) == 1
        # Top-k removal in a store: the name is gone, the others stay.
        trainer.save_checkpoint(f"{root}/{kind}-old.ckpt")
        plugin.remove_checkpoint(f"{root}/{kind}-old.ckpt")
        with pytest.raises(FileNotFoundError, match=f"{kind}-old.ckpt"):
            plugin.load_checkpoint(f"{root}/{kind}-old.ckpt")
        _equal(expected, plugin.load_checkpoint(f"{root}/{kind}.ckpt"))
    trainer, model = lf.fit(
        CairnCheckpointIO(), str(tmp_path / "resumed"), EPOCHS, ckpt_path=f"{root}/sync.ckpt"
    )
    _equal(lf.final_state(trainer, model), reference)


def test_bad_input_is_refused_naming_the_thing_at_fault(tmp_path: pathlib.Path) -> None:
    plugin = CairnCheckpointIO()
    checkpoint = {"state_dict": {"w": torch.ones(4)}, "epoch": 1}
    plugin.save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    # A committed file changed afterwards: the checksum names it.
    (record,) = (tmp_path / "a.ckpt").glob("checkpoint_0*")
    data = bytearray((record / "state.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (record / "state.safetensors").write_bytes(bytes(data))
    with pytest.raises(cairn.CorruptionError, match="state.safetensors"):
        plugin.load_checkpoint(tmp_path / "a.ckpt")
    # A folder that is no Cairn checkpoint, a missing path.
    (tmp_path / "other.ckpt").mkdir()
    (tmp_path / "other.ckpt" / "x").write_text("x")
    with pytest.raises(cairn.InvalidArgumentError, match="other.ckpt: not a checkpoint saved"):
        plugin.load_checkpoint(tmp_path / "other.ckpt")
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        plugin.load_checkpoint(tmp_path / "missing.ckpt")
    # A plain Lightning file (TorchCheckpointIO's) is read as that plugin reads it...
    TorchCheckpointIO().save_checkpoint(checkpoint, tmp_path / "plain.ckpt")
    _equal(checkpoint, plugin.load_checkpoint(tmp_path / "plain.ckpt", weights_only=True))
    # ... and never overwritten by a save.
    for p in (CairnCheckpointIO(), AsyncCairnCheckpointIO()):
        with pytest.raises(FileExistsError, match="plain.ckpt: a file, not a Cairn checkpoint"):
            p.save_checkpoint({"epoch": 2}, tmp_path / "plain.ckpt")
        with pytest.raises(NotImplementedError, match="storage_options"):
            p.save_checkpoint(checkpoint, tmp_path / "b.ckpt", storage_options={"x": 1})
        with pytest.raises(TypeError, match="path"):
            p.save_checkpoint(checkpoint, 3)
        p.teardown()
    assert plugin.load_checkpoint(tmp_path / "plain.ckpt", weights_only=True)["epoch"] == 1
    # Removal: a folder goes whole, a missing one is no error.
    plugin.remove_checkpoint(tmp_path / "a.ckpt")
    plugin.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    # Ray's names Cairn lacks.
    from cairn.train.lightning import RayFSDPStrategy, RayTrainReportCallback, prepare_trainer

    with pytest.raises(NotImplementedError, match="RayFSDPStrategy"):
        RayFSDPStrategy()
    trainer, _ = lf.fit(CairnCheckpointIO(), str(tmp_path / "fit"), 1)
    with pytest.raises(RuntimeError, match="Invalid strategy class"):
        prepare_trainer(trainer)
    with pytest.raises(NotImplementedError, match="checkpoint_upload_mode"):
        RayTrainReportCallback(checkpoint_upload_mode="sync")


def _cut_short(dirpath: pathlib.Path) -> int:
    """Saves a kill cut short: checkpoint folders without a manifest in a
    *.ckpt, and hidden staging folders of new names never renamed."""
    uncommitted = sum(
        1
        for ckpt in dirpath.glob("*.ckpt")
        for c in ckpt.glob("checkpoint_0*")
        if not (c / ".cairn" / "manifest.json").exists()
    )
    return uncommitted + len(list(dirpath.glob(".*.cairn-new-*")))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sigkill_at_random_instants_then_resume_ends_bit_for_bit(
    kind: str, tmp_path: pathlib.Path, reference_long: dict[str, Any]
) -> None:
    """A fit SIGKILLed several times (at a random instant within 30 ms after
    its n-th save began, n from 1 to 3) and resumed from last.ckpt each time
    ends equal to one never killed;
    after every kill each *.ckpt loads whole and last.ckpt is not older
    than before."""
    seed = int(os.environ.get("CAIRN_TEST_SEED", "0")) or random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)  # CAIRN_TEST_SEED=<seed> replays a run's kill points
    dirpath, out = tmp_path / "ckpt", tmp_path / "final.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    kills = int(os.environ.get("CAIRN_LIGHTNING_KILLS", "3"))
    last_epoch, cut_short = -1, 0
    for attempt in range(kills + 1):
        args = [sys.executable, str(HERE / "lightning_fit.py"), kind, str(dirpath)]
        args += [str(CRASH_EPOCHS)]
        args += [str(out)] + (["resume"] if (dirpath / "last.ckpt").exists() else [])
        log = tmp_path / f"stderr_{attempt}.txt"
        with open(log, "wb") as err:
            child = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=err)
        assert child.stdout is not None
        target = rng.randint(1, 3) if attempt < kills else None
        for line in child.stdout:  # ends when the child exits
            if target is not None and line.startswith(f"saving {target} ".encode()):
                # A random instant in the next 30 ms: before the write (the
                # pickling), inside it (a few ms for 3 MiB and the fsyncs),
                # or in the training after it.
                time.sleep(rng.uniform(0, 0.03))
                child.send_signal(signal.SIGKILL)
                break
        code = child.wait(timeout=300)
        child.stdout.close()
        if attempt < kills:
            assert code == -signal.SIGKILL, f"seed {seed}, attempt {attempt}: ended before its kill"
            cut_short += _cut_short(dirpath) > 0
            for ckpt in dirpath.glob("*.ckpt"):
                loaded = CairnCheckpointIO().load_checkpoint(ckpt)  # whole: checksums verified
                if ckpt.name == "last.ckpt":
                    assert loaded["epoch"] >= last_epoch
                    last_epoch = loaded["epoch"]
        else:
            assert code == 0, f"seed {seed}: {log.read_text()[-3000:]}"
    final = torch.load(out, weights_only=False)
    _equal(final, reference_long)
    print(f"{kind}: {kills} kills, {cut_short} of them cut a save short")


def test_ray_guide_lightning_example_restores_after_a_worker_is_killed(
    tmp_path: pathlib.Path,
) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), PYTHONDONTWRITEBYTECODE="1")
    results = {}
    # As published (Lightning's TorchCheckpointIO inside Cairn's checkpoint),
    # and with the Lightning Trainer saving through CairnCheckpointIO: rank 0
    # saves, both ranks load after the restart.
    for name, kill, plugin in (
        ("killed", "2", ""),
        ("killed_cairn", "2", "cairn"),
        ("clean", None, ""),
    ):
        run_env = dict(env, CAIRN_EXAMPLE_KILL_AT=kill) if kill else dict(env)
        run_env["CAIRN_EXAMPLE_PLUGIN"] = plugin
        done = subprocess.run(
            [sys.executable, str(HERE / "lightning_ray_example.py"), name, str(tmp_path)],
            cwd=tmp_path,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        result = train.Result.from_path(tmp_path / name)
        assert result.error is None and result.metrics["epoch"] == 3
        with result.checkpoint.as_directory() as d:
            path = os.path.join(d, "checkpoint.ckpt")
            results[name] = (
                CairnCheckpointIO().load_checkpoint(path)
                if plugin
                else torch.load(path, weights_only=False)
            )
            assert os.path.isdir(path) == bool(plugin)
        assert done.stdout.strip().endswith(f"restores {1 if kill else 0}")
    assert len(train.Result.from_path(tmp_path / "killed").best_checkpoints) == 2
    for name in ("killed", "killed_cairn"):
        _equal(results[name]["state_dict"], results["clean"]["state_dict"])
        _equal(results[name]["optimizer_states"], results["clean"]["optimizer_states"])
