"""OUTPUT/report.html: one self-contained page that shows a run's data as distributions.

Data engineers judge a training set by looking at it: what was dropped and why, how long the
records are, how much of each example is trained, how full the packs are, whether the mix hit
its targets. The page is built from ``manifest.json`` and the Parquet outputs alone (read a row
group at a time into fixed histograms, so memory does not grow with the data), with plots
embedded as SVG images (``charts.py``): it opens with no network and runs no script.

    python -m beam_pipeline.report OUTPUT     # rebuilds OUTPUT/report.html and OUTPUT/README.md
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import html
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from beam_pipeline.card import write_card
from beam_pipeline.charts import Panel, figure
from transforms.core.lengths import SHORT_REPLY_TOKENS
from transforms.core.steps import base_kind
from transforms.core.vocabulary import BOILERPLATE_TOO_SHORT, IGNORE_INDEX
from transforms.io.earlier_runs import REPORT_NAME, REPORT_TAG, check_card_place
from transforms.io.manifest import read_manifest

# (id, title): every section is always present; one without data says why.
SECTIONS = (
    ("overview", "Overview"),
    ("records", "Records in, kept, filtered and rejected"),
    ("lengths", "Token lengths"),
    ("trained-share", "Trained-token share per SFT example"),
    ("packing", "Pack fill and segments per pack"),
    ("mixing", "Mixing shares against targets"),
    ("personal-data", "Personal data and secrets"),
    ("boilerplate", "Boilerplate shared across documents"),
    ("languages", "Languages of knowledge documents"),
    ("quality-scores", "Quality model scores"),
    ("domains", "Domains of documents' URLs"),
    ("validation", "Validation, decontamination and conversation copies"),
    ("tokenizer", "Tokenizer"),
)
SHARE_BINS = np.linspace(0.0, 1.0, 21)  # trained share and pack fill, in 5% steps
LENGTH_BINS = 32  # SFT example lengths: equal bins from 0 to seq_len
COLORS = {"kept": "#4c9a2a", "filtered": "#e0a030", "rejected": "#c0392b",
          "target": "#999999", "share": "#2e6fb0"}


# --------------------------------------------------------------------------- reading outputs


@dataclasses.dataclass
class PackStats:
    """Fixed-size histograms of one packed-sequence output (``sft/`` or ``validation/sft``)."""

    seq_len: int
    packs: int = 0
    examples: int = 0
    tokens: int = 0  # example tokens, pad segments excluded
    trained: int = 0  # tokens that carry loss
    pad_segments: int = 0
    example_lengths: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(LENGTH_BINS, np.int64))
    trained_share: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(len(SHARE_BINS) - 1, np.int64))
    fill: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(len(SHARE_BINS) - 1, np.int64))
    segments_per_pack: collections.Counter = dataclasses.field(
        default_factory=collections.Counter)

    @property
    def length_edges(self) -> np.ndarray:
        return np.linspace(0, self.seq_len, LENGTH_BINS + 1)

    def add(self, batch: pa.RecordBatch) -> None:
        """One batch of packed rows: a segment is one example, unless it carries no trained
        token at all, which only a pad segment does (such examples are dropped upstream)."""
        seq = batch.column("seq_lengths")
        segments = seq.flatten().to_numpy().astype(np.int64)
        per_row = pc.list_value_length(seq).to_numpy(zero_copy_only=False).astype(np.int64)
        trained = (batch.column("labels").flatten().to_numpy() != IGNORE_INDEX).astype(np.int64)
        if not len(segments):
            return
        starts = np.concatenate(([0], np.cumsum(segments)[:-1]))
        trained_per_segment = np.add.reduceat(trained, starts)
        real = trained_per_segment > 0
        row_of_segment = np.repeat(np.arange(len(per_row)), per_row)
        real_tokens = np.bincount(row_of_segment, weights=segments * real,
                                  minlength=len(per_row))
        self.packs += len(per_row)
        self.examples += int(real.sum())
        self.tokens += int(segments[real].sum())
        self.trained += int(trained.sum())
        self.pad_segments += int((~real).sum())
        self.example_lengths += np.histogram(segments[real], self.length_edges)[0]
        self.trained_share += np.histogram(trained_per_segment[real] / segments[real],
                                           SHARE_BINS)[0]
        self.fill += np.histogram(real_tokens / self.seq_len, SHARE_BINS)[0]
        self.segments_per_pack.update(
            np.bincount(row_of_segment[real], minlength=len(per_row)).tolist())


def _batches(paths: Sequence[str], columns: list[str]) -> Iterator[pa.RecordBatch]:
    """One row group at a time: ``iter_batches`` reads ahead, and its memory grew with the
    file (bench/bench_data_report.py), while row groups are as small as the outputs make them
    (``--row_group_rows``)."""
    for path in paths:
        with FileSystems.open(path) as handle:
            parquet = pq.ParquetFile(handle, pre_buffer=False)
            for index in range(parquet.metadata.num_row_groups):
                yield from parquet.read_row_group(index, columns=columns).to_batches()


def scan_packs(paths: Sequence[str], seq_len: int) -> PackStats:
    stats = PackStats(seq_len)
    for batch in _batches(paths, ["labels", "seq_lengths"]):
        stats.add(batch)
    return stats


def scan_blocks(paths: Sequence[str]) -> collections.Counter:
    """Document pieces per pretraining block: 1 means one document filled the whole block."""
    pieces: collections.Counter = collections.Counter()
    for batch in _batches(paths, ["seq_lengths"]):
        lengths = pc.list_value_length(batch.column("seq_lengths"))
        pieces.update(lengths.to_numpy(zero_copy_only=False).tolist())
    return pieces


def _paths(output_dir: str, manifest: Mapping, kind: str) -> list[str]:
    """The files the manifest lists of ``kind`` and its partitions, found under
    ``output_dir`` wherever the run wrote them, so a copied or downloaded output folder reports
    on itself."""
    return [FileSystems.join(output_dir, listed, FileSystems.split(entry["path"])[1])
            for listed, entries in manifest["outputs"].items() if base_kind(listed) == kind
            for entry in entries]


# --------------------------------------------------------------------------- plots


def _figure(draw, width: float = 7.5, height: float = 3.0, columns: int = 1) -> str:
    """Draws with ``draw(panels...)`` and returns an <img> holding the SVG."""
    panels = [Panel() for _ in range(columns)]
    draw(*panels)
    data = base64.b64encode(figure(panels, width, height).encode()).decode("ascii")
    return f'<img class="plot" alt="" src="data:image/svg+xml;base64,{data}">'


def _bars(panel: Panel, labels: Sequence[str], values: Sequence[float], title: str,
          color: str, xlabel: str = "") -> None:
    """Upright bars of counts, one per category."""
    panel.bars(labels, values, color)
    panel.whole_y = True
    panel.title, panel.xlabel = title, xlabel


def _hbars(panel: Panel, labels: Sequence[str], values: Sequence[float], title: str,
           color: str | Sequence[str], xlabel: str, counts: bool = True) -> None:
    """Lying bars, the first label on top: for names too long or too many to stand under
    upright bars (reasons, sources, domains). Counts are ticked on whole numbers."""
    panel.hbars(labels, values, color)
    panel.whole_x = counts
    panel.title, panel.xlabel = title, xlabel


MAX_COUNT_BARS = 60  # above this many distinct values, counts are binned in equal integer widths


def _count_bars(panel: Panel, counts: Mapping[int, int], title: str, color: str,
                xlabel: str) -> None:
    """How many rows have each value of an integer quantity, on a numeric x axis: a bar per
    value while they are few, bins of equal integer width once hundreds of values would make
    one bar per value (or one label per category) unreadable."""
    values = np.fromiter(counts.keys(), np.int64, len(counts))
    rows = np.fromiter(counts.values(), np.int64, len(counts))
    low, span = int(values.min()), int(values.max() - values.min()) + 1
    width = math.ceil(span / MAX_COUNT_BARS)
    edges = low - 0.5 + width * np.arange(math.ceil(span / width) + 1)  # values mid-bin
    heights = np.histogram(values, edges, weights=rows)[0]
    panel.columns(edges[:-1].tolist(), heights.tolist(), width, color)
    panel.whole_x = True
    panel.title = title if width == 1 else f"{title} (bins of {width})"
    panel.xlabel = xlabel


def _share_labels() -> list[str]:
    """Each bin by its upper bound in percent, every other one named so the labels fit."""
    return [f"{round(hi * 100)}" if i % 2 else "" for i, hi in enumerate(SHARE_BINS[1:])]


# --------------------------------------------------------------------------- sections


def _table(header: Sequence[str] | None, rows: Sequence[Sequence[Any]]) -> str:
    """A table; without ``header``, a two-column list of names and values."""
    head = ("" if header is None else "<thead><tr>" + "".join(
        f"<th>{html.escape(str(h))}</th>" for h in header) + "</tr></thead>")
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>"
                   for row in rows)
    return f"<table>{head}<tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return html.escape(str(value))
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.2%}" if value <= 1 else f"{value:,.1f}"
    return html.escape(str(value))


def _none(why: str) -> str:
    return f'<p class="none">{html.escape(why)}</p>'


def _overview(manifest: Mapping, sft: PackStats) -> str:
    records, know, inst = manifest["records"], manifest["knowledge"], manifest["instruction"]
    rows = [
        ("records read", records["read"]),
        ("kept in the knowledge branch (validation included)", records["knowledge"]),
        ("kept in the instruction branch (validation included)", records["instruction"]),
        ("filtered by policy", sum(records["filtered"].values())),
        ("rejected as bad input", sum(records["rejected"].values())),
        ("every record accounted for", records["balanced"]),
        ("pretraining blocks", f"{know['blocks']:,} of {know['block_size']} tokens"),
        ("SFT packs", f"{inst['packs']:,} of at most {inst['seq_len']} tokens"),
        ("SFT examples written", f"{sft.examples:,}: {sft.tokens:,} tokens, "
                                 f"{sft.trained:,} trained"),
        ("created", manifest.get("created_at", "")),
    ]
    warnings = "".join(f'<p class="warning">warning: {html.escape(w)}</p>'
                       for w in manifest.get("warnings", []))
    return warnings + _table(None, rows)


def _records(manifest: Mapping) -> str:
    records = manifest["records"]
    reasons = ([(k, v, "rejected") for k, v in records["rejected"].items()]
               + [(k, v, "filtered") for k, v in records["filtered"].items()])
    reasons.sort(key=lambda r: -r[1])
    parts = []
    if reasons:
        def by_reason(panel):
            _hbars(panel, [r[0] for r in reasons], [r[1] for r in reasons],
                   "records dropped, by reason (red: rejected, amber: filtered)",
                   [COLORS[r[2]] for r in reasons], "records")
        parts.append(_figure(by_reason, height=0.6 + 0.25 * len(reasons)))
    inputs = manifest["inputs"]
    names = [_source_name(entry) for entry in inputs]
    rejected = [sum(e["rejected"].values()) for e in inputs]
    filtered = [sum(e["filtered"].values()) for e in inputs]
    kept = [e["read"] - r - f for e, r, f in zip(inputs, rejected, filtered, strict=True)]

    def by_input(panel):
        left = np.zeros(len(inputs))
        for label, values in (("kept", kept), ("filtered", filtered), ("rejected", rejected)):
            panel.hbars(names, values, COLORS[label], starts=left.tolist(), key=label)
            left += values
        panel.whole_x = True
        panel.title, panel.xlabel, panel.legend = "records by input", "records", "lower right"
    parts.append(_figure(by_input, height=0.9 + 0.3 * len(inputs)))
    rows = [(e["pattern"], e.get("name") or "", e["read"], k, f, r,
             _reasons({**e["rejected"], **e["filtered"]}), e.get("file_count", ""),
             _reasons(e.get("skipped", {})))
            for e, k, f, r in zip(inputs, kept, filtered, rejected, strict=True)]
    parts.append(_table(("input", "name", "read", "kept", "filtered", "rejected", "reasons",
                         "files", "files skipped"), rows))
    # Per file, where an input of several files rejected records: the manifest lists the
    # most rejected first.
    files = [(e["pattern"], f["path"], f["read"], f["kept"], sum(f["filtered"].values()),
              sum(f["rejected"].values()), _reasons({**f["rejected"], **f["filtered"]}))
             for e in inputs for f in e.get("files", []) if f["rejected"]]
    if files:
        parts.append(_table(("input", "file", "read", "kept", "filtered", "rejected",
                             "reasons"), files))
    return "".join(parts)


def _source_name(entry: Mapping) -> str:
    """An input as the charts name it: its ``name``, or its pattern's last part."""
    return entry.get("name") or FileSystems.split(entry["pattern"])[1]


