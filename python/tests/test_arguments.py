"""A wrong type given to any public function or method is a TypeError that
names the function, the parameter and the type it wants, raised before the
call does anything (cairn/_args.py)."""

from __future__ import annotations

import importlib
import inspect
import os
import pathlib
from collections.abc import Iterator
from typing import Any, Callable, Literal, Optional, Union

import cairn
import numpy as np
import pytest
from cairn import _args

NAMESPACES = [
    "cairn",
    "cairn.torch",
    "cairn.train",
    "cairn.train.torch",
    "cairn.tune",
    "cairn.tune.schedulers",
    "cairn.tune.stopper",
    "cairn.torch.dcp",
    "cairn.tensorflow",
    "cairn.keras",
    "cairn.lightning",
    "cairn.train.lightning",
    "cairn.train.tensorflow",
    "cairn.train.tensorflow.keras",
    "cairn.train.huggingface.transformers",
    "cairn.ray",
]


class _Wrong:
    """A value of a type no public parameter takes."""


def _public_callables() -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every function each namespace exports and every public method (and
    constructor) of the classes it exports that Cairn defines."""
    seen: set[int] = set()
    for ns in NAMESPACES:
        module = importlib.import_module(ns)
        for name in module.__all__:
            obj = getattr(module, name)
            if not (getattr(obj, "__module__", "") or "").startswith("cairn"):
                continue
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for member_name, member in vars(obj).items():
                    if member_name.startswith("_") and member_name != "__init__":
                        continue
                    fn = getattr(member, "__func__", member)
                    if inspect.isfunction(fn) and id(fn) not in seen:
                        seen.add(id(fn))
                        yield f"{ns}.{name}.{member_name}", fn
            elif inspect.isfunction(obj) and id(obj) not in seen:
                seen.add(id(obj))
                yield f"{ns}.{name}", obj


PUBLIC = list(_public_callables())


def test_the_public_api_is_large_and_every_callable_of_it_is_checked() -> None:
    assert len(PUBLIC) > 100
    unchecked = [name for name, fn in PUBLIC if not getattr(fn, "__cairn_checked__", False)]
    assert unchecked == []


def _wrong_call(fn: Callable[..., Any]) -> tuple[list[Any], dict[str, Any], str | None]:
    """Arguments for `fn`: a wrong value for every parameter that must be
    given and for the first one whose hint can be checked; and that one's
    name (None when no parameter has a checkable hint)."""
    signature = inspect.signature(inspect.unwrap(fn))
    hints = _args._resolve(inspect.unwrap(fn))
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    first: str | None = None
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        checkable = not _args._matches(_Wrong(), hints.get(p.name, _args._UNRESOLVED))
        if p.default is p.empty or (first is None and checkable):
            if p.kind == p.KEYWORD_ONLY:
                kwargs[p.name] = _Wrong()
            else:
                while len(args) < list(signature.parameters).index(p.name):
                    args.append(_Wrong())  # earlier optional ones, positionally
                args.append(_Wrong())
            if checkable and first is None:
                first = p.name
    return args, kwargs, first


CHECKABLE = [(name, fn) for name, fn in PUBLIC if _wrong_call(fn)[2] is not None]


def test_most_public_callables_have_a_parameter_whose_type_is_checked() -> None:
    assert len(CHECKABLE) > 80, len(CHECKABLE)


@pytest.mark.parametrize("name, fn", CHECKABLE, ids=[name for name, _ in CHECKABLE])
def test_a_wrong_type_is_a_type_error_naming_the_first_parameter_that_has_it(
    name: str, fn: Callable[..., Any]
) -> None:
    # Every parameter that must be given gets a wrong value; the check names
    # the first one whose hint can be checked, and nothing runs.
    args, kwargs, first = _wrong_call(fn)
    with pytest.raises(TypeError, match=f"parameter '{first}' must be .*, got _Wrong"):
        fn(*args, **kwargs)


def test_swapped_arguments_of_register_checkpoint_name_the_parameter(
    tmp_path: pathlib.Path, state_dir: pathlib.Path
) -> None:
    with cairn.CheckpointManager(tmp_path, "exp") as manager:
        checkpoint = cairn.Checkpoint.from_directory(state_dir)
        with pytest.raises(
            TypeError,
            match=r"register_checkpoint\(\): parameter 'metrics' must be dict, got Checkpoint",
        ):
            manager.register_checkpoint(checkpoint, {"loss": 1.0})  # type: ignore[arg-type]
        assert manager.latest() is None  # nothing was registered
        manager.register_checkpoint({"loss": 1.0}, checkpoint)
        assert manager.latest() is not None


def test_paths_take_str_or_path_objects_and_numbers_take_numpy_scalars(
    tmp_path: pathlib.Path,
) -> None:
    config = cairn.CheckpointConfig(num_to_keep=np.int64(2))
    for root in (tmp_path, str(tmp_path)):
        with cairn.CheckpointManager(root, "exp", config) as manager:
            assert manager.latest() is None
    # A class bound from C++ answers with its signature, the parameter's type in it.
    with pytest.raises(TypeError, match=r"num_to_keep: Optional\[int\]"):
        cairn.CheckpointConfig(num_to_keep=2.5)  # type: ignore[arg-type]


def test_search_spaces_take_any_sequence_as_ray_does() -> None:
    from cairn import tune

    assert tune.grid_search((1, 2)) == tune.grid_search([1, 2])
    assert tune.choice(range(3)) == tune.choice([0, 1, 2])
    with pytest.raises(TypeError, match="'categories' must be"):
        tune.choice(3)  # type: ignore[arg-type]


def test_the_checks_follow_each_kind_of_hint() -> None:
    m = _args._matches
    assert m(3, float) and m(np.float32(1), float) and not m("3", float)
    assert m(np.int64(3), int) and not m(3.0, int)
    assert m(None, Optional[int]) and m(1, Optional[int]) and not m("1", Optional[int])
    assert m("a", Union[str, os.PathLike]) and m(pathlib.Path("a"), Union[str, os.PathLike])
    assert not m(1, Union[str, os.PathLike])
    assert m("max", Literal["min", "max"]) and m("other", Literal["min", "max"])
    assert not m(1, Literal["min", "max"])
    assert m(len, Callable[[int], int]) and not m(1, Callable[[int], int])
    assert m({}, dict[str, Any]) and not m([], dict[str, Any])
    assert m(object(), Any) and m(object(), _args._UNRESOLVED)
    d = _args._describe
    assert d(Optional[int]) == "int or None"
    assert d(Union[str, os.PathLike]) == "str or os.PathLike"
    assert d(Literal["min", "max"]) == "str (one of 'min', 'max')"
    assert d(dict[str, Any]) == "dict"
    assert d(cairn.Checkpoint) == "Checkpoint"
