"""cairn.train.tensorflow.keras: ReportCheckpointCallback, as Ray's.

A Keras callback for ``model.fit`` inside a TensorflowTrainer's (or a Tune
trial's) training function: at the Keras events named, it reports the logs
as metrics and, for ``checkpoint_on`` events, the model saved as
``model.keras`` (weights, optimizer state and architecture) with
:func:`cairn.train.report`. Every rank saves; only the chief's file is
committed (the trainer's rule); each rank's temporary folder is removed once
the report returns.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Optional, Union

import keras

from cairn._args import check_public as _check_public
from cairn._checkpoint import Checkpoint

# The Keras events a callback may act on, as Ray's (the hook's name less "on_").
_EVENTS = (
    "epoch_begin",
    "epoch_end",
    "train_batch_begin",
    "train_batch_end",
    "test_batch_begin",
    "test_batch_end",
    "predict_batch_begin",
    "predict_batch_end",
    "train_begin",
    "train_end",
    "test_begin",
    "test_end",
    "predict_begin",
    "predict_end",
)

# The file name of the model in a reported checkpoint, and the metadata key
# that says so (Ray's TensorflowCheckpoint uses the same).
MODEL_FILENAME = "model.keras"
MODEL_FILENAME_KEY = "_model_filename"


def _events(value: Union[str, list[str]], parameter: str) -> list[str]:
    events = [value] if isinstance(value, str) else list(value)
    bad = [e for e in events if e not in _EVENTS]
    if bad:
        raise ValueError(f"{parameter}: unknown Keras event(s) {bad}; one of {list(_EVENTS)}")
    return events


def _number(value: Any) -> Any:
    """A log value as a JSON value (Keras logs hold NumPy or tensor scalars)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


class ReportCheckpointCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Reports Keras logs, and checkpoints, to Cairn from ``model.fit``.

    Args:
        checkpoint_on: the Keras event(s) at which the model is saved and
            reported with the metrics ("epoch_end" by default).
        report_metrics_on: the event(s) at which the metrics alone are
            reported ("epoch_end" by default; an event in both reports once,
            with the checkpoint).
        metrics: which logs to report: None for all, a name, a list of
            names, or a dict ``{reported name: Keras log name}``.

    Raises:
        ValueError: an unknown event name.
        KeyError: (at the event) a metric named that Keras did not log.
    """

    def __init__(
        self,
        checkpoint_on: Union[str, list[str]] = "epoch_end",
        report_metrics_on: Union[str, list[str]] = "epoch_end",
        metrics: Optional[Union[str, list[str], dict[str, str]]] = None,
    ) -> None:
        super().__init__()
        self._checkpoint_on = _events(checkpoint_on, "checkpoint_on")
        self._report_metrics_on = _events(report_metrics_on, "report_metrics_on")
        if metrics is not None and not isinstance(metrics, (str, list, dict)):
            raise TypeError(f"metrics: a str, list or dict, not {type(metrics).__name__}")
        self._metrics = metrics

    def _reported(self, logs: Optional[dict[str, Any]]) -> dict[str, Any]:
        logs = dict(logs or {})

        def log(name: str) -> Any:
            if name not in logs:
                raise KeyError(f"metrics: Keras logged no {name!r} here (it logged {sorted(logs)})")
            return _number(logs[name])

        if self._metrics is None:
            return {k: _number(v) for k, v in logs.items()}
        if isinstance(self._metrics, str):
            return {self._metrics: log(self._metrics)}
        if isinstance(self._metrics, list):
            return {m: log(m) for m in self._metrics}
        return {k: log(m) for k, m in self._metrics.items()}

    def _handle(self, logs: Optional[dict[str, Any]], when: str) -> None:
        from cairn import train

        if when not in self._checkpoint_on and when not in self._report_metrics_on:
            return
        metrics = self._reported(logs)
        if when not in self._checkpoint_on:
            train.report(metrics)
            return
        folder = tempfile.mkdtemp(prefix="cairn-keras-")
        try:
            self.model.save(os.path.join(folder, MODEL_FILENAME))
            checkpoint = Checkpoint.from_directory(folder)
            checkpoint.update_metadata({MODEL_FILENAME_KEY: MODEL_FILENAME})
            train.report(metrics, checkpoint=checkpoint)
        finally:
            # ignore-error: a non-chief's folder is already gone after report().
            shutil.rmtree(folder, ignore_errors=True)

    def on_epoch_begin(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "epoch_begin")

    def on_epoch_end(self, epoch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "epoch_end")

    def on_train_batch_begin(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "train_batch_begin")

    def on_train_batch_end(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "train_batch_end")

    def on_test_batch_begin(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "test_batch_begin")

    def on_test_batch_end(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "test_batch_end")

    def on_predict_batch_begin(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "predict_batch_begin")

    def on_predict_batch_end(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "predict_batch_end")

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "train_begin")

    def on_train_end(self, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "train_end")

    def on_test_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "test_begin")

    def on_test_end(self, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "test_end")

    def on_predict_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "predict_begin")

    def on_predict_end(self, logs: Optional[dict[str, Any]] = None) -> None:
        self._handle(logs, "predict_end")


def get_model(checkpoint: Checkpoint) -> Any:
    """The Keras model in a checkpoint this callback reported (Ray's
    ``TensorflowCheckpoint.get_model``), loaded with its optimizer state.

    Raises:
        FileNotFoundError: the checkpoint holds no model file.
    """
    name = checkpoint.get_metadata().get(MODEL_FILENAME_KEY, MODEL_FILENAME)
    with checkpoint.as_directory() as folder:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{checkpoint.path}: no {name} (not a Keras checkpoint)")
        return keras.models.load_model(path)


__all__ = ["ReportCheckpointCallback", "get_model"]


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