def _reasons(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in counts.items())


def _histogram_labels(histogram: Mapping[str, int]) -> tuple[list[str], list[int]]:
    return [key.removeprefix("<=") for key in histogram], list(histogram.values())


def _sft_lengths(panel: Panel, sft: PackStats) -> None:
    """SFT example lengths with a marker at ``seq_len``, where truncated examples pile up.
    The count axis is logarithmic: a few long conversations beside thousands of short ones
    would otherwise be invisible bars. The length axis stays linear, in equal bins up to
    ``seq_len``, so that the room left below the marker reads as tokens."""
    if not sft.examples:
        panel.title = "SFT: no examples"
        return
    edges = sft.length_edges
    panel.columns(edges[:-1].tolist(), sft.example_lengths.tolist(), np.diff(edges).tolist(),
                  COLORS["kept"])
    panel.mark(sft.seq_len, COLORS["rejected"], f"seq_len {sft.seq_len:,}")
    panel.log_y = True
    panel.title = f"SFT examples as packed ({sft.examples:,})"
    panel.xlabel, panel.ylabel = "tokens", "examples (log)"


def _lengths(manifest: Mapping, sft: PackStats) -> str:
    parts = []
    know = manifest["knowledge"]["document_tokens"]
    if know["histogram"] or sft.examples:
        def per_branch(knowledge, packed):
            if know["histogram"]:
                labels, values = _histogram_labels(know["histogram"])
                _bars(knowledge, labels, values, "knowledge documents (tokens, up to)",
                      COLORS["share"], "tokens")
            else:
                knowledge.title = "knowledge: no documents"
            _sft_lengths(packed, sft)
        parts.append(_figure(per_branch, columns=2))
    sources = [(_source_name(e), branch, found)
               for e in manifest["inputs"]
               for branch, found in e.get("tokenized", {}).items()]
    if sources:
        def per_source(panel):
            bounds = sorted({int(k.removeprefix("<=")) for _, _, f in sources
                             for k in f["histogram"]})
            for name, branch, found in sources:
                counts = [found["histogram"].get(f"<={b}", 0) for b in bounds]
                total = sum(counts) or 1
                panel.line([c / total for c in counts], dashed=branch != "knowledge",
                           key=f"{name} ({branch})")
            panel.x_labels = [str(b) for b in bounds]
            panel.xlabel, panel.ylabel = "tokens, up to", "share of the source's records"
            # wider than the frame, which leaves room for the legend
            panel.title = "length distribution per source (solid: knowledge, dashed: instruction)"
            panel.title_left, panel.legend, panel.legend_font = True, "outside", 7
        parts.append(_figure(per_source, height=3.4))
        parts.append(_table(("source", "branch", "records tokenized", "tokens", "mean"), [
            (name, branch, f["records"], f["tokens"],
             round(f["tokens"] / f["records"], 1) if f["records"] else None)
            for name, branch, f in sources]))
    rows = [("knowledge documents", know["min"], know["mean"], know["max"])]
    parts.append(_table(("", "min", "mean", "max"), rows))
    return "".join(parts) or _none("no tokens were produced")


