"""cairn.tune.Callback: hooks on the Tuner's events, as Ray Tune's."""

from __future__ import annotations

from typing import Any

from cairn._checkpoint import Checkpoint
from cairn.tune.experiment import Trial


def _checkpoint_of(trial: Trial, name: str) -> Checkpoint:
    """The checkpoint ``name`` of ``trial`` (its folder inside the trial's)."""
    return Checkpoint.from_directory(trial.path.rstrip("/") + "/" + name)


class Callback:
    """Subclass and override what you need; pass instances in
    ``RunConfig(callbacks=[...])``.

    Called on the Tuner's driver thread, one call at a time, in the order of
    events. ``iteration`` counts the calls the Tuner made so far; ``trials``
    lists every trial seen so far. ``on_trial_result`` may change
    ``result`` in place: setting ``result[SHOULD_CHECKPOINT] = True``
    (``cairn.tune.result``) makes the trial save a checkpoint, as in Ray.
    An exception ends ``fit()`` with a cairn.InvalidArgumentError naming the
    callback.

    As in Ray, ``result`` also carries ``trial_id`` and ``config`` (not
    stored in the trial's results), :meth:`setup` runs once before the
    first other call, and ``on_checkpoint`` gets the
    :class:`~cairn.Checkpoint` the trial committed. ``on_step_begin`` and
    ``on_step_end`` are not called: the Tuner's loop has no steps of its
    own to report.
    """

    def setup(
        self, stop: Any = None, num_samples: Any = None, total_num_samples: Any = None, **info: Any
    ) -> None:
        pass

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        pass

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        pass

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        pass

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        pass

    def on_checkpoint(
        self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Checkpoint, **info: Any
    ) -> None:
        pass

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        pass

    # ---- called by the C++ Tuner (python/_tune.cc) --------------------------

    def _cairn_trial(self, info: dict[str, Any]) -> Trial:
        if not self.__dict__.get("_cairn_set_up"):
            self.__dict__["_cairn_set_up"] = True
            self.setup()
        known: dict[str, Trial] = self.__dict__.setdefault("_cairn_trials", {})
        self.__dict__["_cairn_iteration"] = self.__dict__.get("_cairn_iteration", 0) + 1
        trial = known.get(info["trial_id"])
        if trial is None:
            trial = known[info["trial_id"]] = Trial(info["trial_id"])
        return trial._update(info)

    def _cairn_args(self) -> tuple[int, list[Trial]]:
        return self.__dict__["_cairn_iteration"], list(self.__dict__["_cairn_trials"].values())

    def _cairn_event(self, event: str, info: dict[str, Any]) -> None:
        trial = self._cairn_trial(info)
        iteration, trials = self._cairn_args()
        getattr(self, f"on_trial_{event}")(iteration, trials, trial)

    def _cairn_result(self, info: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
        trial = self._cairn_trial(info)
        iteration, trials = self._cairn_args()
        # Ray's result also names the trial and its config; those two are
        # shown, not stored with the trial's results.
        shown = {"trial_id": trial.trial_id, "config": trial.config}
        view = {**shown, **result}
        self.on_trial_result(iteration, trials, trial, view)
        for key, value in view.items():
            if key not in shown or key in result or value is not shown[key]:
                result[key] = value
        for key in [k for k in result if k not in view]:
            del result[key]
        return result

    def _cairn_checkpoint(self, info: dict[str, Any], checkpoint: str) -> None:
        trial = self._cairn_trial(info)
        iteration, trials = self._cairn_args()
        self.on_checkpoint(iteration, trials, trial, _checkpoint_of(trial, checkpoint))

    def _cairn_end(self, infos: list[dict[str, Any]]) -> None:
        trials = [self._cairn_trial(info) for info in infos]
        self.on_experiment_end(trials)
