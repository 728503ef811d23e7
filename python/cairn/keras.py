"""cairn.keras: Keras 3 callbacks whose files go through a cairn.CheckpointManager.

Two callbacks, named and shaped as Keras' own so that a script changes its
import only:

- :class:`BackupAndRestore`, as ``keras.callbacks.BackupAndRestore``: a
  ``model.fit`` that was killed resumes, when run again, from the state it
  last committed (weights and optimizer variables), at that epoch, or with
  ``save_freq=N`` batches at that very step (the batches of the epoch done
  before it are skipped, not trained again: Keras' own resumes at the epoch).
- :class:`ModelCheckpoint`, as ``keras.callbacks.ModelCheckpoint``: the same
  ``monitor``/``mode``/``save_best_only``/``save_weights_only``/``save_freq``
  semantics, each save a committed Cairn checkpoint holding the file named
  by ``filepath`` (formatted with the epoch and logs as Keras does), with
  the logs as its metrics, and retention by ``num_to_keep``.

Both take a storage location instead of a folder of their own: a local path
or ``s3://`` URI (and an experiment ``name`` under it), opened as a
:class:`cairn.CheckpointManager`; every save is committed manifest-last, so
a crash never leaves a torn one to resume from. Two classes rather than one
because they answer two questions (where do I resume, which models do I
keep) and Keras users know them apart; they may share a storage path only
under different names.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Optional, Union

import keras

from cairn._args import check_public as _check_public
from cairn._checkpoint import Checkpoint
from cairn._manager import CheckpointConfig, CheckpointManager

_WEIGHTS = "model.weights.h5"


def _json_logs(logs: Optional[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue  # a non-scalar log (rare) is not a metric
    return out


class BackupAndRestore(keras.callbacks.BackupAndRestore):  # type: ignore[misc]
    """``keras.callbacks.BackupAndRestore`` whose backups are Cairn checkpoints.

    Args:
        backup_dir: a local path or ``s3://`` URI: the storage path of the
            :class:`cairn.CheckpointManager` holding the backups.
        save_freq: ``"epoch"``, or a number of batches between backups.
        double_checkpoint: accepted for Keras compatibility; every backup is
            committed atomically and the previous one kept until the next
            commits (``num_to_keep=2``), which is what it asked for.
        delete_checkpoint: at the end of a completed ``fit``, mark the
            backups done, so that the next ``fit`` starts afresh (Keras
            deletes its folder; committed checkpoints are never deleted
            behind the manager's back).
        name: the experiment's name under ``backup_dir`` ("" for the path itself).
        num_to_keep: how many backups the manager keeps (at least 1).

    Resuming at a step (``save_freq=N``) needs ``steps_per_execution=1`` and
    data whose order within an epoch does not depend on the epochs before
    (``shuffle=False``, or a dataset seeded per epoch).

    Raises:
        ValueError: ``save_freq`` neither "epoch" nor an int (as Keras),
            ``num_to_keep`` below 1; at ``fit``, an unbuilt model (as
            Keras) or step resume with ``steps_per_execution`` > 1.
    """

    def __init__(
        self,
        backup_dir: Union[str, os.PathLike[str]],
        save_freq: Union[str, int] = "epoch",
        double_checkpoint: bool = False,
        delete_checkpoint: bool = True,
        name: str = "",
        num_to_keep: int = 2,
    ) -> None:
        super().__init__(
            os.fspath(backup_dir),
            save_freq=save_freq,
            double_checkpoint=double_checkpoint,
            delete_checkpoint=delete_checkpoint,
        )
        if num_to_keep < 1:
            raise ValueError(f"num_to_keep: at least 1, not {num_to_keep}")
        self._storage = os.fspath(backup_dir)
        self._name = name
        self._num_to_keep = num_to_keep
        self._manager: Optional[CheckpointManager] = None
        self._steps_done = 0  # batches of the current epoch already trained
        self._to_skip = 0  # batches of the resumed epoch still to skip
        self._skip_total = 0  # batches of the resumed epoch skipped in all
        self._resume_epoch: Optional[int] = None

    # ---- storage -------------------------------------------------------------

    def _open(self) -> CheckpointManager:
        if self._manager is None or self._manager.closed:
            self._manager = CheckpointManager(
                self._storage, self._name, CheckpointConfig(num_to_keep=self._num_to_keep)
            )
        return self._manager

    def _close(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None

    # ---- Keras hooks ---------------------------------------------------------

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        self._steps_done = 0
        self._to_skip = self._skip_total = 0
        self._resume_epoch = None
        self._current_epoch = 0
        self._batches_seen_since_last_saving = 0
        self._last_batch_seen = 0
        self._load_model()

    def _load_model(self) -> None:
        if not self.model.built:
            raise ValueError(
                "To use the BackupAndRestore callback, your model must be built before you "
                f"call `fit()`. Model {self.model} is unbuilt."
            )
        latest = self._open().latest()
        if latest is None or latest.metrics.get("completed"):
            return
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        with latest.checkpoint.as_directory() as folder:
            self.model.load_weights(os.path.join(folder, _WEIGHTS))
        epoch, step = int(latest.metrics["epoch"]), int(latest.metrics.get("step", 0))
        self.model._initial_epoch = epoch
        self._current_epoch = epoch
        if step > 0:
            if getattr(self.model, "steps_per_execution", 1) != 1:
                raise ValueError(
                    f"BackupAndRestore: the backup in {latest.checkpoint.path} was taken after "
                    f"batch {step} of epoch {epoch}; resuming at a step needs "
                    "steps_per_execution=1"
                )
            self._resume_epoch, self._to_skip, self._skip_total = epoch, step, step

    def on_epoch_begin(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._current_epoch = epoch
        self._steps_done = 0
        if epoch == self._resume_epoch and self._to_skip > 0:
            self._install_skipper()

    def _install_skipper(self) -> None:
        """Makes the next ``_to_skip`` training steps consume their batch
        without training on it (their work is in the restored state)."""
        model = self.model
        train_function = model.train_function

        def skip_or_train(iterator: Any) -> Any:
            if self._to_skip > 0:
                self._to_skip -= 1
                next(iterator)
                return model.get_metrics_result()
            model.train_function = train_function
            return train_function(iterator)

        model.train_function = skip_or_train

    def on_train_batch_end(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._steps_done = batch + 1
        if self._current_epoch == self._resume_epoch and batch < self._skip_total:
            self._last_batch_seen = batch
            return  # a skipped batch: its work is in the restored state
        if self._should_save_on_batch(batch):
            self._save_model()

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._current_epoch = epoch + 1
        self._steps_done = 0
        self._last_batch_seen = 0
        self._resume_epoch = None
        if self.save_freq == "epoch":
            self._save_model()

    def _save_model(self) -> None:
        folder = tempfile.mkdtemp(prefix="cairn-keras-backup-")
        try:
            self.model.save_weights(os.path.join(folder, _WEIGHTS), overwrite=True)
            step = 0 if self.save_freq == "epoch" else self._steps_done
            self._open().register_checkpoint(
                {"epoch": self._current_epoch, "step": step}, Checkpoint.from_directory(folder)
            )
        finally:
            # ignore-error: a temporary folder; its files are committed or the save raised.
            shutil.rmtree(folder, ignore_errors=True)

    def on_train_end(self, logs: Optional[dict[str, Any]] = None) -> None:
        try:
            if self.delete_checkpoint and self._open().latest() is not None:
                self._open().register_checkpoint(
                    {"completed": True, "epoch": self._current_epoch},
                    Checkpoint.from_dict({"completed": True}),
                )
        finally:
            self._close()


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):  # type: ignore[misc]
    """``keras.callbacks.ModelCheckpoint`` whose saves are Cairn checkpoints.

    Args:
        storage_path: a local path or ``s3://`` URI where the
            :class:`cairn.CheckpointManager` keeps the checkpoints.
        filepath: the file's name inside each checkpoint, formatted as
            Keras does (``"model-{epoch:02d}-{val_loss:.2f}.keras"``); it
            must end in ``.keras`` (or ``.weights.h5`` with
            ``save_weights_only``). No folder part.
        monitor, verbose, save_best_only, save_weights_only, mode,
            save_freq, initial_value_threshold: as Keras'.
        name: the experiment's name under ``storage_path``.
        num_to_keep: keep only the best ``num_to_keep`` checkpoints by
            ``monitor`` (``mode``), the most recent always; None keeps all.

    Each checkpoint's metrics are the logs of its save, with ``epoch``
    (counted from 1, as in the file name).

    Raises:
        ValueError: as Keras' (a bad ``save_freq`` or file extension), or a
            ``filepath`` with a folder part.
    """

    def __init__(
        self,
        storage_path: Union[str, os.PathLike[str]],
        filepath: str = "model.keras",
        monitor: str = "val_loss",
        verbose: int = 0,
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: Union[str, int] = "epoch",
        initial_value_threshold: Optional[float] = None,
        name: str = "",
        num_to_keep: Optional[int] = None,
    ) -> None:
        if os.path.dirname(filepath) or filepath in ("", ".", ".."):
            raise ValueError(
                f"filepath {filepath!r}: a file name inside each checkpoint, with no folder "
                "(the checkpoints live under storage_path)"
            )
        super().__init__(
            filepath,
            monitor=monitor,
            verbose=verbose,
            save_best_only=save_best_only,
            save_weights_only=save_weights_only,
            mode=mode,
            save_freq=save_freq,
            initial_value_threshold=initial_value_threshold,
        )
        self._storage = os.fspath(storage_path)
        self._name = name
        if num_to_keep is not None:
            if self.monitor_op is None:
                self._set_monitor_op()
            order = "max" if self.monitor_op == keras.ops.greater else "min"
            config = CheckpointConfig(
                num_to_keep=num_to_keep,
                checkpoint_score_attribute=monitor,
                checkpoint_score_order=order,
            )
        else:
            config = CheckpointConfig()
        self._config = config
        self._manager: Optional[CheckpointManager] = None

    def _open(self) -> CheckpointManager:
        if self._manager is None or self._manager.closed:
            self._manager = CheckpointManager(self._storage, self._name, self._config)
        return self._manager

    def _save_model(self, epoch: int, batch: Optional[int], logs: Optional[dict[str, Any]]) -> None:
        filename = self._get_file_path(epoch, batch, logs)
        if not self._should_save_model(epoch, batch, logs, filename):
            return
        folder = tempfile.mkdtemp(prefix="cairn-keras-checkpoint-")
        try:
            path = os.path.join(folder, filename)
            if self.save_weights_only:
                self.model.save_weights(path, overwrite=True)
            else:
                self.model.save(path, overwrite=True)
            metrics = _json_logs(logs)
            metrics["epoch"] = epoch + 1
            if batch is not None:
                metrics["batch"] = batch + 1
            self._open().register_checkpoint(metrics, Checkpoint.from_directory(folder))
        finally:
            # ignore-error: a temporary folder; its files are committed or the save raised.
            shutil.rmtree(folder, ignore_errors=True)

    def on_train_end(self, logs: Optional[dict[str, Any]] = None) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None

    @property
    def manager(self) -> CheckpointManager:
        """The CheckpointManager holding the saves (opened on first use)."""
        return self._open()


__all__ = ["BackupAndRestore", "ModelCheckpoint"]


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