def _trained_share(manifest: Mapping, sft: PackStats) -> str:
    if not sft.examples:
        return _none("no SFT examples were written")

    def draw(panel):
        _bars(panel, _share_labels(), sft.trained_share, "examples by share of their tokens "
              "that carry loss", COLORS["share"], "% of the example's tokens trained (up to)")
    methods = ", ".join(f"{k} {v:,}" for k, v in manifest["instruction"]["mask_methods"].items()
                        if v)
    return _figure(draw) + _table(None, [
        ("trained tokens of all SFT tokens written", sft.trained / sft.tokens),
        ("loss-mask methods used", methods or "none")]) + _sft_sources(manifest)


def _sft_sources(manifest: Mapping) -> str:
    """Per ``--input``, the share of its tokens that carry loss and its examples truncated at
    ``seq_len``: a source that trains on little of its text, or loses its long conversations,
    stands out. Counted as tokenized, before the validation split and mixing."""
    # Manifests written before the per-input truncation counters lack them: none counted.
    sources = [(_source_name(e), {"truncated": 0, "truncated_tokens": 0,
                                  **e["tokenized"]["instruction"]})
               for e in manifest["inputs"] if "instruction" in e.get("tokenized", {})]
    if not sources:
        return ""
    names = [name for name, _ in sources]

    def draw(trained, truncated):
        _hbars(trained, names, [100 * f["trained_tokens"] / f["tokens"] for _, f in sources],
               "trained share of each source's tokens", COLORS["share"], "% of tokens",
               counts=False)
        _hbars(truncated, names, [100 * f["truncated"] / f["records"] for _, f in sources],
               "truncated at seq_len", COLORS["rejected"], "% of the source's examples",
               counts=False)
    rows = [(name, f["records"], f["tokens"], f["trained_tokens"],
             f["trained_tokens"] / f["tokens"], f["truncated"], f["truncated_tokens"],
             f["short_replies"]) for name, f in sources]
    return (_figure(draw, height=0.9 + 0.3 * len(sources), columns=2)
            + _table(("source", "examples", "tokens", "trained tokens", "trained share",
                      "truncated", "tokens cut", f"replies of <= {SHORT_REPLY_TOKENS} tokens"),
                     rows))


