"""Deduplication: exact and near copies of real documents are found, distinct ones are not,
and the copy that survives is always the one with the smallest record key."""

import itertools
import json
import random
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import SHARED_DATA, require_shared_data
from tests.knowledge.dedup_reference import candidate_pairs, resolve_duplicates
from transforms.core.records import Record
from transforms.core.tokenizer import DEFAULT_TOKENIZER
from transforms.core.vocabulary import (
    DUPLICATE_EXACT,
    DUPLICATE_NEAR,
    Drop,
)
from transforms.io.input_specs import parse_input_spec
from transforms.io.planning import plan_shards
from transforms.knowledge.dedup import components
from transforms.knowledge.dedup.components import (
    ConnectedComponents,
    FindDuplicates,
    band_rows_by_bucket,
    packed_candidate_pairs_in_bucket,
    unpack_pair,
)
from transforms.knowledge.dedup.config import DedupConfig
from transforms.knowledge.dedup.decisions import ChunkDecisions, write_decisions
from transforms.knowledge.dedup.first_pass import FindDuplicateDocuments
from transforms.knowledge.dedup.minhash import (
    CONTENT,
    DocumentKeys,
    MinHasher,
    band_keys,
    document_keys,
    file_numbering,
    shingles,
    similarity,
)
from transforms.knowledge.normalize import normalize_text
from transforms.knowledge.options import KnowledgeConfig
from transforms.knowledge.quality import TextStats, text_hash

require_shared_data()

CONFIG = DedupConfig()
C4 = SHARED_DATA / "pretrain" / "llamafactory_c4_demo.jsonl"


def c4_texts() -> list[str]:
    return [normalize_text(json.loads(line)["text"]) for line in C4.read_text().splitlines()]


def edited(text: str, words: int, seed: int) -> str:
    """``text`` with ``words`` of its words replaced and its lines run together: a small edit."""
    tokens = text.split()
    rng = random.Random(seed)
    for position in rng.sample(range(len(tokens)), words):
        tokens[position] = "zebra"
    return " ".join(tokens)


def restyled(text: str) -> str:
    """The same words with other capitals, apostrophes and punctuation: not an exact copy."""
    return text.upper().replace("'", "\u2019").replace(".", "!")


def keys_of(key, text: str, hasher: MinHasher | None, chunk: int = 0):
    return document_keys(key, chunk, TextStats(text), CONFIG, hasher)


@pytest.fixture(scope="module")
def hasher() -> MinHasher:
    return MinHasher(CONFIG.num_perm)


@pytest.fixture(scope="module")
def long_pages() -> list[str]:
    return [text for text in c4_texts() if len(text.split()) >= 200]


def test_the_hash_family_is_fixed():
    """Signatures must agree across processes, runs and library versions."""
    signature = MinHasher(128).signature(shingles(TextStats(
        "The quick brown fox jumps over the lazy dog"), 5))
    assert signature.dtype == np.dtype("<u4")
    assert signature[:4].tolist() == [3854833174, 4061383241, 4061383241, 2196621804]
    assert band_keys(signature, 16)[0].hex() == "fa4da21a76a0375c"


