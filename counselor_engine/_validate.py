"""Shared input checks for the math core.

Every public function of hbsp, soca and lipo checks its inputs with these helpers so that a
bad value (NaN, inf, a probability outside [0, 1], a non-positive precision, ...) raises a
``ValueError`` that names the offending argument, instead of flowing on as a wrong number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

_REAL_TYPES = (int, float, np.integer, np.floating)
_INT_TYPES = (int, np.integer)


def finite(name: str, value: Any) -> float:
    """A finite real number as ``float``; bools are refused (almost always a bug)."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, _REAL_TYPES):
        raise ValueError(f"{name}: expected a real number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name}: must be finite, got {number!r}")
    return number


def unit(name: str, value: Any) -> float:
    """A finite number in the closed interval [0, 1]."""
    number = finite(name, value)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{name}: must lie in [0, 1], got {number!r}")
    return number


def positive(name: str, value: Any) -> float:
    """A finite number strictly greater than zero."""
    number = finite(name, value)
    if number <= 0.0:
        raise ValueError(f"{name}: must be > 0, got {number!r}")
    return number


def nonnegative(name: str, value: Any) -> float:
    """A finite number greater than or equal to zero."""
    number = finite(name, value)
    if number < 0.0:
        raise ValueError(f"{name}: must be >= 0, got {number!r}")
    return number


def integer(name: str, value: Any, *, minimum: int | None = None) -> int:
    """An ``int`` (not a bool, not a float), optionally at least ``minimum``."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, _INT_TYPES):
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {number}")
    return number


def vector(name: str, values: Any) -> np.ndarray:
    """A non-empty 1-D float64 array with only finite entries."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected a sequence of real numbers") from exc
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D sequence, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: contains NaN or inf")
    return array


def unit_vector(name: str, values: Any) -> np.ndarray:
    """A non-empty 1-D array with every entry in [0, 1]."""
    array = vector(name, values)
    if array.min() < 0.0 or array.max() > 1.0:
        raise ValueError(f"{name}: every value must lie in [0, 1]")
    return array


def distinct(name: str, items: Iterable[str]) -> list[str]:
    """The items as a list, refusing duplicates."""
    seen: list[str] = list(items)
    if len(set(seen)) != len(seen):
        raise ValueError(f"{name}: contains duplicates")
    return seen