def _packing(manifest: Mapping, sft: PackStats, pieces: collections.Counter) -> str:
    parts = []
    if sft.packs:
        def draw(fill, segments):
            _bars(fill, _share_labels(), sft.fill, "packs by fill", COLORS["kept"],
                  "% of seq_len holding example tokens (up to)")
            _count_bars(segments, sft.segments_per_pack, "packs by examples per pack",
                        COLORS["share"], "examples")
        parts.append(_figure(draw, columns=2))
    else:
        parts.append(_none("no SFT packs were written"))
    if pieces:
        def draw_blocks(panel):
            _count_bars(panel, pieces, "pretraining blocks by document pieces per block",
                        COLORS["share"], "pieces")
        parts.append(_figure(draw_blocks, height=2.6))
    inst, know = manifest["instruction"], manifest["knowledge"]
    parts.append(_table(None, [
        ("SFT packing efficiency", inst["packing_efficiency"]),
        ("SFT packs (lower bound)", f"{inst['packs']:,} ({inst['packs_lower_bound']:,})"),
        ("SFT pad tokens", inst["pad_tokens"]),
        ("SFT examples truncated (tokens cut)",
         f"{inst['truncated']:,} ({inst['truncated_tokens']:,})"),
        ("pretraining remainder tokens dropped", know["remainder_tokens"]),
        ("pretraining pad tokens", know["pad_tokens"])]))
    return "".join(parts)


