"""Nothing in the pipeline graph gathers the data in one place: the real graph (every branch,
deduplication, mixing, validation splits by count, decontamination, curriculum phases) is built
by the entry point and walked, and every side input and every global combine (CombineGlobally,
ToList, ToDict, Count.Globally, Top) must be on the allow-list below, each with the reason its
size is bounded by the configuration rather than by the documents. On Dataflow each SDK process
holds its own copy of a side input, and a global combine ends on one worker, so one that grew
with the data would not scale out (issue 20).
"""

import re

import apache_beam as beam
import pytest
from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState

from beam_pipeline.running import run
from tests.conftest import EXAMPLES

# (label without the phase prefix, what it is): why it is bounded.
ALLOWED = {
    # One int: the number of decision files deduplication and boilerplate removal wrote. It
    # only makes the main pass wait for them; each chunk then reads its own file.
    ("KnowledgeBranch/CountDecisionFiles", "Globally"): "one int",
    ("KnowledgeBranch/DropDuplicates", "AsSingleton"): "the int above",
    # (shortest, longest) document in tokens: two ints.
    ("KnowledgeBranch/DocumentLengthRange", "CombineGlobally"): "two ints",
    # The counters: one per counter name (reason codes, steps, inputs: all fixed by the
    # vocabulary and the --input list) plus the manifest's few samples per kind, and the
    # counters of at most FILES_LISTED files per input (KeepWorstFiles sums them per file).
    ("SumStats", "CombineGlobally"): "counters",
    ("WriteOutputs/WriteManifest", "AsSingleton"): "the counters above",
    # Domains of documents' URLs are summed per domain through the shuffle first; then one key
    # ranks them, holding at most twice DOMAINS_LISTED domains per ranking and one count.
    # The manifest's facts: the configuration and the tokenizer's identity (found in the job),
    # waited on before any output is written, so that a run's earlier outputs are cleared first.
    ("AfterJobStart", "AsSingleton"): "the configuration and the tokenizer identity",
    # the same facts, for the extra --output_format writers (Megatron's dtype by vocabulary)
    ("WriteOutputs/WriteFiles", "AsSingleton"): "the configuration and the tokenizer identity",
    # The output plan: one entry per written file (--num_shards, or the data's size over
    # --target_shard_mb: thousands of small dicts at 1 TB).
    ("WriteOutputs/CollectWritten", "ToList"): "one entry per output file",
    # Placing the input shards in the output order: one (kind, shard, rows, bytes) per input
    # shard and output kind. Like the output plan it follows the data's size at a coarse grain
    # (64 MiB input shards: about 16,000 small tuples per kind at 1 TB); the notes of the
    # staged files (some 10^6 at 1 TB) stay grouped by shard and never meet on one worker.
    ("WriteOutputs/CollectShardSizes", "ToList"): "one entry per input shard and kind",
    # Mixing: one token histogram per declared source (name=...;weight=...) and the plan
    # made of them: bounded by the --input list and the histogram's fixed bins.
    ("KnowledgeBranch/MixSources/ToDict", "ToDict"): "one histogram per source",
    ("KnowledgeBranch/MixSources/Mix", "AsSingleton"): "the mixing plan",
    ("InstructionBranch/MixSources/ToDict", "ToDict"): "one histogram per source",
    ("InstructionBranch/MixSources/Mix", "AsSingleton"): "the mixing plan",
    # A validation split given as a count keeps that many digests (--*_validation=N), then
    # one int (the threshold) is the side input.
    ("KnowledgeBranch/SplitValidation/Smallest/Top(5)", "Of"): "--knowledge_validation=5",
    ("KnowledgeBranch/SplitValidation/Split", "AsSingleton"): "one int",
    ("InstructionBranch/SplitValidation/Smallest/Top(3)", "Of"): "--instruction_validation=3",
    ("InstructionBranch/SplitValidation/Split", "AsSingleton"): "one int",
    # Curriculum phases: one manifest path per phase= name.
    ("CollectPhases", "ToList"): "one path per phase",
}
GLOBAL_COMBINES = (beam.CombineGlobally, beam.combiners.ToList, beam.combiners.ToDict,
                   beam.combiners.ToSet, beam.combiners.Count.Globally, beam.combiners.Top.Of)


class GraphOnly(PipelineRunner):
    """Keeps the pipeline it is given and runs nothing."""

    built: list[beam.Pipeline] = []

    def is_fnapi_compatible(self) -> bool:
        return True  # no round trip through the runner API: the Python objects stay

    def run_pipeline(self, pipeline: beam.Pipeline, options) -> PipelineResult:
        GraphOnly.built.append(pipeline)
        return PipelineResult(PipelineState.DONE)


