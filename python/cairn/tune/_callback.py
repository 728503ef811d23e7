"""cairn.tune.Callback: hooks on the Tuner's events, as Ray Tune's."""

from __future__ import annotations

from typing import Any

from cairn.tune.experiment import Trial


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
    """

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        pass

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial,
                        result: dict[str, Any], **info: Any) -> None:
        pass

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial,
                          **info: Any) -> None:
        pass

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        pass

    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial,
                      checkpoint: str, **info: Any) -> None:
        pass

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        pass

    # ---- called by the C++ Tuner (python/_tune.cc) --------------------------

    def _cairn_trial(self, info: dict[str, Any]) -> Trial:
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
        self.on_trial_result(iteration, trials, trial, result)
        return result

    def _cairn_checkpoint(self, info: dict[str, Any], checkpoint: str) -> None:
        trial = self._cairn_trial(info)
        iteration, trials = self._cairn_args()
        self.on_checkpoint(iteration, trials, trial, checkpoint)

    def _cairn_end(self, infos: list[dict[str, Any]]) -> None:
        trials = [self._cairn_trial(info) for info in infos]
        self.on_experiment_end(trials)