def _mixing(manifest: Mapping) -> str:
    mixing = manifest.get("mixing")
    if not mixing:
        return _none("no input declared a weight, so the sources were not mixed")
    branches = [b for b in ("knowledge", "instruction") if b in mixing]

    def draw(*panels):
        for panel, branch in zip(panels, branches, strict=True):
            names = list(mixing[branch])
            panel.bars(names, [mixing[branch][n]["target_share"] or 0 for n in names],
                       COLORS["target"], shift=-0.2, width=0.4, key="target")
            panel.bars(names, [mixing[branch][n]["share"] for n in names], COLORS["share"],
                       shift=0.2, width=0.4, key="reached")
            panel.title = f"{branch}: share of tokens"
    rows = [(branch, name, s["target_share"], s["share"], s["records_in"], s["records_out"],
             s["tokens_in"], s["tokens_out"])
            for branch in branches for name, s in mixing[branch].items()]
    return (_figure(draw, columns=len(branches))
            + f"<p>scale {html.escape(str(mixing['scale']))}, seed "
              f"{html.escape(str(mixing['seed']))}</p>"
            + _table(("branch", "source", "target", "reached", "records in", "records out",
                      "tokens in", "tokens out"), rows))


def _personal_data(manifest: Mapping) -> str:
    """What ``--pii`` found, by kind: spans, and the documents and examples holding any."""
    pii = manifest.get("personal_data") or {}
    if pii.get("mode") in (None, "off"):
        return _none("personal data was not looked for (--pii=off)")
    know, inst = pii["knowledge"], pii["instruction"]
    rows = [(kind, know["by_kind"].get(kind, 0), inst["by_kind"].get(kind, 0))
            for kind in pii["kinds"]]
    rows.append(("documents / examples holding any", know["records"], inst["records"]))
    what = ("replaced with placeholders" if pii["mode"] == "redact"
            else "counted and left in place (--pii=tag)")
    return (f"<p>{html.escape(what)}</p>"
            + _table(("kind", "knowledge", "instruction"), rows))


