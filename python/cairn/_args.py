"""The public API's arguments, checked against their type hints.

A public function or method given a value of the wrong type raises
``TypeError`` naming the function, the parameter, the type it wants and the
type it got, before it does anything (so nothing is written or changed),
instead of an error from deep inside the package. Each package namespace
calls :func:`check_public` on the names it exports.

What is checked is what the hints say at the top level: the class of a value
(``int`` takes any integral number, ``numpy.int64`` included; ``float`` any
real number), the members of a union or ``Optional``, the type of a
``Literal``'s values (which value is the function's to check), the
container of a generic (``dict[str, Any]`` wants a dict; its items are the
function's to check), ``callable()`` for a ``Callable``.
Hints that cannot be checked at run time (``Any``, type variables, names
imported only for type checkers, protocols) accept every value.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import numbers
import sys
import types
import typing
from typing import Any, Callable, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

_UNRESOLVED = object()  # a hint that names what this module cannot see


def _resolve(fn: Callable[..., Any]) -> dict[str, Any]:
    """The function's parameter hints, evaluated one by one: a hint that
    cannot be evaluated (a name imported only under TYPE_CHECKING) is left
    unchecked."""
    globalns = getattr(fn, "__globals__", {})
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if module is not None:
        globalns = {**vars(module), **globalns}
    out: dict[str, Any] = {}
    for name, hint in getattr(fn, "__annotations__", {}).items():
        if name == "return":
            continue
        if isinstance(hint, str):
            try:
                hint = eval(hint, globalns)
            except Exception:
                hint = _UNRESOLVED
        out[name] = hint
    return out


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` is of the type `hint` says, at its top level."""
    if hint is _UNRESOLVED or hint is Any or hint is object or isinstance(hint, TypeVar):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, a) for a in typing.get_args(hint))
    if origin is typing.Literal:  # the value itself is the function's to check
        return any(isinstance(value, type(a)) for a in typing.get_args(hint))
    if origin is typing.Annotated:
        return _matches(value, typing.get_args(hint)[0])
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return callable(value)
    if origin is type:
        return isinstance(value, type)
    if origin is not None:
        hint = origin
    if hint is float:
        return isinstance(value, numbers.Real)
    if hint is int:
        return isinstance(value, numbers.Integral)
    if not isinstance(hint, type):
        return True  # a form not checked at run time
    try:
        return isinstance(value, hint)
    except TypeError:  # a protocol without @runtime_checkable
        return True


def _describe(hint: Any) -> str:
    """The hint as a person reads it: "str or os.PathLike", "dict"."""
    if hint is None or hint is type(None):
        return "None"
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return " or ".join(sorted({type(a).__qualname__ for a in typing.get_args(hint)})) + (
            " (one of " + ", ".join(repr(a) for a in typing.get_args(hint)) + ")"
        )
    if origin is typing.Annotated:
        return _describe(typing.get_args(hint)[0])
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return "a callable"
    if origin is not None:
        hint = origin
    if isinstance(hint, type):
        module = hint.__module__
        if module in ("builtins",) or module.startswith("cairn"):
            return hint.__qualname__
        return f"{module}.{hint.__qualname__}"
    return str(hint).replace("typing.", "")


def checked(fn: _F) -> _F:
    """`fn`, checking the types of its arguments on every call (see the
    module's docstring). Arguments Python itself refuses (a missing one, an
    unknown keyword) reach `fn` unchanged, for Python's own error."""
    if getattr(fn, "__cairn_checked__", False):
        return fn
    signature = inspect.signature(fn)
    skipped = {
        p.name for p in signature.parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    hints: dict[str, Any] | None = None
    where = f"{fn.__qualname__}()"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal hints
        if hints is None:  # resolved on first use: every module is loaded by then
            hints = {k: v for k, v in _resolve(fn).items() if k not in skipped}
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)
        for name, value in bound.arguments.items():
            hint = hints.get(name, _UNRESOLVED)
            if not _matches(value, hint):
                raise TypeError(
                    f"{where}: parameter '{name}' must be {_describe(hint)}, "
                    f"got {type(value).__qualname__}"
                )
        return fn(*args, **kwargs)

    wrapper.__cairn_checked__ = True  # type: ignore[attr-defined]
    return typing.cast(_F, wrapper)


_checked_classes: set[type] = set()


def _check_class(cls: type) -> None:
    """Checks the public methods (and constructor) defined in `cls`'s body
    in Python (a class bound from C++ has pybind11 check its arguments)."""
    if cls in _checked_classes:
        return
    _checked_classes.add(cls)
    for name, member in list(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, (staticmethod, classmethod)):
            if inspect.isfunction(member.__func__):
                setattr(cls, name, type(member)(checked(member.__func__)))
        elif inspect.isfunction(member):
            setattr(cls, name, checked(member))


def check_public(namespace: dict[str, Any]) -> None:
    """Checks the arguments of everything `namespace` exports (``__all__``)
    that Cairn defines: its functions are replaced there by checking ones,
    its classes' public methods are checked in place."""
    for name in namespace.get("__all__", ()):
        obj = namespace.get(name)
        if not (getattr(obj, "__module__", "") or "").startswith("cairn"):
            continue
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            _check_class(obj)
        elif inspect.isfunction(obj):
            namespace[name] = checked(obj)
