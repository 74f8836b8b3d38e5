"""The benchmark inputs: the shared real data, cleaned once, replicated to the size asked for.

Every approach reads exactly these files, so token counts can be compared exactly.

* Knowledge documents: the pretraining text in ``../shared/data/pretrain`` (C4 records, one
  Wikipedia article per line, books and WikiText cut at paragraph breaks into pages of at least
  ``PAGE_CHARS`` characters, about the size of a web page). The text is already in the form a
  normaliser leaves (NFC, LF, no BOM, control or zero-width characters, Project Gutenberg header
  and footer removed, runs of spaces collapsed), so that cleaning inside the pipeline keeps the
  documents unchanged. Copy 0 is the corpus itself; copy k > 0 redistributes the corpus's
  sentences over the same documents with seed k. Plain copies would be dropped by the
  deduplication a pretraining branch must do, turning a 4x input into 1x of work; shuffled
  sentences keep the text real, its size and its token statistics.
* Instruction examples: Alpaca (``alpaca_en_demo``), GSM8K train (question -> answer) and the chat
  files whose messages are plain text (ShareGPT ``fastchat`` and OpenAI ``kto`` messages), adapted
  by the project's own adapters into OpenAI ``messages`` records and written as JSONL, which both
  TRL and the pipeline read. Examples longer than ``seq_len`` are left out, because the pipeline
  filters them while TRL's packing truncates them: both must see the same examples. The
  tool-calling chat files are left out too: ``datasets`` merges every tool's JSON schema into one
  Arrow struct, so TRL would render ``null`` for every field another tool has.
  Copies are exact (the instruction branch does not deduplicate).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import math
import random
import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from transforms.core.tokenizer import load_tokenizer
from transforms.curation.pii import PiiConfig, redact, redact_value
from transforms.instruction.adapters import to_conversation

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PAGE_CHARS = 4000
FILES_PER_COPY = 4  # input files per copy, so two workers always have shards to share
ROW_GROUP_DOCS = 256
INSTRUCTION_FILES = (
    ("instruction/alpaca_en_demo.json", None),
    ("math/gsm8k_train.jsonl", {"prompt": "question", "response": "answer"}),
    ("chat/fastchat_dummy_conversation.json", None),
    ("chat/kto_en_demo_messages.json", None),
)
_GUTENBERG = re.compile(r"^\*\*\* ?START OF.*?\*\*\*$(.*)^\*\*\* ?END OF", re.M | re.S)
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u200b-\u200d\u2060\ufeff]")
_SPACES = re.compile(r"[^\S\n]+")
_SENTENCE = re.compile(r".+?(?:[.!?](?=\s)|\n|$)\s*", re.S)
_CODE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]


@dataclasses.dataclass(frozen=True)
class Inputs:
    """One data set at one size: its files, in order, and how many records they hold."""

    files: tuple[str, ...]
    records: int


def clean(text: str) -> str:
    """The form the branch's text-changing steps leave: the normaliser's (NFC, LF, single
    spaces, no invisibles), with personal data already replaced by its placeholders, so that
    the output check can compare the blocks with the ceiling's tokens of these very texts."""
    text = _INVISIBLE.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    lines = (_SPACES.sub(" ", line).strip() for line in text.split("\n"))
    normal = unicodedata.normalize("NFC", re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip())
    return redact(normal, PiiConfig())[0]


def _pages(text: str) -> Iterator[str]:
    """Consecutive paragraphs joined until a page holds at least ``PAGE_CHARS`` characters."""
    page: list[str] = []
    size = 0
    for paragraph in text.split("\n\n"):
        page.append(paragraph)
        size += len(paragraph)
        if size >= PAGE_CHARS:
            yield "\n\n".join(page)
            page, size = [], 0
    if page:
        yield "\n\n".join(page)


def base_documents(data: Path = SHARED_DATA) -> list[str]:
    """Copy 0 of the knowledge corpus, in a fixed order."""
    documents: list[str] = []
    for path in sorted((data / "pretrain").iterdir()):
        raw = path.read_text(encoding="utf-8-sig")
        if path.suffix == ".jsonl":
            texts = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
        elif "wiki_demo" in path.name:  # one article per line
            texts = raw.splitlines()
        else:
            match = _GUTENBERG.search(raw)
            texts = list(_pages(clean(match.group(1) if match else raw)))
        documents.extend(doc for doc in map(clean, texts) if doc)
    return documents


