"""cairn.tune.experiment: ``Trial``, as Ray Tune's, for callbacks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from cairn._checkpoint import Checkpoint


class Trial:
    """A trial as a callback sees it: its id, config, status and last result.

    The same object stands for the same trial in every call of a callback
    (usable as a dict key); its fields are updated before each call.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id
        self.config: dict[str, Any] = {}
        self.status: str = Trial.PENDING
        self.last_result: dict[str, Any] = {}
        self.path: str = ""
        self.num_failures: int = 0
        self.error: Optional[str] = None
        self.latest_checkpoint: Optional[str] = None

    @property
    def trial_name(self) -> str:
        """The trial's name: its id, as its folder is named."""
        return self.trial_id

    @property
    def local_path(self) -> Optional[str]:
        """The trial's folder when it is local (None on ``s3://``)."""
        if "://" not in self.path:
            return self.path
        return self.path[len("file://") :] if self.path.startswith("file://") else None

    @property
    def checkpoint(self) -> Optional[Checkpoint]:
        """The trial's latest committed checkpoint, or None."""
        if not self.latest_checkpoint:
            return None
        from cairn._checkpoint import Checkpoint

        return Checkpoint.from_directory(self.path.rstrip("/") + "/" + self.latest_checkpoint)

    def __str__(self) -> str:
        return self.trial_id

    def _update(self, info: dict[str, Any]) -> Trial:
        self.config = info["config"]
        self.status = info["status"]
        self.last_result = info["last_result"] or {}
        self.path = info["path"]
        self.num_failures = info["num_failures"]
        self.error = info["error"]
        self.latest_checkpoint = info["latest_checkpoint"]
        return self

    def __hash__(self) -> int:
        return hash(self.trial_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Trial) and other.trial_id == self.trial_id

    def __repr__(self) -> str:
        return f"Trial({self.trial_id}, {self.status})"
