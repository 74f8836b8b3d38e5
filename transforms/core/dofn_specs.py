"""Beam's DoFn introspection, computed once per DoFn class instead of once per use.

Beam asks ``userstate.get_dofn_specs(dofn)`` whether a DoFn keeps state or timers each time it
applies a ParDo, serialises the graph and builds a bundle's operations: some 1,600 times in a
run on a 4-line input. Each call walks every method of the DoFn and builds its signature with
``inspect``: a fifth to a third of a small run's wall time went there (profiled on the
in_memory runner). The answer depends only on the methods' default arguments (Beam's
``StateParam`` and ``TimerParam`` markers), fixed by the class and by the functions an instance
holds (a ``beam.Map`` keeps its function), so it is kept per class and per those functions.
Beam 2.77 offers no hook for this, so the module-level function is replaced;
``tests/test_dofn_specs.py`` checks the cached answers against Beam's own and fails if Beam
renames it.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from apache_beam.transforms import userstate

_beams_get_dofn_specs = userstate.get_dofn_specs


def _key(dofn: Any) -> tuple:
    """The class, and each callable the instance holds itself (``beam.Map`` keeps its function
    there, and Beam reads that function's defaults), by what decides its signature: the code
    and the defaults, so a copy unpickled in a worker finds the same entry."""
    held = []
    for name, value in getattr(dofn, "__dict__", {}).items():
        function = value.__func__ if isinstance(value, types.MethodType) else value
        if isinstance(function, types.FunctionType):
            held.append((name, function.__code__, function.__defaults__,
                         getattr(function, "__wrapped__", None)))
        elif callable(value) and not isinstance(value, type):
            held.append((name, value))  # a partial or a callable object: itself
    return type(dofn), tuple(held)


_specs: dict[tuple, tuple[set, set]] = {}


def cached_dofn_specs(dofn: Any) -> tuple[set, set]:
    """Beam's ``get_dofn_specs``, answered from the first call for the same key. Copies of the
    sets are returned, so a caller that changes one cannot change the next answer."""
    try:
        key = _key(dofn)
        found = _specs.get(key)
    except TypeError:  # an unhashable default or callable: ask Beam
        return _beams_get_dofn_specs(dofn)
    if found is None:
        found = _specs[key] = _beams_get_dofn_specs(dofn)
    return set(found[0]), set(found[1])


@functools.cache  # once per process
def install() -> None:
    """Answers Beam's DoFn-spec questions from the cache in this process (Beam's own callers
    look the function up on the module each time)."""
    userstate.get_dofn_specs = cached_dofn_specs
