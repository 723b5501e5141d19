"""The SDK's frozen configs refuse a keyword that is none of their fields in one line that
names it and the valid ones, not Python's TypeError from the generated __init__; and take
a numpy scalar as the Python value it holds (values.plain), before their checks."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from difflib import get_close_matches
from typing import Any, TypeVar

from edgeprefill.errors import RequestError
from edgeprefill.values import plain

T = TypeVar("T")


def known_fields(cls: type[T]) -> type[T]:
    """Class decorator, above @dataclass: `cls(typo=1)` is a RequestError, and
    `cls(top_k=np.int64(3))` is `cls(top_k=3)`."""
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = [key for key in kwargs if key not in names]
        if unknown:
            raise RequestError(unknown_message(cls.__name__, unknown, names))
        init(self, *map(plain, args), **{key: plain(v) for key, v in kwargs.items()})

    setattr(cls, "__init__", checked)  # noqa: B010 (mypy refuses assigning a method)
    return cls


def unknown_message(owner: str, unknown: list[str], names: Iterable[str],
                    noun: str = "field") -> str:
    """`GenerationParams has no field 'top_pp' (did you mean 'top_p'?); its fields: ...`"""
    names = list(names)
    near = get_close_matches(unknown[0], names, n=1, cutoff=0.7)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    which = noun if len(unknown) == 1 else noun + "s"
    return (f"{owner} has no {which} {', '.join(map(repr, unknown))}{hint}; its {noun}s: "
            f"{', '.join(names)}")