def _boilerplate(manifest: Mapping) -> str:
    """What boilerplate removal took out of the documents it kept, and the documents it left
    too short to keep."""
    if not manifest["config"]["knowledge"].get("boilerplate"):
        return _none("boilerplate was not looked for (--boilerplate=false or --tokenize_only)")
    removed = manifest["knowledge"]["boilerplate"]
    too_short = manifest["knowledge"]["dropped"].get(BOILERPLATE_TOO_SHORT, 0)
    rows = [(name.replace("_", " "), count) for name, count in removed.items()]
    rows.append((f"documents left too short ({BOILERPLATE_TOO_SHORT})", too_short))
    return _table(("", "count"), rows)


LANGUAGES_DRAWN = 20


def _languages(manifest: Mapping) -> str:
    """Documents and tokens per language (the ``LANGUAGES_DRAWN`` with the most tokens), with
    a table of all: many short documents of a language weigh little in tokens."""
    languages = manifest.get("languages") or {}
    found = languages.get("by_language") or {}
    if not found:
        return _none("languages were not identified (--language_id=false) or no knowledge "
                     "document was kept")
    drawn = list(found.items())[:LANGUAGES_DRAWN]

    def draw(*panels):
        for panel, metric in zip(panels, ("documents", "tokens"), strict=True):
            _bars(panel, [code for code, _ in drawn], [c[metric] for _, c in drawn],
                  f"{metric} per language (log)", COLORS["kept"])
            panel.log_y = True

    selected = languages.get("selected")
    filtered = (f"<p>kept only {html.escape(','.join(selected))} with score >= "
                f"{languages['min_score']}; filtered: "
                + ", ".join(f"{html.escape(k)} {v:,}" for k, v in languages["filtered"].items())
                + "</p>" if selected else "")
    return (_figure(draw, columns=2) + filtered
            + _table(("language", "documents", "tokens"),
                     [(code, c["documents"], c["tokens"]) for code, c in found.items()]))


