"""The private Beam APIs the entry point needs, in one place, each with why and what checks it.

Beam 2.77 offers no public way to do these; a Beam upgrade may rename any of them. Each use is a
small function here, so an upgrade breaks this module alone, and a named test fails:

* ``argument_parser``: Beam's own ``_BeamArgumentParser``. Beam's option classes declare their
  options with ``parser.add_value_provider_argument``, which only that class has, so ``--help``
  can list Beam's options (and reject a bad Beam value before any work) only through it.
  Checked by ``tests/test_beam_internals.py`` and ``tests/test_options.py``.
* ``set_default_group_title``, ``order_groups`` and ``group_actions``: argparse keeps its groups
  in the private ``_optionals``, ``_action_groups`` and ``_group_actions``; ``--help`` names
  Beam's catch-all group and lists ours first through them, and the Flex Template metadata and
  the options reference read each group's options through them. Checked by
  ``tests/test_beam_internals.py``, ``tests/test_options.py`` and ``tests/test_flex_template.py``.
* ``fn_api_runner``: the DirectRunner first tries the Prism runner, which it downloads (offline
  that costs half a second, and Prism ignores ``--direct_running_mode``); the FnApiRunner is
  built here the way the DirectRunner builds it when it falls back, with the pipeline options in
  its provision info so that ``multi_processing`` workers receive them. Checked by every
  pipeline test (``tests/test_pipeline.py`` in both running modes) and
  ``tests/test_beam_internals.py``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner.fn_runner import (
    ExtendedProvisionInfo,
    FnApiRunner,
)
from apache_beam.runners.portability.portable_runner import JobServiceHandle


def argument_parser(**kwargs: Any) -> argparse.ArgumentParser:
    """An argument parser that Beam's option classes can add their options to."""
    return _BeamArgumentParser(**kwargs)


def set_default_group_title(parser: argparse.ArgumentParser, title: str) -> None:
    """Renames the group that holds every option declared outside a group (Beam's)."""
    parser._optionals.title = title


def order_groups(parser: argparse.ArgumentParser,
                 key: Callable[[argparse._ArgumentGroup], Any]) -> None:
    """Orders the option groups of ``--help`` by ``key`` (stable)."""
    parser._action_groups.sort(key=key)


def group_actions(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    """Each option group's title and its options, in ``--help`` order (argparse keeps them in
    private lists; ``--help``, the Flex metadata and the options reference all need them)."""
    return {group.title: list(group._group_actions) for group in parser._action_groups}


def fn_api_runner(options: PipelineOptions) -> FnApiRunner:
    """The FnApiRunner as Beam's DirectRunner builds it when it falls back from Prism."""
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return FnApiRunner(provision_info=ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))
