"""cairn.tune.result: the names of result keys, as Ray Tune's."""

TRAINING_ITERATION = "training_iteration"
SHOULD_CHECKPOINT = "should_checkpoint"
DONE = "done"
TRIAL_ID = "trial_id"
