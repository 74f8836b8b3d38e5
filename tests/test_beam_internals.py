"""Each private Beam API the entry point wraps (beam_pipeline/beam_internals.py) still works."""

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_pipeline import beam_internals


def test_beams_option_classes_declare_their_options_on_the_parser():
    parser = beam_internals.argument_parser(prog="x")
    StandardOptions._add_argparse_args(parser)  # uses add_value_provider_argument
    assert parser.parse_args(["--runner=DirectRunner"]).runner == "DirectRunner"


def test_help_groups_can_be_retitled_and_ordered():
    parser = beam_internals.argument_parser(prog="x")
    parser.add_argument("--beam_like")
    ours = parser.add_argument_group("ours")
    ours.add_argument("--own")
    beam_internals.set_default_group_title(parser, "Beam options")
    beam_internals.order_groups(parser, lambda group: group.title != "ours")
    groups = parser.format_help().split("\n\n", 1)[1]  # after the usage line
    assert groups.index("ours:") < groups.index("--own") < groups.index("Beam options:")
    assert groups.index("Beam options:") < groups.index("--beam_like")


def test_the_fn_api_runner_runs_a_pipeline_with_its_options():
    options = PipelineOptions(["--direct_running_mode=in_memory"])
    with beam.Pipeline(runner=beam_internals.fn_api_runner(options), options=options) as p:
        doubled = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: 2 * x)
        assert_that(doubled, equal_to([2, 4, 6]))