def reshuffled(documents: Sequence[str], seed: int) -> list[str]:
    """The same documents' sentences dealt out again: each document keeps its sentence count.
    A copy is one paragraph: a long sentence that stood alone would otherwise stand alone in
    many copies, and boilerplate removal would rightly take it out of all but the first."""
    pieces = [_SENTENCE.findall(doc) for doc in documents]
    pool = [s.strip() + " " for doc in pieces for s in doc]
    random.Random(seed).shuffle(pool)
    out, start = [], 0
    for doc in pieces:
        out.append(clean("".join(pool[start:start + len(doc)])))
        start += len(doc)
    return out


def base_examples(seq_len: int, chat_template: Path, data: Path = SHARED_DATA) -> list[dict]:
    """The instruction examples as ``{"messages": [...]}`` records that fit in ``seq_len``."""
    tokenizer = load_tokenizer()
    examples = []
    for name, field_map in INSTRUCTION_FILES:
        path = data / name
        if path.suffix == ".jsonl":
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        else:
            records = json.loads(path.read_text())
        for record in records:
            mapped = ({canonical: record[field] for canonical, field in field_map.items()}
                      if field_map else record)
            # In the form redaction leaves them, as the documents are (``clean``): the check
            # compares our tokens with TRL's on these very messages.
            messages = list(to_conversation(mapped).messages)
            examples.append({"messages": redact_value(messages, PiiConfig(),
                                                      collections.Counter())})
    lengths = [len(ids) for ids in tokenizer.apply_chat_template(
        [e["messages"] for e in examples], chat_template=chat_template.read_text(),
        tokenize=True, return_dict=True)["input_ids"]]
    return [e for e, n in zip(examples, lengths, strict=True) if n <= seq_len]


def _take(items: Sequence, fraction: float) -> list:
    """An evenly spread ``fraction`` of ``items``, in order (all of them for 1.0)."""
    count = max(1, round(len(items) * fraction))
    return [items[i * len(items) // count] for i in range(count)]


def _split(items: Sequence, parts: int) -> list[list]:
    bounds = [len(items) * i // parts for i in range(parts + 1)]
    return [list(items[a:b]) for a, b in itertools.pairwise(bounds) if b > a]


def _copies(scale: float) -> Iterator[tuple[int, float]]:
    """(copy number, fraction of it) for ``scale`` copies: 2.5 -> (0, 1), (1, 1), (2, 0.5)."""
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    for copy in range(math.ceil(scale)):
        yield copy, min(1.0, scale - copy)


def _cached(directory: Path, write: Callable[[Path], list[tuple[str, int]]]) -> Inputs:
    """Writes a data set once; the directory name carries a digest of this module's code."""
    listing = directory / "files.json"
    if not listing.exists():
        directory.mkdir(parents=True, exist_ok=True)
        listing.write_text(json.dumps(write(directory)))
    files = json.loads(listing.read_text())
    return Inputs(tuple(str(directory / name) for name, _ in files), sum(n for _, n in files))


def knowledge(root: Path, scale: float) -> Inputs:
    """``scale`` copies of the knowledge documents as Parquet (column ``text``)."""

    def write(directory: Path) -> list[tuple[str, int]]:
        documents, files = base_documents(), []
        for copy, fraction in _copies(scale):
            docs = _take(documents if copy == 0 else reshuffled(documents, copy), fraction)
            for part, texts in enumerate(_split(docs, FILES_PER_COPY)):
                name = f"knowledge-{copy:03d}-{part}.parquet"
                pq.write_table(pa.table({"text": pa.array(texts, pa.string())}),
                               directory / name, row_group_size=ROW_GROUP_DOCS,
                               compression="zstd")
                files.append((name, len(texts)))
        return files

    return _cached(root / f"knowledge-x{scale:g}-{_CODE_DIGEST}", write)


def instruction(root: Path, scale: float, seq_len: int, chat_template: Path) -> Inputs:
    """``scale`` copies of the instruction examples as JSONL ``messages`` records."""

    def write(directory: Path) -> list[tuple[str, int]]:
        examples, files = base_examples(seq_len, chat_template), []
        for copy, fraction in _copies(scale):
            for part, records in enumerate(_split(_take(examples, fraction), FILES_PER_COPY)):
                name = f"instruction-{copy:03d}-{part}.jsonl"
                with open(directory / name, "w", encoding="utf-8") as f:
                    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
                files.append((name, len(records)))
        return files

    template = hashlib.sha256(chat_template.read_bytes()).hexdigest()[:8]
    return _cached(root / f"instruction-x{scale:g}-seq{seq_len}-{template}-{_CODE_DIGEST}", write)
