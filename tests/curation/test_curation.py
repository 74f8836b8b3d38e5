"""Mixing, validation split and decontamination as units: declarations, the mix plan's
arithmetic, the split's hashing and the n-gram matcher. End-to-end runs are in
test_curation_pipeline.py."""

import argparse
import dataclasses
import json
from collections.abc import Iterable

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import SHARED_DATA, require_shared_data
from tests.io.test_manifest import CONFIG
from transforms.core.records import Record
from transforms.core.steps import STATS, is_validation
from transforms.curation.decontam import DecontamConfig, EvalIndex, ngrams
from transforms.curation.mixing import BUCKETS, MixConfig, MixSources, plan_mix
from transforms.curation.options import fraction_or_count, mix_config
from transforms.curation.splits import HASH_SPACE, SplitOff, SplitValidation, split_salt
from transforms.io.input_specs import parse_input_spec
from transforms.io.manifest import build_manifest, summary_lines
from transforms.knowledge.branch import TokenizedChunk

require_shared_data()


def specs(*values: str):
    return [parse_input_spec(i, value) for i, value in enumerate(values)]


def test_inputs_declare_weight_and_phase():
    spec = parse_input_spec(0, "a.jsonl#branch=instruction;name=math;weight=15;phase=reasoning")
    assert (spec.name, spec.weight, spec.phase) == ("math", 15.0, "reasoning")
    for bad in ("a#weight=0", "a#weight=-1", "a#weight=x", "a#weight=inf", "a#name=a b",
                "a#phase=../up", "a#name=.hidden"):
        with pytest.raises(ValueError):
            parse_input_spec(0, bad)


