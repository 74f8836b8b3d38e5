"""The cached answers to Beam's DoFn-spec and options-view questions are Beam's own
(transforms/core/beam_caches.py)."""

import functools
import subprocess
import sys
from pathlib import Path

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TypeOptions
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import userstate
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.utils.counters import CounterFactory

from beam_pipeline.planning import prepare
from beam_pipeline.running import build_pipeline
from transforms.core import beam_caches

ROOT = Path(__file__).resolve().parents[1]
COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())
COUNT_STATE = beam.DoFn.StateParam(COUNT)  # Beam's marker, read from the defaults


class _Counting(beam.DoFn):
    def process(self, element, count=COUNT_STATE):
        yield element


class _Steps:
    def counted(self, element, count=COUNT_STATE):
        return element

    def plain(self, element):
        return element


class _Holding(beam.DoFn):
    """Holds a bound method, whose defaults Beam reads as the DoFn's own."""

    def __init__(self, step):
        self.step = step

    def process(self, element):
        yield self.step(element)


def _dofns(pipeline: beam.Pipeline) -> list:
    found = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if isinstance(node.transform, beam.ParDo):
                found.append(node.transform.fn)

    pipeline.visit(Visitor())
    return found


def test_beams_lookups_are_the_caches():
    beam_caches.install()  # as building a graph does
    assert userstate.get_dofn_specs is beam_caches.cached_dofn_specs
    assert beam_caches._beams_get_dofn_specs.__module__ == "apache_beam.transforms.userstate"
    assert PipelineOptions.view_as is beam_caches.cached_view_as
    assert beam_caches._beams_view_as.__qualname__ == "PipelineOptions.view_as"


def test_a_bundles_state_sampler_samples_every_20_ms_at_most():
    beam_caches.install()
    init = statesampler.StateSampler.__init__
    names = init.__code__.co_varnames[:init.__code__.co_argcount]
    assert names[-1] == "sampling_period_ms" and len(init.__defaults__) == 1  # Beam's shape
    sampler = statesampler.StateSampler("fnapi-step-x", CounterFactory())  # as a bundle makes it
    assert sampler.sampling_period_ms == beam_caches.SAMPLING_PERIOD_MS == 20


def test_a_worker_that_imports_the_package_after_beam_answers_from_the_caches():
    code = ("import apache_beam, transforms; from apache_beam.transforms import userstate; "
            "from transforms.core import beam_caches; "
            "assert userstate.get_dofn_specs is beam_caches.cached_dofn_specs")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_a_cached_view_reads_and_writes_the_options_it_was_taken_from():
    options = PipelineOptions(["--runner=DirectRunner", "--type_check_strictness=ALL_REQUIRED"])
    view = options.view_as(StandardOptions)
    assert options.view_as(StandardOptions) is view and view.runner == "DirectRunner"
    view.runner = None  # as Beam's Pipeline does while it builds
    assert options.view_as(StandardOptions).runner is None
    assert options.get_all_options()["runner"] is None
    assert options.view_as(TypeOptions).type_check_strictness == "ALL_REQUIRED"
    other = PipelineOptions(["--runner=Other"])
    assert other.view_as(StandardOptions).runner == "Other"


def test_every_dofn_of_the_demo_graph_gets_beams_answer_as_a_worker_unpickles_it_too(tmp_path):
    data = ROOT / "examples" / "data"
    plan = prepare([f"--input={data / 'c4_sample.jsonl'}",
                    f"--input={data / 'messages_sample.json'}", f"--output={tmp_path}/o"])
    dofns = _dofns(build_pipeline(plan))
    assert len(dofns) > 50
    for dofn in dofns:
        expected = beam_caches._beams_get_dofn_specs(dofn)
        assert beam_caches.cached_dofn_specs(dofn) == expected
        assert beam_caches.cached_dofn_specs(pickler.loads(pickler.dumps(dofn))) == expected


def test_state_in_a_class_or_in_a_held_method_is_seen_and_kept_apart():
    steps = _Steps()
    counted, plain = _Holding(steps.counted), _Holding(steps.plain)
    for dofn in (_Counting(), counted):
        assert beam_caches._beams_get_dofn_specs(dofn) == ({COUNT}, set())
        assert beam_caches.cached_dofn_specs(dofn) == ({COUNT}, set())
    assert beam_caches.cached_dofn_specs(plain) == (set(), set())
    assert userstate.is_stateful_dofn(counted)
    assert not userstate.is_stateful_dofn(plain)


class _Encoder:
    """A callable object a DoFn holds, as a step holds its tokenizer's encoder."""

    def __call__(self, text):
        return text


def test_held_callable_objects_share_one_entry_and_partials_ask_beam():
    before = len(beam_caches._specs)
    for _ in range(3):  # a worker unpickles a new DoFn, and a new encoder, for each bundle
        assert beam_caches.cached_dofn_specs(_Holding(_Encoder())) == (set(), set())
    assert len(beam_caches._specs) == before + 1  # the encoders are not kept alive
    counted = _Holding(functools.partial(_Steps().counted))
    assert beam_caches.cached_dofn_specs(counted) == beam_caches._beams_get_dofn_specs(counted)
    assert len(beam_caches._specs) == before + 1


def test_a_caller_changing_an_answer_does_not_change_the_next():
    states, _ = beam_caches.cached_dofn_specs(_Counting())
    states.clear()
    assert beam_caches.cached_dofn_specs(_Counting())[0] == {COUNT}
