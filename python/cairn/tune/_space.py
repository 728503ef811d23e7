"""``tune.sample_from``: search-space values computed by Python functions.

The space handed to the C++ Tuner stays plain JSON: each ``sample_from`` is
replaced by a named marker (``tune_sample_from(name)``, the name being its
key path), and its function travels beside the space, called by the C++
ParamSpace on the Tuner's thread once the grid and random values of the
trial are in place (include/cairn/tune.h, ``SampleFunction``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from cairn import _cairn
from cairn.errors import InvalidArgumentError

_TAG = "$cairn.domain"


class _Unresolved(Exception):
    """A function read a sample_from value not computed yet: asked again later."""


class SampleFrom:
    """A value computed per trial by ``func`` (Ray's ``tune.sample_from``).

    ``func`` takes ``spec`` (``spec.config`` is the trial's configuration:
    grid and random values in place, attribute or item access) or nothing.
    """

    def __init__(self, func: Callable[..., Any]) -> None:
        if not callable(func):
            raise InvalidArgumentError(
                f"tune.sample_from: a function, not a {type(func).__name__}", "invalid_argument"
            )
        self.func = func
        self._pass_spec = _takes_one_argument(func)

    def __repr__(self) -> str:
        return f"tune.sample_from({self.func!r})"

    def _resolver(self) -> Callable[[Any], tuple[bool, Any]]:
        func, pass_spec = self.func, self._pass_spec

        def resolve(config: Any) -> tuple[bool, Any]:
            try:
                value = func(_Config({"config": config})) if pass_spec else func()
            except _Unresolved:
                return False, None
            return True, _plain(value)

        return resolve


def _takes_one_argument(func: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return True  # a builtin without a signature: Ray passes the spec
    try:
        sig.bind({})
        return True
    except TypeError:
        pass
    try:
        sig.bind()
        return False
    except TypeError:
        raise InvalidArgumentError(
            f"tune.sample_from({getattr(func, '__name__', func)!r}): the function must take "
            "the spec or no argument",
            "invalid_argument",
        ) from None


def _guard(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get(_TAG) == "sample_from":
            raise _Unresolved()
        return _Config(value)
    if isinstance(value, list):
        return _List(value)
    return value


class _Config(dict):  # type: ignore[type-arg]
    """The spec and its config: ``spec.config.lr`` or ``spec["config"]["lr"]``."""

    def __getitem__(self, key: Any) -> Any:
        return _guard(dict.__getitem__(self, key))

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default


class _List(list):  # type: ignore[type-arg]
    def __getitem__(self, i: Any) -> Any:
        return _guard(list.__getitem__(self, i))


def _plain(value: Any) -> Any:
    """``value`` as JSON-able Python: numpy scalars and arrays included."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalar or array
        return value.tolist()
    return value


def _escape(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def split_space(
    space: Any, callables: bool = False
) -> tuple[Any, dict[str, Callable[[Any], tuple[bool, Any]]]]:
    """(``space`` with each SampleFrom replaced by its marker, the functions by name).

    With ``callables``, a plain function is taken as ``sample_from`` of it
    (PBT's ``hyperparam_mutations``, as Ray takes them there).
    """
    functions: dict[str, Callable[[Any], tuple[bool, Any]]] = {}

    def walk(node: Any, path: str) -> Any:
        if callables and callable(node) and not isinstance(node, (SampleFrom, type)):
            node = SampleFrom(node)
        if isinstance(node, SampleFrom):
            name = path[1:] or "(root)"
            functions[name] = node._resolver()
            return _cairn.tune_sample_from(name)
        if isinstance(node, dict):
            return {k: walk(v, f"{path}/{_escape(k)}") for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [walk(v, f"{path}/{i}") for i, v in enumerate(node)]
        return node

    return walk(space, ""), functions