def test_validation_size_is_a_fraction_or_a_whole_count():
    assert fraction_or_count("0.05") == 0.05
    assert fraction_or_count("500") == 500
    assert fraction_or_count("0") == 0
    for bad in ("-0.1", "2.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            fraction_or_count(bad)


def test_weights_become_shares_of_their_branch():
    config = mix_config("instruction", specs(
        "a#branch=instruction;name=general;weight=40",
        "b#branch=instruction;name=code;weight=20",
        "c#branch=instruction;name=code",  # a second file of the same source
        "d#branch=knowledge;name=web;weight=1",
    ), "down", 7)
    assert config.shares == (("code", 20 / 60), ("general", 40 / 60))
    assert config.sources == ((0, "general"), (1, "code"), (2, "code"))
    assert (config.scale, config.seed) == ("down", 7)
    assert mix_config("instruction", specs("a#branch=instruction"), "down", 0) is None


@pytest.mark.parametrize("values, message", [
    (("a#branch=instruction;name=x;weight=1", "b"), "declare branch"),
    (("a#branch=instruction;name=x;weight=1", "b#branch=instruction"), "needs name"),
    (("a#branch=instruction;name=x;weight=1", "b#branch=instruction;name=y"), "no weight"),
    (("a#branch=instruction;name=x;weight=1", "b#branch=instruction;name=x;weight=2"),
     "two weights"),
])
def test_incomplete_or_contradictory_weights_fail_before_work(values, message):
    with pytest.raises(ValueError, match=message):
        mix_config("instruction", specs(*values), "down", 0)


def histogram(tokens_per_bucket: dict[int, int]) -> np.ndarray:
    result = np.zeros(BUCKETS, dtype=np.int64)
    for bucket, tokens in tokens_per_bucket.items():
        result[bucket] = tokens
    return result


def config(scale: str) -> MixConfig:
    return MixConfig("knowledge", ((0, "big"), (1, "small")),
                     (("big", 0.5), ("small", 0.5)), scale)


def test_down_scaling_leaves_out_the_surplus_of_the_larger_source():
    big = histogram({b: 10 for b in range(0, 1000)})  # 10,000 tokens
    small = histogram({5: 2000})
    plans = plan_mix({"big": big, "small": small}, config("down"))
    assert plans["small"].whole == 1 and plans["small"].extra_buckets == 0
    # big keeps 2,000 of 10,000 tokens: the records in its first 200 buckets, once.
    assert plans["big"].whole == 0 and plans["big"].extra_buckets == 200


def test_up_scaling_repeats_the_smaller_source_and_drops_nothing():
    big = histogram({b: 10 for b in range(0, 1000)})
    small = histogram({b: 40 for b in range(100)})  # 4,000 tokens: 2.5 copies
    plans = plan_mix({"big": big, "small": small}, config("up"))
    assert (plans["big"].whole, plans["big"].extra_buckets) == (1, 0)
    assert plans["small"].whole == 2 and plans["small"].extra_buckets == 50


def test_a_weighted_source_without_tokens_fails_loudly():
    with pytest.raises(ValueError, match="small"):
        plan_mix({"big": histogram({0: 10})}, config("down"))


def records_at(origins: Iterable[tuple[str, int, int]]) -> tuple[Record, ...]:
    return tuple(Record(source, position, index) for source, position, index in origins)


def tokenized(count: int) -> TokenizedChunk:
    arrays = tuple(np.array([i % 97, i // 97, 5], dtype=np.int32) for i in range(count))
    return TokenizedChunk("c0", arrays + (np.array([7, 7], dtype=np.int32),) * 5,
                          records_at(("f", i, 0) for i in range(count + 5)))


def test_the_split_hashes_what_is_trained_and_keeps_copies_together():
    chunk = tokenized(2000)
    step = SplitValidation(seed=0, fraction=0.1)
    outputs = [o for o in step.process(chunk) if isinstance(o, TokenizedChunk)]
    train, held = outputs
    assert not is_validation(train.chunk_id) and is_validation(held.chunk_id)
    assert len(train.origins) + len(held.origins) == 2005
    assert 150 <= len(held.origins) <= 250  # about 10%
    digests = chunk.record_digests("validation:0")
    expected = {chunk.origins[i] for i in range(2005) if digests[i] < 0.1 * HASH_SPACE}
    assert set(held.origins) == expected
    copies = {("f", i, 0) for i in range(2000, 2005)}
    assert copies <= set(held.origins) or not copies & set(held.origins)
    [stats] = [o.value for o in step.process(chunk) if getattr(o, "tag", None) == STATS]
    assert stats["validation.knowledge.documents"] == len(held.origins)
    assert stats["validation.knowledge.tokens"] == sum(len(a) for a in held.token_arrays)
    reseeded = SplitValidation(seed=1, fraction=0.1)
    _, other = [o for o in reseeded.process(chunk) if isinstance(o, TokenizedChunk)]
    assert set(other.origins) != expected


def gsm8k_index(**kwargs) -> EvalIndex:
    spec = parse_input_spec(0, f"{SHARED_DATA}/math/gsm8k_test.jsonl#text=question")
    return EvalIndex(DecontamConfig((spec,), **kwargs))


def test_ngrams_are_lower_cased_words():
    assert ngrams("The cat, the HAT!", 2) == {"the cat", "cat the", "the hat"}
    assert ngrams("too short", 3) == set()


def test_short_evaluation_texts_are_counted_per_set(tmp_path):
    """Texts with fewer words than the n-gram size cannot be matched; each set says how many."""
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(json.dumps({"q": q}) for q in [
        "Yes", "What is two plus two?", "one two three four five six seven eight",
        "Name the largest planet of the solar system, please, in one word."]) + "\n")
    specs = (parse_input_spec(0, f"{short}#text=q"),
             parse_input_spec(1, f"{SHARED_DATA}/math/gsm8k_test.jsonl#text=question"))
    index = EvalIndex(DecontamConfig(specs, ngram=8))
    assert index.counts() == {str(short): {"indexed": 2, "too_short": 2},
                              f"{SHARED_DATA}/math/gsm8k_test.jsonl": {"indexed": 1319,
                                                                       "too_short": 0}}
    config = {**CONFIG, "curation": {"decontam": {
                  "eval_sets": [{"pattern": s.pattern} for s in specs],
                  "ngram": 8, "threshold": 0.5}}}
    manifest = build_manifest({}, [], config, {}, index.counts())
    assert manifest["decontamination"]["eval_texts"] == index.counts()
    assert ("decontamination: 2 evaluation text(s) shorter than 8 words were not checked "
            "(see eval_texts)") in summary_lines(manifest)


def test_a_planted_test_question_matches_and_unrelated_text_does_not():
    index = gsm8k_index()
    assert len(index.texts) == 1319
    question = ("Janet\u2019s ducks lay 16 eggs per day. She eats three for breakfast every "
                "morning and bakes muffins for her friends every day with four. She sells the "
                "remainder at the farmers' market daily for $2 per fresh duck egg. How much in "
                "dollars "
                "does she make every day at the farmers' market?")
    found = index.match(f"Please solve this.\n{question}\nThink step by step.")
    assert found is not None and found.overlap == 1.0 and found.text.position == 0
    # A third of the question holds too few of its n-grams for the default threshold (0.5).
    words = question.split()
    assert index.match(" ".join(words[: len(words) // 3])) is None
    assert index.match("Tom has 3 apples and buys 4 more. How many apples does he have?") is None
    assert gsm8k_index(threshold=0.2).match(" ".join(words[: len(words) // 2])) is not None


def test_split_off_holds_out_exactly_the_count_with_the_smallest_digests():
    """The composite: a whole count finds its threshold over every chunk (a side input)."""
    chunks = [dataclasses.replace(tokenized(300), chunk_id=f"c{k}") for k in range(3)]
    salt = split_salt(0)
    digests = sorted(int(d) for chunk in chunks for d in chunk.record_digests(salt))
    expected = sum(1 for d in digests if d <= digests[49])  # ties with the 50th held out too
    with test_pipeline.TestPipeline() as p:
        split = p | beam.Create(chunks) | SplitOff(50, seed=0)
        held = split.main | beam.Filter(lambda chunk: is_validation(chunk.chunk_id))
        sizes = held | beam.Map(lambda chunk: len(chunk.origins)) | beam.CombineGlobally(sum)
        assert_that(sizes, equal_to([expected]), label="held out")
        everything = split.main | "All" >> beam.Map(lambda chunk: len(chunk.origins))
        assert_that(everything | "Total" >> beam.CombineGlobally(sum), equal_to([3 * 305]),
                    label="nothing lost")


def test_mix_sources_scales_the_larger_source_down_to_its_share():
    """The composite: token histograms per source, a plan (a side input), then each chunk."""
    arrays = tuple(np.array([i % 97, i // 97, 5], dtype=np.int32) for i in range(250))
    origins = tuple(("f", i, 0 if i < 200 else 1) for i in range(250))  # 200 big, 50 small
    chunks = [TokenizedChunk("c0", arrays[:125], records_at(origins[:125])),
              TokenizedChunk("c1", arrays[125:], records_at(origins[125:]))]
    with test_pipeline.TestPipeline() as p:
        mixed = p | beam.Create(chunks) | MixSources(config("down"), "knowledge.unselected")
        kept = mixed.main | beam.FlatMap(lambda chunk: [origin[2] for origin in chunk.origins])
        per_source = kept | beam.combiners.Count.PerElement()
        # The small source is kept whole; the big one keeps about as many tokens (bucket by
        # bucket), far fewer than its 200 documents.
        assert_that(per_source | beam.Filter(lambda kv: kv[0] == 1), equal_to([(1, 50)]),
                    label="small kept whole")
        big = per_source | "Big" >> beam.Filter(lambda kv: kv[0] == 0) | "N" >> beam.Values()
        assert_that(big | beam.Map(lambda n: 25 <= n <= 100), equal_to([True]), label="big")
        counted = (mixed[STATS] | beam.FlatMap(dict.items)
                   | "Unselected" >> beam.Filter(lambda kv: kv[0] == "knowledge.unselected")
                   | beam.CombinePerKey(sum) | "Count" >> beam.Values())
        total = (big | "AsList" >> beam.combiners.ToList()
                 | beam.Map(lambda n, dropped: n[0] + dropped,
                            dropped=beam.pvalue.AsSingleton(counted)))
        assert_that(total, equal_to([200]), label="every big document kept or counted")
