"""Two questions Beam asks again on every use, answered once: a DoFn's state and timer specs,
and an options object's view as one of its option classes; and a wait at the end of every bundle,
shortened.

A run on a 4-line input asked ``userstate.get_dofn_specs(dofn)`` some 1,600 times (each ParDo
apply, the graph's serialisation, every bundle's operations), each walking every method of the
DoFn with ``inspect``; and ``PipelineOptions.view_as`` some 1,800 times (type checks, each
transform's apply), each building an argument parser and parsing the flags again. Together they
took about a third of such a run's wall time. Beam 2.77 offers no hook for either, so both are
replaced here, once per process (``install``): by the launcher when it builds the graph, and in
a Beam worker when it imports the ``transforms`` package to unpickle its DoFns (a process that
imports the package without Beam, as a training job does, is left alone).
``tests/test_beam_caches.py`` checks the answers against Beam's own and fails if Beam renames
what is replaced.

* DoFn specs depend only on the methods' default arguments (Beam's ``StateParam`` and
  ``TimerParam`` markers), fixed by the class and by the callables an instance holds itself (a
  ``beam.Map`` keeps its function there, and Beam reads that function's defaults).
* An options view keeps no state of its own: it reads and writes the options dictionary it
  shares with the object it was taken from, so one view per object and class serves every call.
* Each bundle starts a state-sampler thread (it charges wall time to the running step, for
  Beam's progress and timing metrics) and joins it at the end; the thread sleeps between samples
  in periods growing by a fifth up to 200 ms, and the join waits out the current sleep. On a
  4-line run that was 0.35 s over 58 bundles, a twentieth of the run. Sampling at most every
  20 ms keeps the samples and bounds each wait to 20 ms (the sleeps are in C, without the GIL).
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import Any, TypeVar

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import userstate

_beams_get_dofn_specs = userstate.get_dofn_specs
_beams_view_as = PipelineOptions.view_as
View = TypeVar("View", bound=PipelineOptions)
SAMPLING_PERIOD_MS = 20  # Beam's default is statesampler.DEFAULT_SAMPLING_PERIOD_MS, 200


def _key(dofn: Any) -> tuple:
    """The class, and each callable the instance holds, by what decides its signature: a
    function's code and defaults, a callable object's class. Never the held objects themselves:
    a worker unpickles new ones for every bundle, and the cache would keep them all alive.
    TypeError for what this cannot key (a ``functools.partial`` binds defaults per instance)."""
    held = []
    for name, value in getattr(dofn, "__dict__", {}).items():
        function = value.__func__ if isinstance(value, types.MethodType) else value
        if isinstance(function, types.FunctionType):
            held.append((name, function.__code__, function.__defaults__,
                         getattr(function, "__wrapped__", None)))
        elif isinstance(value, functools.partial):
            raise TypeError("a partial's defaults are its own")
        elif callable(value) and not isinstance(value, type):
            held.append((name, type(value)))
    return type(dofn), tuple(held)


_specs: dict[tuple, tuple[set, set]] = {}


def cached_dofn_specs(dofn: Any) -> tuple[set, set]:
    """Beam's ``get_dofn_specs``, answered from the first call for the same key. Copies of the
    sets are returned, so a caller that changes one cannot change the next answer."""
    try:
        key = _key(dofn)
        found = _specs.get(key)
    except TypeError:  # a partial, or an unhashable default: ask Beam
        return _beams_get_dofn_specs(dofn)
    if found is None:
        found = _specs[key] = _beams_get_dofn_specs(dofn)
    return set(found[0]), set(found[1])


_views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cached_view_as(options: PipelineOptions, cls: type[View]) -> View:
    """Beam's ``view_as``, made once per options object and class."""
    per_class = _views.setdefault(options, {})
    view = per_class.get(cls)
    if view is None:
        view = per_class[cls] = _beams_view_as(options, cls)
    return view


@functools.cache  # once per process
def install() -> None:
    """Beam's callers look ``get_dofn_specs`` up on its module and ``view_as`` on the class
    each time, so replacing both there reaches every caller. A bundle makes its sampler without
    a period (``bundle_processor.BundleProcessor``), so the constructor's default sets it."""
    userstate.get_dofn_specs = cached_dofn_specs
    PipelineOptions.view_as = cached_view_as
    statesampler.StateSampler.__init__.__defaults__ = (SAMPLING_PERIOD_MS,)
