"""KnowledgeBranch on its own: record chunks in, pretraining blocks and dropped documents out.

Every document's tokens end in blocks of exactly ``block_size`` (less the dropped remainder), a
document that fails a quality rule is filtered with its reason, and the counters add up.
"""

import apache_beam as beam
import numpy as np
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import EXAMPLES
from transforms.core.records import Record, RecordChunk
from transforms.core.steps import TailPlan
from transforms.core.tokenizer import DEFAULT_TOKENIZER, end_of_text_id, load_tokenizer
from transforms.core.vocabulary import FILTERED, TOO_FEW_WORDS
from transforms.knowledge.branch import PRETRAIN, KnowledgeBranch
from transforms.knowledge.dedup.config import DedupConfig
from transforms.knowledge.dedup.first_pass import SecondRead
from transforms.knowledge.options import KnowledgeConfig

BLOCK = 256


def documents() -> list[str]:
    """Paragraphs of the bundled Shakespeare excerpt, and one too short to keep."""
    text = (EXAMPLES / "tinyshakespeare_excerpt.txt").read_text(encoding="utf-8")
    return [*[p for p in text.split("\n\n") if len(p.split()) > 20][:40], "Too short."]


def test_documents_become_blocks_and_the_short_one_is_filtered(tmp_path):
    texts = documents()
    chunk = RecordChunk("0000-0000", tuple(Record(source="s", position=k, input_index=0,
                                                  value=text) for k, text in enumerate(texts)))
    config = KnowledgeConfig(block_size=BLOCK, remainder="drop", normalize=None,
                             dedup=DedupConfig(mode="none"), boilerplate=None)
    tok = load_tokenizer(DEFAULT_TOKENIZER)
    kept = [tok(t, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            + [end_of_text_id(tok)] for t in texts[:-1]]
    stream = np.concatenate(kept)
    blocks = stream[: len(stream) // BLOCK * BLOCK].reshape(-1, BLOCK).tolist()
    branch = KnowledgeBranch(DEFAULT_TOKENIZER, config, TailPlan(1, str(tmp_path / "tails")),
                             SecondRead((), (), 1, 1, str(tmp_path / "staging")))
    with test_pipeline.TestPipeline() as p:
        parts, stats = p | beam.Create([chunk]) | branch
        tables = parts | beam.Flatten()
        rows = (tables | beam.Filter(lambda part: part.kind == PRETRAIN)
                | beam.FlatMap(lambda part: part.table.column("input_ids").to_pylist()))
        assert_that(rows, equal_to(blocks), label="blocks")
        dropped = (tables | "Filtered" >> beam.Filter(lambda part: part.kind == FILTERED)
                   | beam.FlatMap(lambda part: zip(part.table.column("reason").to_pylist(),
                                                   part.table.column("position").to_pylist(),
                                                   strict=True)))
        assert_that(dropped, equal_to([(TOO_FEW_WORDS, len(texts) - 1)]), label="filtered")
        # Per-file counters (dicts keyed by file) ride in the same stream; only totals add up.
        totals = (stats | beam.FlatMap(dict.items)
                  | beam.Filter(lambda kv: kv[0] in ("knowledge.documents", "knowledge.blocks"))
                  | beam.CombinePerKey(sum))
        assert_that(totals,
                    equal_to([("knowledge.documents", len(kept)),
                              ("knowledge.blocks", len(blocks))]), label="counts")
