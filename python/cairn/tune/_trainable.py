"""cairn.tune.Trainable: the class trainable, as Ray Tune's."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from typing import Any, Optional, Union

_DICT_CHECKPOINT = "_dict_checkpoint.json"
# A dict that is not all JSON (arrays, tensors), pickled as Ray's was.
_PICKLED_CHECKPOINT = "_dict_checkpoint.pkl"
# The Trainable's own state beside the user's: its iteration, which Ray's
# restores with a checkpoint.
_TRAINABLE_STATE = "_trainable_state.json"


class Trainable:
    """A trial driven step by step: subclass it and pass the class to Tuner.

    The Tuner calls, in the trial's worker process: :meth:`setup` once with
    the trial's config, :meth:`step` once per iteration (its dict is the
    iteration's result; ``training_iteration`` is added), and
    :meth:`save_checkpoint` when a checkpoint is due (``checkpoint_config``'s
    frequency, ``checkpoint_at_end``, a scheduler's pause or PBT's clone),
    :meth:`load_checkpoint` when the trial resumes. With PBT,
    :meth:`reset_config` may take a new config in place (return True);
    otherwise the trial restarts from the cloned checkpoint with it.
    """

    def __init__(self, config: Optional[dict[str, Any]] = None) -> None:
        """As Ray's: ``MyTrainable(config)`` calls :meth:`setup` with it, so a
        trainable can be driven by hand (``train()``, ``save()``,
        ``restore()``). The Tuner makes its own with no config and calls
        :meth:`setup` itself."""
        self.config: dict[str, Any] = dict(config or {})
        self._iterations = 0
        if config is not None:
            self.setup(dict(self.config))

    # ---- what a subclass overrides ----------------------------------------

    def setup(self, config: dict[str, Any]) -> None:
        """Builds the trial's state from its config."""

    def step(self) -> dict[str, Any]:
        """One iteration; returns its metrics (JSON values)."""
        raise NotImplementedError(f"{type(self).__name__}.step")

    def save_checkpoint(self, checkpoint_dir: str) -> Optional[Union[str, dict[str, Any]]]:
        """Writes the state into ``checkpoint_dir`` (returning None or the
        folder), or returns it as a dict."""
        raise NotImplementedError(f"{type(self).__name__}.save_checkpoint")

    def load_checkpoint(self, checkpoint: Union[str, dict[str, Any]]) -> None:
        """Restores what :meth:`save_checkpoint` saved: its dict, or the folder."""
        raise NotImplementedError(f"{type(self).__name__}.load_checkpoint")

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Takes ``new_config`` in place (PBT); False to be restarted instead."""
        return False

    def cleanup(self) -> None:
        """Called when the trial ends in this process."""

    @property
    def iteration(self) -> int:
        """Steps run, as Ray's: restored with a checkpoint (a resumed or
        cloned trial goes on from the checkpoint's), else counted in this
        process."""
        return self._iterations

    @property
    def training_iteration(self) -> int:
        """As :attr:`iteration` (Ray's other name for it)."""
        return self._iterations

    @property
    def trial_id(self) -> str:
        """The trial's id in a Tuner ("default" when driven by hand)."""
        from cairn import _cairn

        return _cairn.train_environment_value("CAIRN_TRIAL_ID") or "default"

    @property
    def trial_name(self) -> str:
        """The trial's name: its id."""
        return self.trial_id

    @property
    def logdir(self) -> str:
        """The working directory of this process (Ray's per-trial log folder)."""
        return os.getcwd()

    def get_config(self) -> dict[str, Any]:
        """The trial's current config."""
        return self.config

    # ---- driving it by hand, as Ray's Trainable ---------------------------

    def train(self) -> dict[str, Any]:
        """Runs one :meth:`step`; returns its result with ``training_iteration``."""
        result = dict(self._cairn_step())
        result.setdefault("training_iteration", self._iterations)
        return result

    def save(self, checkpoint_dir: Optional[str] = None) -> str:
        """Saves a checkpoint into ``checkpoint_dir`` (a new temporary folder
        when None) through :meth:`save_checkpoint`; returns the folder."""
        folder = checkpoint_dir or tempfile.mkdtemp(prefix="cairn-trainable-")
        os.makedirs(folder, exist_ok=True)
        self._cairn_save_checkpoint(folder)
        return folder

    def restore(self, checkpoint: Any) -> None:
        """Loads what :meth:`save` saved: its folder, or a
        :class:`~cairn.Checkpoint`."""
        if hasattr(checkpoint, "as_directory"):
            with checkpoint.as_directory() as folder:
                self._cairn_load_checkpoint(folder)
        else:
            self._cairn_load_checkpoint(os.fspath(checkpoint))

    # ---- called by the C++ runtime (python/_tune.cc) ------------------------

    def _cairn_setup(self, config: dict[str, Any]) -> None:
        from cairn.train._trainer import _one_torch_thread_in_a_fork, _sync_environ

        _one_torch_thread_in_a_fork()  # as a function trainable's worker does
        _sync_environ()
        self.config = dict(config)
        self.setup(self.config)

    def _cairn_step(self) -> dict[str, Any]:
        self._iterations += 1
        result = self.step()
        if not isinstance(result, dict):
            raise TypeError(
                f"{type(self).__name__}.step returned a {type(result).__name__}, "
                "not a dict of metrics"
            )
        return result

    def _cairn_save_checkpoint(self, checkpoint_dir: str) -> None:
        state = self.save_checkpoint(checkpoint_dir)
        with open(os.path.join(checkpoint_dir, _TRAINABLE_STATE), "w") as f:
            json.dump({"iteration": self._iterations}, f)
        if isinstance(state, dict):  # else None or the folder itself, as Ray allows
            try:
                text = json.dumps(state)
            except (TypeError, ValueError):  # arrays, tensors: pickled, as Ray does
                with open(os.path.join(checkpoint_dir, _PICKLED_CHECKPOINT), "wb") as f:
                    pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
            else:
                with open(os.path.join(checkpoint_dir, _DICT_CHECKPOINT), "w") as f:
                    f.write(text)

    def _cairn_load_checkpoint(self, checkpoint_dir: str) -> None:
        own = os.path.join(checkpoint_dir, _TRAINABLE_STATE)
        if os.path.exists(own):
            with open(own) as f:
                self._iterations = int(json.load(f).get("iteration", self._iterations))
        path = os.path.join(checkpoint_dir, _DICT_CHECKPOINT)
        pickled = os.path.join(checkpoint_dir, _PICKLED_CHECKPOINT)
        if os.path.exists(path):
            with open(path) as f:
                self.load_checkpoint(json.load(f))
        elif os.path.exists(pickled):
            with open(pickled, "rb") as f:
                self.load_checkpoint(pickle.load(f))
        else:
            self.load_checkpoint(checkpoint_dir)

    def _cairn_reset_config(self, new_config: dict[str, Any]) -> bool:
        if self.reset_config(dict(new_config)):
            self.config = dict(new_config)
            return True
        return False