@pytest.mark.parametrize("length", [12, 60, 300])  # shingles, fewer and more than the bins
def test_signatures_estimate_the_jaccard_similarity_of_real_shingle_sets(length, hasher):
    """Each bin agrees with probability J, filled or densified: over many pairs of real
    shingle sets the estimate is unbiased, and its spread is that of 128 draws."""
    rng = np.random.default_rng(length)
    errors = []
    for text in c4_texts():
        found = shingles(TextStats(text), CONFIG.ngram)[:length]
        if len(found) < length:
            continue
        other = np.concatenate([found[rng.random(length) > rng.uniform(0.05, 0.6)],
                                rng.integers(0, 2**63, size=length // 4, dtype=np.uint64)])
        a, b = set(found.tolist()), set(other.tolist())
        jaccard = len(a & b) / len(a | b)
        estimate = similarity(hasher.signature(found).tobytes(),
                              hasher.signature(other).tobytes())
        errors.append(estimate - jaccard)
    assert len(errors) >= 80
    assert abs(np.mean(errors)) < 0.01 and np.std(errors) < 0.06


def test_exact_keys_hash_the_normalised_text():
    text = c4_texts()[0]
    assert text_hash(text) == text_hash(normalize_text(text + "\r\n\r\n\r\n"))
    assert text_hash(text) != text_hash(text + ".")
    assert keys_of((0, 0, 0), text, None).bands == ()


@pytest.mark.parametrize("words", [1, 2, 3])
def test_small_edits_of_real_pages_are_near_copies(words, long_pages, hasher):
    for seed, text in enumerate(long_pages[:40]):
        original = keys_of((0, 0, 0), text, hasher)
        copy = keys_of((1, 1, 0), edited(text, words, seed), hasher)
        assert original.node[CONTENT] != copy.node[CONTENT]
        assert similarity(original.signature, copy.signature) >= CONFIG.threshold
        assert set(original.bands) & set(copy.bands), "LSH must make them candidates"


def test_restyled_pages_are_near_copies_with_all_shingles_equal(long_pages, hasher):
    for text in long_pages[:20]:
        original = keys_of((0, 0, 0), text, hasher)
        copy = keys_of((0, 0, 1), restyled(text), hasher)
        assert original.node[CONTENT] != copy.node[CONTENT] and original.signature == copy.signature


def test_distinct_real_documents_are_not_near_copies(hasher):
    texts = c4_texts()
    signatures = np.stack([np.frombuffer(keys_of((0, 0, i), t, hasher).signature, "<u4")
                           for i, t in enumerate(texts)])
    agree = (signatures[:, None, :] == signatures[None, :, :]).mean(axis=2)
    np.fill_diagonal(agree, 0)
    assert agree.max() < 0.5


def test_a_bucket_pairs_its_first_member_with_each_other_content():
    a, b, c, d = (0, 0, 0, 3, b"0"), (0, 0, 5, 3, b"1"), (1, 1, 0, 2, b"1"), (1, 1, 9, 2, b"2")
    members = [d, c, b, a]  # b and c: the same content
    assert list(candidate_pairs((b"band", members))) == [(a, b), (a, d)]


@pytest.mark.parametrize("buckets", [1, 3])
def test_packed_band_rows_give_the_pairs_of_a_plain_grouping(hasher, buckets):
    """Real documents, two of them near copies and one an exact copy, split over two batches:
    the packed shuffle pairs exactly what grouping every (band, document) would."""
    texts = c4_texts()[:6]
    texts.append(texts[0].replace("the", "a", 1))
    texts.append(texts[3])
    docs = [keys_of((i % 2, 7, i), text, hasher) for i, text in enumerate(texts)]
    plain: dict[bytes, list] = {}
    for doc in docs:
        for band in doc.bands:
            plain.setdefault(band, []).append(doc.node)
    expected = sorted(pair for group in plain.items() for pair in candidate_pairs(group))
    assert expected, "the near copy shares a band with its original"
    per_bucket: dict[int, list[bytes]] = {}
    for batch in (docs[:4], docs[4:]):
        for bucket, blob in band_rows_by_bucket(batch, buckets):
            assert 0 <= bucket < buckets
            per_bucket.setdefault(bucket, []).append(blob)
    found = sorted(unpack_pair(pair) for bucket in per_bucket.items()
                   for pair in packed_candidate_pairs_in_bucket(bucket))
    assert found == expected
    assert all(isinstance(part, int) for pair in found for node in pair
               for part in node[:CONTENT])


def test_band_rows_sorted_a_slice_at_a_time_give_the_same_pairs(monkeypatch):
    """Band keys shared by 1 to 5 documents (some with the same content), taken 3 rows at a
    time: a key's rows stay in one slice and the pairs are those of a plain grouping."""
    rng = np.random.default_rng(7)
    docs = [DocumentKeys((0, 1, i, 9, bytes([i % 4]) * 16),
                         tuple(bytes([band]) + b"%07d" % rng.integers(0, 6) for band in range(3)))
            for i in range(40)]
    plain: dict[bytes, list] = {}
    for doc in docs:
        for band in doc.bands:
            plain.setdefault(band, []).append(doc.node)
    expected = sorted(pair for group in plain.items() for pair in candidate_pairs(group))
    bucket = (0, [blob for _, blob in band_rows_by_bucket(docs, 1)])
    assert sorted(map(unpack_pair, packed_candidate_pairs_in_bucket(bucket))) == expected
    monkeypatch.setattr(components, "_SLICE_ROWS", 3)
    monkeypatch.setattr(components, "_PAIR_BATCH", 2)
    assert sorted(map(unpack_pair, packed_candidate_pairs_in_bucket(bucket))) == expected


def node(*key: int) -> tuple:
    return (*key, 0, b"")


def test_clusters_keep_their_smallest_key_whatever_the_edge_order():
    a, b, c, d = node(0, 1, 0), node(0, 1, 7), node(1, 0, 0), node(1, 0, 3)
    expected = {b: (DUPLICATE_NEAR, a), c: (DUPLICATE_NEAR, a), d: (DUPLICATE_EXACT, a)}
    for edges in itertools.permutations([(b, c), (a, b)]):
        assert resolve_duplicates([(d, c)], edges) == expected


def random_graph(seed: int) -> tuple[list, list]:
    """Exact groups (stars around their first) and near pairs on 60 nodes, with chains and
    clusters that merge through exact copies: the shapes label propagation must resolve."""
    rng = random.Random(seed)
    nodes = [node(rng.randrange(3), rng.randrange(4), position) for position in range(60)]
    rng.shuffle(nodes)
    exact = []
    for group in (nodes[0:4], nodes[4:6], nodes[30:33]):
        first, *others = sorted(group)
        exact += [(other, first) for other in others]
    copies = {copy for copy, _ in exact}
    firsts = [n for n in nodes if n not in copies]
    near = [tuple(sorted(rng.sample(firsts, 2))) for _ in range(25)]
    near += list(itertools.pairwise(sorted(firsts[40:46], reverse=True)))  # a chain of 5
    return exact, near


@pytest.mark.parametrize("seed", [0, 1])
def test_label_propagation_decides_as_union_find(seed):
    """ConnectedComponents over the shuffle against the one-machine definition."""
    exact, near = random_graph(seed)
    expected = resolve_duplicates(exact, near)
    assert len({kept for _, kept in expected.values()}) > 2, "several clusters"
    edges = [(*edge, True) for edge in exact] + [(*edge, False) for edge in near]
    with test_pipeline.TestPipeline() as p:
        found = p | beam.Create(edges) | ConnectedComponents()
        assert_that(found, equal_to([(n, *decided) for n, decided in expected.items()]))


def test_label_propagation_refuses_to_decide_before_it_converges():
    chain = [node(0, 0, position) for position in range(6)]
    edges = [(a, b, False) for a, b in itertools.pairwise(chain)]
    with (pytest.raises(Exception, match=r"did not converge in 5 rounds.*--dedup_rounds above 5"),
          test_pipeline.TestPipeline() as p):
        _ = p | beam.Create(edges) | ConnectedComponents(rounds=5)
    with test_pipeline.TestPipeline() as p:  # six rounds: five to carry the label, one to see
        found = p | beam.Create(edges) | ConnectedComponents(rounds=6)
        assert_that(found, equal_to([(n, DUPLICATE_NEAR, chain[0]) for n in chain[1:]]))


def test_num_perm_must_split_into_bands():
    with pytest.raises(ValueError, match="multiple"):
        DedupConfig(num_perm=100, bands=16)


@pytest.mark.parametrize("buckets", [1, 3, 8])
def test_find_duplicates_across_inputs_keeps_the_smallest_record_key(long_pages, hasher,
                                                                     buckets):
    """Input 0 holds copies of pages that input 1 holds too: input 0's copies survive, even
    where input 1's page comes first in its file; within an input the first position wins."""
    pages = long_pages[:6]
    copies, pages_file = 0, 1  # file numbers
    docs = [
        ((0, copies, 100), pages[0]),  # survives: input 0 sorts first
        ((0, copies, 200), edited(pages[1], 2, 0)),  # survives over pages[1] in input 1
        ((0, copies, 300), pages[0]),  # exact copy of (0, copies, 100)
        ((1, pages_file, 0), pages[0]),  # exact copy, in a later input
        ((1, pages_file, 10), pages[1]),  # near copy of (0, copies, 200)
        ((1, pages_file, 20), restyled(pages[2])),  # survives: its twin comes later
        ((1, pages_file, 30), pages[2]),  # near copy (same words, other style)
        ((1, pages_file, 40), pages[3]),  # distinct: survives
    ]
    keys = [keys_of(key, text, hasher, chunk=key[2] // 100) for key, text in docs]
    expected = {
        (0, copies, 300): (DUPLICATE_EXACT, (0, copies, 100)),
        (1, pages_file, 0): (DUPLICATE_EXACT, (0, copies, 100)),
        (1, pages_file, 10): (DUPLICATE_NEAR, (0, copies, 200)),
        (1, pages_file, 30): (DUPLICATE_NEAR, (1, pages_file, 20)),
    }
    with test_pipeline.TestPipeline() as p:
        batches = [tuple(keys[:3]), tuple(keys[3:5]), tuple(keys[5:])]  # chunks
        found = (p | beam.Create(batches) | FindDuplicates(CONFIG.threshold, buckets)
                 | beam.MapTuple(lambda n, reason, kept: (n[:CONTENT - 1], (reason, kept[:3]))))
        assert_that(found, equal_to(list(expected.items())))


def test_a_chunks_decisions_are_read_back_and_name_the_survivor(tmp_path):
    files = file_numbering(["/data/b.jsonl", "/data/a.jsonl", "/data/b.jsonl"])
    assert files == ("/data/a.jsonl", "/data/b.jsonl")
    numbers = {path: number for number, path in enumerate(files)}
    copy = (1, 1, 40, 9, text_hash("text"))
    path = write_decisions(9, [(copy, DUPLICATE_NEAR, (0, 0, 7, 2, b"x" * 16))], [],
                           str(tmp_path))
    found = ChunkDecisions.read(path)
    assert found.verdict(Record("/data/b.jsonl", 40, 1, "text"), files, numbers) == Drop(
        DUPLICATE_NEAR, "copy of the document at position 7 of /data/a.jsonl (input 0)")
    assert found.verdict(Record("/data/a.jsonl", 40, 1, "text"), files, numbers) is None
    # a stale decision (made for another text at that place) drops nothing
    assert found.verdict(Record("/data/b.jsonl", 40, 1, "new text"), files, numbers) is None
    assert ChunkDecisions.read(str(tmp_path / "absent.arrow")).drops == {}


def test_find_duplicates_of_nothing_decides_nothing():
    with test_pipeline.TestPipeline() as p:
        found = p | beam.Create([]) | FindDuplicates(CONFIG.threshold)
        assert_that(found, equal_to([]))


def drop_decisions(found, files):
    """(file name, position, reason, survivor's file name, survivor's position) per dropped
    document, from what ``FindDuplicateDocuments`` returns: its decision files, read back."""
    def flat(path: str):
        for (_, number, position), (_, reason, (_, kept_number, kept_position)) in \
                ChunkDecisions.read(path).drops.items():
            yield (Path(files[number]).name, position, reason, Path(files[kept_number]).name,
                   kept_position)

    return found | "Flat" >> beam.FlatMap(flat)


@pytest.fixture(scope="module")
def sample(tmp_path_factory, long_pages) -> tuple[list[str], dict]:
    """Two real input files, the --input values and the offset of each line by (file, line)."""
    a, b, c, d = long_pages[:4]
    once = edited(a, 2, seed=3)
    files = {
        "first.jsonl": [a, b, once, "A short line with too few words."],
        "second.jsonl": [c, edited(once, 2, seed=5), a + "\n\n", restyled(b), d, d, once],
    }
    folder = tmp_path_factory.mktemp("sample")
    offsets = {}
    for name, texts in files.items():
        lines = [json.dumps({"text": text}) + "\n" for text in texts]
        (folder / name).write_text("".join(lines))
        starts = itertools.accumulate((len(line.encode()) for line in lines), initial=0)
        offsets.update({(name, i): start for i, start in enumerate(starts) if i < len(lines)})
    return [str(folder / name) for name in files], offsets


def test_find_duplicate_documents_drops_every_copy_and_keeps_the_first(sample, tmp_path):
    """The composite on real files, two lines per chunk: a page, its exact copies (one only
    after normalisation), its near copy and the near copy's own near copy form one cluster,
    kept at the page; a restyled page is a near copy; a page repeated in the later file keeps
    its first line. The quality filter's drop (the short line) is not keyed at all."""
    values, at = sample
    specs = [parse_input_spec(i, value) for i, value in enumerate(values)]
    config = KnowledgeConfig(block_size=64, remainder="pad")
    first, second = "first.jsonl", "second.jsonl"
    expected = [
        (first, at[first, 2], DUPLICATE_NEAR, first, at[first, 0]),
        (second, at[second, 1], DUPLICATE_NEAR, first, at[first, 0]),
        (second, at[second, 2], DUPLICATE_EXACT, first, at[first, 0]),
        (second, at[second, 3], DUPLICATE_NEAR, first, at[first, 1]),
        (second, at[second, 5], DUPLICATE_EXACT, second, at[second, 4]),
        (second, at[second, 6], DUPLICATE_EXACT, first, at[first, 0]),
    ]
    with test_pipeline.TestPipeline() as p:
        found = p | FindDuplicateDocuments(plan_shards(specs), specs, 2, 1 << 20, config,
                                           DEFAULT_TOKENIZER, str(tmp_path))
        assert_that(drop_decisions(found, file_numbering(values)), equal_to(expected))