def _quality_scores(manifest: Mapping) -> str:
    """Each ``--quality_model``'s histogram of scores per branch, the threshold marked, and a
    table of what each scored and filtered."""
    found = [(branch, name, entry)
             for branch, models in (manifest.get("quality_scores") or {}).items()
             for name, entry in models.items() if entry["scored"]]
    if not found:
        return _none("no --quality_model was given, or it scored no record")
    plots = []
    for branch, name, entry in found:
        edges = [float(edge) for edge in entry["histogram"]]
        counts = list(entry["histogram"].values())

        def draw(panel, edges=edges, counts=counts, branch=branch, name=name, entry=entry):
            panel.columns(edges, counts, entry["bin_width"], COLORS["share"])
            if entry["min_score"] is not None:
                panel.mark(entry["min_score"], COLORS["filtered"],
                           f"--min_quality_score {entry['min_score']:g}")
                panel.legend = "upper left"
            panel.whole_y = True
            panel.title, panel.xlabel = f"{name} scores of {branch} records", "score"

        plots.append(_figure(draw))
    return "".join(plots) + _table(
        ("branch", "model", "kind", "scored", "mean", "minimum", "filtered"),
        [(branch, name, entry["kind"], entry["scored"],
          "n/a" if entry["mean"] is None else f"{entry['mean']:.4f}",
          "none" if entry["min_score"] is None else f"{entry['min_score']:g}", entry["filtered"])
         for branch, name, entry in found])


def _domains(manifest: Mapping) -> str:
    """The domains with the most tokens kept and with the most documents dropped (the
    manifest keeps ``DOMAINS_LISTED`` of each, so the charts stay bounded)."""
    domains = manifest.get("domains") or {}
    if not domains.get("documents"):
        return _none("no knowledge document carried a URL (a 'url' field or #url=FIELD)")
    blocklist = (f"; {domains['blocklisted']:,} filtered by --url_blocklist"
                 if domains["blocklist"] else "")
    head = (f"<p>{domains['documents']:,} documents from {domains['distinct']:,} domains, "
            f"{domains['kept']:,} kept with {domains['tokens']:,} tokens{blocklist}.</p>")
    # (ranking, title, what it ranks by, colour): one is not empty, as some document was read
    rankings = [(key, title, metric, color) for key, title, metric, color in (
        ("top_kept", "Most tokens kept", "tokens", COLORS["kept"]),
        ("top_dropped", "Most documents dropped", "dropped", COLORS["filtered"]))
        if domains[key]]

    def draw(*panels):
        for panel, (key, title, metric, color) in zip(panels, rankings, strict=True):
            _hbars(panel, [e["domain"] for e in domains[key]], [e[metric] for e in domains[key]],
                   title.lower(), color, "tokens" if metric == "tokens" else "documents")
    longest = max(len(domains[key]) for key, *_ in rankings)
    columns = ("domain", "documents", "kept", "tokens kept", "dropped")
    tables = [f"<h3>{html.escape(title)}</h3>" + _table(columns, [
        (e["domain"], e["documents"], e["kept"], e["tokens"], e["dropped"])
        for e in domains[key]]) for key, title, *_ in rankings]
    return (head + _figure(draw, height=0.9 + 0.25 * longest, columns=len(rankings))
            + "".join(tables))


def _validation(manifest: Mapping, held_sft: PackStats) -> str:
    parts = []
    held = manifest.get("validation")
    if held:
        parts.append(_table(("split", "records", "tokens", "rows written"), [
            ("validation/pretrain", held["knowledge"]["documents"],
             held["knowledge"]["tokens"], held["knowledge"]["blocks"]),
            ("validation/sft", held["instruction"]["examples"],
             held["instruction"]["tokens"], held["instruction"]["packs"])]))
        if held_sft.packs:
            parts.append(f"<p>validation/sft read back: {held_sft.examples:,} examples in "
                         f"{held_sft.packs:,} packs</p>")
    else:
        parts.append(_none("no validation split was held out"))
    decontam = manifest.get("decontamination")
    if decontam:
        rows = [(pattern, counts.get("indexed", 0), counts.get("too_short", 0),
                 decontam["removed"]["knowledge"].get(pattern, 0),
                 decontam["removed"]["instruction"].get(pattern, 0))
                for pattern, counts in decontam["eval_texts"].items()]
        parts.append(f"<p>decontamination: {decontam['ngram']}-word n-grams, threshold "
                     f"{decontam['threshold']}</p>")
        parts.append(_table(("evaluation set", "texts indexed", "too short to check",
                             "knowledge removed", "instruction removed"), rows))
    else:
        parts.append(_none("no evaluation set was given, so nothing was decontaminated"))
    dedup = manifest["instruction"].get("dedup") or {}
    if dedup.get("mode", "none") != "none":
        dropped = ", ".join(f"{html.escape(reason)} {count:,}"
                            for reason, count in dedup["dropped"].items()) or "none"
        parts.append(f"<p>conversations deduplicated ({html.escape(dedup['mode'])}), dropped "
                     f"as copies: {dropped}</p>")
    return "".join(parts)


