# SPDX-License-Identifier: Apache-2.0
"""Type errors that name the argument at fault.

nanobind refuses a call whose argument types match no signature with a TypeError that lists the
signature and the types it got, without saying which argument is wrong. ``name_arguments`` wraps
every function and method of the extension once, at import: when nanobind refuses a call, the
arguments are checked against the (single) signature and the TypeError names the first one whose
value does not fit, then gives nanobind's message. Calls that succeed pay one Python call.
"""

from __future__ import annotations

import collections.abc
import functools
import importlib
import re

_REFUSED = "incompatible function arguments"
_FUNC = "nb_func"
_METHOD = "nb_method"


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _parameters(signature: str) -> list[tuple[str, str]] | None:
    """(name, annotation) of each parameter; None when the signature has *args or **kwargs."""
    m = re.match(r"def\s+[\w.]+\((.*)\)\s*(->.*)?$", signature, re.S)
    if m is None:
        return None
    out = []
    for p in _split(m.group(1), ","):
        if p == "/" or p == "*":
            continue
        if p.startswith("*"):
            return None
        name, _, rest = p.partition(":")
        out.append((name.strip(), _split(rest, "=")[0] if rest else ""))
    return out


def _is_sequence(v) -> bool:
    t = type(v)
    return not isinstance(v, (str, bytes)) and hasattr(t, "__len__") and hasattr(t, "__getitem__")


def _resolve(qualified: str):
    module, _, name = qualified.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _misfit(v, annotation: str) -> str | None:
    """Why ``v`` does not fit ``annotation`` (None: it fits, or the annotation is not understood)."""
    reasons = []
    for a in _split(annotation, "|"):
        why = _misfit_one(v, a)
        if why is None:
            return None
        reasons.append(why)
    return reasons[0] if reasons else None


def _misfit_one(v, a: str) -> str | None:
    got = f"got {type(v).__name__}"
    if a in ("", "object", "typing.Any"):
        return None
    if a == "None":
        return None if v is None else got
    if a == "bool":
        return None if isinstance(v, bool) or type(v).__name__ == "bool_" else got
    if a == "int":
        return None if hasattr(type(v), "__index__") else got
    if a == "float":
        return None if hasattr(type(v), "__float__") or hasattr(type(v), "__index__") else got
    if a == "str":
        return None if isinstance(v, str) else got
    if a.startswith(("numpy.typing.NDArray", "numpy.ndarray")):
        return None if hasattr(v, "__dlpack__") or hasattr(v, "__array_interface__") else got
    m = re.match(r"(collections\.abc\.Sequence|list|typing\.Sequence)\[(.*)\]$", a)
    if m:
        if not _is_sequence(v):
            return got
        for i, x in enumerate(v):
            why = _misfit(x, m.group(2))
            if why is not None:
                return f"its element {i} does not fit {m.group(2)}: {why}"
        return None
    if "." in a and "[" not in a:
        cls = _resolve(a)
        if isinstance(cls, type):
            return None if isinstance(v, cls) else got
    return None  # not understood: assume it fits


def _explain(name: str, signatures, args, kwargs) -> str | None:
    if len(signatures) != 1:
        return None  # overloads: nanobind's message lists them all
    params = _parameters(signatures[0][0])
    if params is None:
        return None
    names = [p for p, _ in params]
    if len(args) > len(params):
        return f"{name}() takes at most {len(params)} positional arguments, got {len(args)}"
    for key in kwargs:
        if key not in names:
            return f"{name}() has no argument '{key}' (its arguments: {', '.join(n for n in names if n != 'self')})"
    given = list(zip(params, args)) + [((k, dict(params)[k]), v) for k, v in kwargs.items()]
    for (pname, annotation), v in given:
        if pname == "self":
            continue
        why = _misfit(v, annotation)
        if why is not None:
            return f"{name}(): argument '{pname}' must be {annotation}: {why}"
    return None


def _wrap(f, name: str):
    signatures = getattr(f, "__nb_signature__", None)
    if signatures is None:
        return f

    @functools.wraps(f)
    def call(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except TypeError as e:
            if _REFUSED not in str(e):
                raise
            why = _explain(name, signatures, args, kwargs)
            if why is None:
                raise
            raise TypeError(f"{why}\n{e}") from None

    call.__nb_signature__ = signatures
    return call


def name_arguments(module) -> None:
    """Wraps the module's functions and its classes' methods (once)."""
    if getattr(module, "_arguments_named", False):
        return
    for attr, obj in list(vars(module).items()):
        kind = type(obj).__name__
        if kind == _FUNC:
            setattr(module, attr, _wrap(obj, attr))
        elif isinstance(obj, type) and obj.__module__ == module.__name__:
            for m, f in list(vars(obj).items()):
                k = type(f).__name__
                if m.startswith("__") and m != "__init__":
                    continue  # operators and protocols keep nanobind's own
                if k == _METHOD:
                    setattr(obj, m, _wrap(f, f"{attr}.{m}" if m != "__init__" else attr))
                elif k == _FUNC:
                    setattr(obj, m, staticmethod(_wrap(f, f"{attr}.{m}")))
    module._arguments_named = True
