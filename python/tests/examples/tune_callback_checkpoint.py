# The Ray Tune guide's "Manual checkpointing through a Tuner Callback"
# example, as published, with only its imports changed (ray -> cairn); the
# guide shows the callback alone, so a Tuner that uses it follows. Run by
# test_examples.py.
from cairn import tune
from cairn.tune.experiment import Trial
from cairn.tune.result import SHOULD_CHECKPOINT, TRAINING_ITERATION


class CheckpointByStepsTaken(tune.Callback):
    def __init__(self, iterations_per_checkpoint: int):
        self.steps_per_checkpoint = iterations_per_checkpoint
        self._trials_last_checkpoint = {}

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info
    ):
        current_iteration = result[TRAINING_ITERATION]
        if (
            current_iteration - self._trials_last_checkpoint.get(trial, -1)
            >= self.steps_per_checkpoint
        ):
            result[SHOULD_CHECKPOINT] = True
            self._trials_last_checkpoint[trial] = current_iteration


class Counter(tune.Trainable):
    def setup(self, config):
        self.count = 0

    def step(self):
        self.count += 1
        return {"count": self.count}

    def save_checkpoint(self, checkpoint_dir):
        return {"count": self.count}

    def load_checkpoint(self, checkpoint):
        self.count = checkpoint["count"]


tuner = tune.Tuner(
    Counter,
    run_config=tune.RunConfig(
        stop={"training_iteration": 7},
        callbacks=[CheckpointByStepsTaken(iterations_per_checkpoint=3)],
    ),
)
tuner.fit()
