"""cairn.tune.schedulers: FIFO, ASHA and PBT, as Ray Tune's (the C++ schedulers).

Each is pure and seeded; its state goes into the experiment's
``tuner_state.json``, so a restored Tuner goes on where it stopped.
"""

from __future__ import annotations

from typing import Any, Optional

from cairn import _cairn
from cairn._args import check_public as _check_public
from cairn.errors import InvalidArgumentError
from cairn.tune._space import split_space

# Runs every trial to its end, in order (the default).
FIFOScheduler = _cairn.FIFOScheduler


def ASHAScheduler(
    time_attr: str = "training_iteration",
    metric: Optional[str] = None,
    mode: Optional[str] = None,
    max_t: float = 100,
    grace_period: float = 1,
    reduction_factor: float = 4,
    brackets: int = 1,
    stop_last_trials: bool = True,
) -> Any:
    """Asynchronous successive halving: stops the worse trials at each rung.

    Rungs at ``grace_period * reduction_factor**k`` of ``time_attr`` up to
    ``max_t``; at each, a trial goes on only if it is in the top
    ``1/reduction_factor`` of the trials that reached it. ``metric`` and
    ``mode`` default to the TuneConfig's. Every trial stops at ``max_t``
    (Ray's ``stop_last_trials=True``; False is refused).
    """
    if not stop_last_trials:
        raise InvalidArgumentError(
            "ASHAScheduler(stop_last_trials=False): not supported; every trial stops at max_t",
            "invalid_argument",
        )
    return _cairn.ASHAScheduler(
        time_attr,
        metric or "",
        mode or "",
        float(max_t),
        float(grace_period),
        float(reduction_factor),
        int(brackets),
    )


AsyncHyperBandScheduler = ASHAScheduler


def PopulationBasedTraining(
    time_attr: str = "time_total_s",
    metric: Optional[str] = None,
    mode: Optional[str] = None,
    perturbation_interval: float = 60.0,
    burn_in_period: float = 0.0,
    hyperparam_mutations: Optional[dict[str, Any]] = None,
    quantile_fraction: float = 0.25,
    resample_probability: float = 0.25,
    perturbation_factors: tuple[float, float] = (1.2, 0.8),
    custom_explore_fn: Optional[Any] = None,
    log_config: bool = True,
    require_attrs: bool = True,
    synch: bool = False,
    seed: int = 0,
) -> Any:
    """Population based training: every ``perturbation_interval`` of
    ``time_attr`` (Ray's default: seconds of ``time_total_s``), once
    ``burn_in_period`` has passed, a trial in the bottom
    ``quantile_fraction`` clones the latest checkpoint of one in the top and
    goes on with a perturbed config.

    ``hyperparam_mutations`` maps config keys to a list of values, a
    search-space domain (``tune.uniform(...)``), or a function: Ray's
    ``lambda: random.uniform(...)`` or a ``tune.sample_from`` (called with
    ``spec.config``, the config being explored), called when the value is
    resampled; a number it gave is otherwise multiplied by one of
    ``perturbation_factors`` (drawn evenly) as a domain's is. The
    exploration runs in C++, seeded by ``seed`` (a function's own
    randomness is its own). A trial must report checkpoints for PBT to
    clone it. Given again to ``Tuner.restore`` (code is not saved).
    ``log_config`` and ``require_attrs`` are accepted and ignored;
    ``custom_explore_fn`` and ``synch=True`` are refused.
    """
    if not hyperparam_mutations:
        raise ValueError("PopulationBasedTraining: hyperparam_mutations must name at least one key")
    if custom_explore_fn is not None or synch:
        raise InvalidArgumentError(
            "PopulationBasedTraining: {} is not supported".format(
                "custom_explore_fn" if custom_explore_fn is not None else "synch=True"
            ),
            "invalid_argument",
        )
    del log_config, require_attrs  # accepted for Ray compatibility
    if len(tuple(perturbation_factors)) != 2:
        raise ValueError("PopulationBasedTraining: perturbation_factors must be two numbers")
    mutations, functions = split_space(hyperparam_mutations, callables=True)
    up, down = (float(f) for f in perturbation_factors)
    return _cairn.PopulationBasedTraining(
        time_attr,
        metric or "",
        mode or "",
        float(perturbation_interval),
        mutations,
        float(quantile_fraction),
        float(resample_probability),
        int(seed),
        functions,
        float(burn_in_period),
        up,
        down,
    )


TrialScheduler = _cairn.TrialScheduler

__all__ = [
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "FIFOScheduler",
    "PopulationBasedTraining",
    "TrialScheduler",
]


# A wrong type in a public call is a TypeError naming the parameter.
_check_public(globals())