def _tokenizer(manifest: Mapping) -> str:
    config = manifest["config"]
    rows = [(k, v) for k, v in manifest["tokenizer"].items()]
    rows.append(("--tokenizer", config.get("tokenizer")))
    rows += [(f"package {k}", v) for k, v in manifest.get("versions", {}).items()]
    return _table(None, rows)


STYLE = """
body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:1.5em auto;max-width:60em;
color:#222;font-size:14px}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:2em}
.warning{color:#c0392b;font-weight:bold}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:2px 8px;
text-align:left;vertical-align:top}td{font-variant-numeric:tabular-nums}
img.plot{max-width:100%;display:block;margin:.5em 0}.none{color:#777;font-style:italic}
nav a{margin-right:1em}
"""


def build_report(output_dir: str) -> str:
    """The report's HTML, from OUTPUT/manifest.json and the files it lists."""
    manifest = read_manifest(output_dir)
    seq_len = manifest["instruction"]["seq_len"]
    sft = scan_packs(_paths(output_dir, manifest, "sft"), seq_len)
    held_sft = scan_packs(_paths(output_dir, manifest, "validation/sft"), seq_len)
    pieces = scan_blocks(_paths(output_dir, manifest, "pretrain"))
    bodies = {
        "overview": _overview(manifest, sft),
        "records": _records(manifest),
        "lengths": _lengths(manifest, sft),
        "trained-share": _trained_share(manifest, sft),
        "packing": _packing(manifest, sft, pieces),
        "mixing": _mixing(manifest),
        "personal-data": _personal_data(manifest),
        "boilerplate": _boilerplate(manifest),
        "languages": _languages(manifest),
        "quality-scores": _quality_scores(manifest),
        "domains": _domains(manifest),
        "validation": _validation(manifest, held_sft),
        "tokenizer": _tokenizer(manifest),
    }
    nav = "".join(f'<a href="#{key}">{html.escape(title)}</a>' for key, title in SECTIONS)
    sections = "".join(f'<section id="{key}"><h2>{html.escape(title)}</h2>{bodies[key]}'
                       "</section>" for key, title in SECTIONS)
    title = f"Data report: {output_dir}"
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{REPORT_TAG}'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><nav>{nav}</nav>{sections}</body></html>\n")


def write_report(output_dir: str) -> str:
    path = FileSystems.join(output_dir, REPORT_NAME)
    page = build_report(output_dir)
    with FileSystems.create(path) as handle:
        handle.write(page.encode("utf-8", "replace"))  # a lone surrogate from a URL
    return path


def publish(output_dir: str) -> str:
    """Writes the dataset card and the report; returns the line that names the report.
    Called at the end of a local run."""
    write_card(output_dir)
    return f"report: {write_report(output_dir)}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m beam_pipeline.report",
        description="Rebuild OUTPUT/report.html and the dataset card OUTPUT/README.md from a "
        "finished run's manifest.json and Parquet outputs.")
    parser.add_argument("output", metavar="OUTPUT", help="a run's output directory (local or "
                        "gs://), the one that holds manifest.json")
    args = parser.parse_args(argv)
    output = args.output.rstrip("/")
    if not FileSystems.exists(FileSystems.join(output, "manifest.json")):
        print(f"error: {output} holds no manifest.json (not a complete run)", file=sys.stderr)
        sys.exit(2)
    try:
        check_card_place(output)
        print(f"card: {write_card(output)}")
        print(f"report: {write_report(output)}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
