"""cairn.tune.experiment: the names of trial states, as Ray Tune's Trial."""


class Trial:
    """Trial states as ``Result.status`` reports them."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"
