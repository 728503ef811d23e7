"""cairn.Checkpoint and cairn.CheckpointManager from Python: the C++ behaviour, Ray's names."""

from __future__ import annotations

import os
import pathlib

import cairn
import pytest


def test_a_directory_checkpoint_is_its_own_local_view(state_dir: pathlib.Path) -> None:
    ckpt = cairn.Checkpoint.from_directory(state_dir)
    assert ckpt.path == str(state_dir)
    with ckpt.as_directory() as path:
        assert path == str(state_dir)
        assert (pathlib.Path(path) / "opt" / "adam.json").read_text() == '{"lr": 0.001}'
    assert sorted(ckpt.files()) == [("model.bin", 16384), ("opt/adam.json", 13)]
    assert not ckpt.is_committed()


def test_to_directory_copies_every_file(state_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "copy"
    out = cairn.Checkpoint.from_directory(state_dir).to_directory(dest)
    assert out == str(dest)
    assert (dest / "model.bin").read_bytes() == (state_dir / "model.bin").read_bytes()
    temp = cairn.Checkpoint.from_directory(state_dir).to_directory()
    try:
        assert (pathlib.Path(temp) / "opt" / "adam.json").exists()
    finally:
        import shutil

        shutil.rmtree(temp)


def test_metadata_round_trips_json_values_and_updates_merge(state_dir: pathlib.Path) -> None:
    ckpt = cairn.Checkpoint.from_directory(state_dir)
    assert ckpt.get_metadata() == {}
    meta = {"epoch": 3, "lr": 0.5, "tags": ["a", None, True], "nested": {"big": 2**63 + 1}}
    ckpt.set_metadata(meta)
    assert ckpt.get_metadata() == meta
    ckpt.update_metadata({"epoch": 4})
    assert ckpt.get_metadata()["epoch"] == 4
    assert ckpt.get_metadata()["tags"] == ["a", None, True]


def test_values_that_are_not_json_are_type_errors_before_any_write(
    state_dir: pathlib.Path,
) -> None:
    ckpt = cairn.Checkpoint.from_directory(state_dir)
    with pytest.raises(TypeError, match="not a JSON value: object of type object"):
        ckpt.set_metadata({"x": object()})
    with pytest.raises(TypeError, match="dict keys must be str, got int"):
        ckpt.set_metadata({1: 2})
    with pytest.raises(ValueError, match="64 bits"):
        ckpt.set_metadata({"x": 2**70})
    assert ckpt.get_metadata() == {}


def test_from_dict_holds_small_state_in_memory() -> None:
    ckpt = cairn.Checkpoint.from_dict({"step": 7, "rng": [1, 2, 3]})
    assert ckpt.to_dict() == {"step": 7, "rng": [1, 2, 3]}
    with ckpt.as_directory() as path:
        assert pathlib.Path(path, "dict.json").exists()


def test_manager_keeps_the_best_k_and_a_new_process_sees_the_history(
    state_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    config = cairn.CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="val/loss", checkpoint_score_order="min"
    )
    ckpt = cairn.Checkpoint.from_directory(state_dir)
    with cairn.CheckpointManager(tmp_path / "runs", "exp", config) as manager:
        for loss in [0.5, 0.2, 0.9, 0.3]:
            record = manager.register_checkpoint({"val": {"loss": loss}}, ckpt)
            assert record.checkpoint.is_committed()
        assert [r.metrics["val"]["loss"] for r in manager.best()] == [0.2, 0.3]
        assert manager.latest().name == "checkpoint_000003"
    assert sorted(os.listdir(tmp_path / "runs" / "exp")) == [
        ".cairn.lock",
        "checkpoint_000001",
        "checkpoint_000003",
        "checkpoint_manager.json",
        "checkpoint_manager.log",
    ]
    with cairn.CheckpointManager(str(tmp_path / "runs" / "exp"), config=config) as again:
        names = [r.name for r in again.history()]
        assert names == ["checkpoint_000001", "checkpoint_000003"]
        best = again.best()[0].checkpoint
        assert best.verify() == []
        with best.as_directory() as path:
            stored = pathlib.Path(path, "model.bin").read_bytes()
            assert stored == (state_dir / "model.bin").read_bytes()


def test_a_retired_checkpoint_is_gone_when_the_save_returns_and_its_space_once_waited_for(
    state_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    exp = tmp_path / "exp"
    ckpt = cairn.Checkpoint.from_directory(state_dir)
    with cairn.CheckpointManager(tmp_path, "exp", cairn.CheckpointConfig(num_to_keep=1)) as m:
        for _ in range(3):
            m.register_checkpoint({}, ckpt)
            folders = sorted(n for n in os.listdir(exp) if n.startswith("checkpoint_0"))
            assert folders == [m.latest().name]
        m.wait_for_deletes()
        assert not (exp / ".cairn.trash").exists()
    assert sorted(n for n in os.listdir(exp) if not n.startswith("checkpoint_manager")) == [
        ".cairn.lock",
        "checkpoint_000002",
    ]


def test_a_damaged_file_fails_verification_naming_it(
    state_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    with cairn.CheckpointManager(tmp_path, "exp") as manager:
        record = manager.register_checkpoint({}, cairn.Checkpoint.from_directory(state_dir))
    stored = pathlib.Path(record.checkpoint.path) / "model.bin"
    data = bytearray(stored.read_bytes())
    data[100] ^= 1
    stored.write_bytes(bytes(data))
    problems = record.checkpoint.verify()
    assert [p.path for p in problems] == ["model.bin"]
    assert problems[0].reason


def test_errors_are_cairn_exceptions_with_the_cpp_message(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope"
    with cairn.CheckpointManager(tmp_path, "exp") as manager:
        with pytest.raises(cairn.NotFoundError) as info:
            manager.register_checkpoint({}, cairn.Checkpoint.from_directory(missing))
    assert str(missing) in str(info.value)
    assert info.value.code == "not_found"
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, cairn.Error)
    with pytest.raises(cairn.InvalidArgumentError, match="num_to_keep"):
        cairn.CheckpointConfig(num_to_keep=0)
    with pytest.raises(cairn.InvalidArgumentError, match="checkpoint_score_order"):
        cairn.CheckpointConfig(checkpoint_score_order="best")


def test_an_experiment_is_locked_until_its_manager_is_closed(tmp_path: pathlib.Path) -> None:
    manager = cairn.CheckpointManager(tmp_path, "exp")
    with pytest.raises(cairn.LockedError) as info:
        cairn.CheckpointManager(tmp_path, "exp")
    assert info.value.code == "locked"
    manager.close()
    assert manager.closed
    with pytest.raises(cairn.FailedPreconditionError, match="closed"):
        manager.latest()
    cairn.CheckpointManager(tmp_path, "exp").close()


def test_a_save_releases_the_gil_so_other_threads_run(
    tmp_path: pathlib.Path, s3_through_python: str
) -> None:
    # Every request of the save goes through a relay of Python threads
    # (conftest.py): it can finish only if the save lets them run. A save
    # holding the GIL would wait on its requests until they time out.
    big = tmp_path / "big"
    big.mkdir()
    (big / "blob").write_bytes(os.urandom(1 << 20))  # four 256 KiB parts
    (big / "small").write_bytes(b"small")
    with cairn.CheckpointManager(s3_through_python, "exp") as manager:
        record = manager.register_checkpoint({"step": 1}, cairn.Checkpoint.from_directory(big))
        assert record.checkpoint.verify() == []
        with record.checkpoint.as_directory() as view:
            assert (pathlib.Path(view) / "blob").read_bytes() == (big / "blob").read_bytes()


def test_an_s3_checkpoints_filesystem_reaches_the_endpoint_cairn_itself_uses(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The endpoint comes from the profile's services section, which only
    # Cairn's C++ resolution (as the AWS CLI's) knows about.
    pytest.importorskip("pyarrow")
    config = tmp_path / "config"
    config.write_text(
        "[profile other]\nregion = eu-west-3\nservices = mine\n"
        "[services mine]\ns3 =\n  endpoint_url = http://127.0.0.1:9999\n"
    )
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_PROFILE", "other")
    fs = cairn.Checkpoint("s3://bucket/run/checkpoint_000000").filesystem
    options = fs.__reduce__()[1][0]
    assert options["endpoint_override"] == "http://127.0.0.1:9999"
    assert options["region"] == "eu-west-3"