def findings(pipeline: beam.Pipeline) -> set[tuple[str, str]]:
    """(label, kind) of every side input and outermost global combine in the graph."""
    found = set()

    def visit(applied) -> None:
        label = re.sub(r"^Phase [^/]+/|/ParDo\([^/]*\)$", "", applied.full_label)
        if isinstance(applied.transform, GLOBAL_COMBINES):
            found.add((label, type(applied.transform).__name__))
            return  # its parts (a default value injected as a side input) are its own
        found.update((label, type(side).__name__) for side in applied.side_inputs)
        for part in applied.parts:
            visit(part)

    visit(pipeline._root_transform())
    return found


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> beam.Pipeline:
    """The entry point's graph for every kind of input and curation, in two curriculum phases
    (each phase is the whole graph of one run, under its own label; building takes seconds)."""
    inputs = [
        f"{EXAMPLES / 'c4_sample.jsonl'}#branch=knowledge;name=web;weight=2;phase=early",
        f"{EXAMPLES / 'tinyshakespeare_excerpt.txt'}#branch=knowledge;text_unit=paragraph;"
        "name=books;weight=1;phase=early",
        f"{EXAMPLES / 'sharegpt_sample.json'}#branch=instruction;name=chat;weight=1;phase=early",
        f"{EXAMPLES / 'gsm8k_sample.jsonl'}#branch=instruction;prompt=question;response=answer;"
        "name=math;weight=1;phase=late",
        f"{EXAMPLES / 'broken_lines.jsonl'}#branch=knowledge;phase=late",
    ]
    GraphOnly.built.clear()
    run([*(f"--input={value}" for value in inputs),
         f"--output={tmp_path_factory.mktemp('graph')}/out",
         f"--runner={GraphOnly.__module__}.GraphOnly", "--dedup=near",
         "--knowledge_validation=5", "--instruction_validation=3",
         f"--decontaminate={EXAMPLES / 'gsm8k_sample.jsonl'}#text=question"])
    (pipeline,) = GraphOnly.built
    return pipeline


def test_no_side_input_or_global_combine_grows_with_the_data(graph):
    found = findings(graph)
    assert ("KnowledgeBranch/DropDuplicates", "AsSingleton") in found, "the walk sees ParDos"
    assert ("SumStats", "CombineGlobally") in found, "the walk sees global combines"
    assert ("KnowledgeBranch/MixSources/Mix", "AsSingleton") in found, "and every branch"
    unexpected = found - set(ALLOWED)
    assert not unexpected, f"side inputs or global combines not on the allow-list: {unexpected}"
    assert ("CollectPhases", "ToList") in found, "the phases' graphs are built"


def labels(pipeline: beam.Pipeline) -> set[str]:
    """The full label of every transform in the graph, composites and their parts."""
    found = set()

    def visit(applied) -> None:
        found.add(applied.full_label)
        for part in applied.parts:
            visit(part)

    visit(pipeline._root_transform())
    return found


def test_boilerplate_is_found_through_the_shuffle_with_no_side_input(graph):
    """Boilerplate removal (on by default) groups paragraph hashes by bucket and hands each
    chunk its own decisions in the decision files: it adds no side input or global combine."""
    assert any(label.endswith("FindDuplicateDocuments/FindBoilerplate/GroupByBucket")
               for label in labels(graph))
    assert not [found for found in findings(graph) if "Boilerplate" in found[0]]


def test_copies_reach_their_survivor_through_the_shuffle_with_no_side_input(graph):
    """Each copy dropped counts for its survivor (``--write_documents``' duplicate columns) in a
    combine per survivor, then goes to the survivor's chunk's decision file: one more shuffle,
    and no side input or global combine."""
    assert any(label.endswith("FindDuplicateDocuments/WriteDecisions/CountCopies/Sum")
               for label in labels(graph))
    assert not [found for found in findings(graph) if "CountCopies" in found[0]]


def test_the_walk_catches_a_side_input_that_grows():
    """The walk is not blind: a dict of every document as a side input is found."""
    with beam.Pipeline() as p:
        docs = p | "Docs" >> beam.Create([("a", 1), ("b", 2)])
        _ = docs | "Use" >> beam.Map(lambda x, every: x, beam.pvalue.AsDict(docs))
        _ = docs | "All" >> beam.combiners.ToList()
        assert findings(p) == {("Use", "AsDict"), ("All", "ToList")}
