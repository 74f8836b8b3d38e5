"""The data report: written at the end of a run and named by the summary's last line, opened in
headless Chromium (no console errors, no request leaving the file, every section and every plot
shown, a screenshot kept), its figures checked against the Parquet outputs read independently,
and rebuilt from a copied output folder alone."""

import base64
import doctest
import json
import shutil
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_pipeline import report
from beam_pipeline.charts import EM_PER_CHAR, FONT, Panel, layout
from beam_pipeline.report import REPORT_NAME, SECTIONS, publish, scan_packs
from tests.support.browser import visit
from tests.support.report_run import curated_run
from transforms.core import lengths

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "out" / "test-artifacts"
PROBE = """({
  sections: [...document.querySelectorAll('section')]
    .map(s => [s.id, s.querySelector('h2').textContent]),
  images: [...document.images].map(i => [i.complete, i.naturalWidth]),
  scripts: document.scripts.length,
})"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return curated_run(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def page(prepared, tmp_path_factory):
    return visit(prepared.output / REPORT_NAME, PROBE, tmp_path_factory.mktemp("chromium"))


def test_the_summary_ends_with_the_line_that_names_the_report(prepared):
    assert prepared.printed[-1] == f"report: {prepared.output / REPORT_NAME}"
    assert prepared.printed[0].startswith("records read 1,066:")


def test_report_opens_in_headless_chromium_with_every_section(page):
    assert page.errors == []
    assert page.requests[0].startswith("file://")
    assert all(url.startswith("data:image/svg+xml;base64,") for url in page.requests[1:])
    assert [tuple(s) for s in page.facts["sections"]] == list(SECTIONS)
    images = page.facts["images"]
    assert len(images) >= 8 and all(done and width > 100 for done, width in images)
    assert page.facts["scripts"] == 0
    assert page.screenshot.startswith(b"\x89PNG\r\n\x1a\n")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.write_bytes(page.screenshot)
    print(f"screenshot of the report: {shot}")
    width, height = (int.from_bytes(page.screenshot[16 + 4 * i:20 + 4 * i], "big")
                     for i in range(2))
    assert width == 1280 and height > 3000  # the whole page, every plot and table


def _segments(path: Path) -> list[tuple[int, int]]:
    """(length, trained tokens) of every non-pad segment, row by row in Python."""
    found = []
    for row in pq.read_table(path).to_pylist():
        start = 0
        for length in row["seq_lengths"]:
            trained = sum(1 for label in row["labels"][start:start + length] if label != -100)
            if trained:
                found.append((length, trained))
            start += length
    return found


def test_pack_figures_match_the_parquet_read_row_by_row(prepared):
    manifest = prepared.manifest
    files = sorted((prepared.output / "sft").glob("*.parquet"))
    assert len(files) == 2
    stats = scan_packs([str(f) for f in files], manifest["instruction"]["seq_len"])
    segments = [s for f in files for s in _segments(f)]
    assert stats.packs == manifest["instruction"]["packs"]
    assert stats.examples == len(segments) == manifest["instruction"]["examples"]
    assert stats.tokens == sum(n for n, _ in segments) == manifest["instruction"]["packed_tokens"]
    assert stats.trained == sum(t for _, t in segments)
    expected_share = np.histogram([t / n for n, t in segments], report.SHARE_BINS)[0]
    assert stats.trained_share.tolist() == expected_share.tolist()
    assert stats.example_lengths.tolist() == np.histogram(
        [n for n, _ in segments], stats.length_edges)[0].tolist()
    assert sum(stats.fill) == stats.packs
    assert sum(k * v for k, v in stats.segments_per_pack.items()) == stats.examples
    assert stats.pad_segments == 0


def test_a_pad_segment_counts_as_padding_not_as_an_example():
    """Two packs of seq_len 10: [3 tokens, 2 trained | 2, 1 trained | 5 pad] and [10, 9]."""
    batch = pa.RecordBatch.from_pydict({
        "labels": [[-100, 7, 8, -100, 9] + [-100] * 5, [-100, *range(9)]],
        "seq_lengths": [[3, 2, 5], [10]]})
    stats = report.PackStats(seq_len=10)
    stats.add(batch)
    assert (stats.packs, stats.examples, stats.pad_segments, stats.tokens) == (2, 3, 1, 15)
    assert stats.trained == 2 + 1 + 9
    assert stats.fill.tolist() == np.histogram([0.5, 1.0], report.SHARE_BINS)[0].tolist()
    assert stats.trained_share.tolist() == np.histogram(
        [2 / 3, 1 / 2, 9 / 10], report.SHARE_BINS)[0].tolist()
    assert stats.segments_per_pack == {2: 1, 1: 1}


def test_report_tables_show_the_manifest(prepared):
    page = (prepared.output / REPORT_NAME).read_text()
    manifest = prepared.manifest
    for entry in manifest["inputs"]:
        assert f"<td>{entry['pattern']}</td><td>{entry.get('name') or ''}</td>" \
               f"<td>{entry['read']:,}</td>" in page
    for name in manifest["mixing"]["instruction"]:
        assert f"<td>instruction</td><td>{name}</td>" in page
    [(eval_set, removed)] = manifest["decontamination"]["removed"]["instruction"].items()
    assert removed == 20
    assert f"<td>{eval_set}</td><td>20</td><td>0</td><td>0</td><td>20</td>" in page
    assert f"<td>{manifest['tokenizer']['vocab_sha256']}</td>" in page


def test_report_is_rebuilt_from_a_copied_output_folder_alone(prepared, tmp_path, capsys):
    copy = tmp_path / "copied"
    shutil.copytree(prepared.output, copy)
    (copy / REPORT_NAME).unlink()
    report.main([str(copy)])  # what `python -m beam_pipeline.report COPY` runs
    assert capsys.readouterr().out.splitlines() == [f"card: {copy / 'README.md'}",
                                                    f"report: {copy / REPORT_NAME}"]
    original = (prepared.output / REPORT_NAME).read_text()
    assert (copy / REPORT_NAME).read_text() == original.replace(str(prepared.output), str(copy))


def test_the_report_needs_no_plotting_library(prepared, tmp_path, monkeypatch):
    """The charts are written as SVG by the report itself: with matplotlib unimportable a
    run still ends with a complete report and card."""
    copy = tmp_path / "no-plotting-library"
    shutil.copytree(prepared.output, copy)
    (copy / REPORT_NAME).unlink()
    (copy / "README.md").unlink()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    assert publish(str(copy)) == f"report: {copy / REPORT_NAME}"
    original = (prepared.output / REPORT_NAME).read_text()
    assert (copy / REPORT_NAME).read_text() == original.replace(str(prepared.output), str(copy))
    assert (copy / "README.md").is_file()


def test_report_command_refuses_a_folder_without_a_manifest(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        report.main([str(tmp_path)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: {tmp_path} holds no manifest.json "
                                       "(not a complete run)\n")


def test_report_command_leaves_a_readme_of_the_users_alone(prepared, tmp_path, capsys):
    copy = tmp_path / "theirs"
    shutil.copytree(prepared.output, copy)
    (copy / "README.md").write_text("# Our notes on this corpus\n")
    with pytest.raises(SystemExit) as stopped:
        report.main([str(copy)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"error: {copy / 'README.md'} is not a dataset card of this pipeline, and a run writes "
        "its card there; move the file, or choose another --output\n")
    assert (copy / "README.md").read_text() == "# Our notes on this corpus\n"


def test_length_counters_doctests():
    assert doctest.testmod(lengths).failed == 0


@pytest.fixture
def charts(monkeypatch):
    """The panels of every figure a section draws, kept instead of embedded."""
    drawn: list[list[Panel]] = []

    def keep(draw, width=7.5, height=3.0, columns=1):
        panels = [Panel() for _ in range(columns)]
        draw(*panels)
        drawn.append(panels)
        return ""
    monkeypatch.setattr(report, "_figure", keep)
    return drawn


def _bars(panel: Panel) -> list[tuple[float, float, float]]:
    """(left, right, height) of each upright bar."""
    return [(r.x0, r.x1, r.y1 - r.y0) for r in panel.rects]


def _widths(panel: Panel) -> list[float]:
    """The length of each lying bar, top first."""
    return [r.x1 - r.x0 for r in panel.rects]


def _numeric_ticks(panel: Panel) -> list[float]:
    """The x tick labels as laid out, each of which must name its own position (not a
    category index)."""
    [(_, x, _)] = layout([panel], 540, 216)
    ticks = [(position, label.replace(",", "")) for position, label in x.ticks if label]
    assert ticks and all(float(text) == position for position, text in ticks)
    return [position for position, _ in ticks]


def test_counts_per_pack_and_per_block_stand_on_a_numeric_axis(prepared, charts):
    """A bar per value while the values are few; with hundreds of them, bins of equal width:
    the bars stay few and a pack of 317 examples stands at x=317."""
    drawn = charts
    few = report.PackStats(seq_len=1024, packs=11, segments_per_pack=Counter({1: 4, 2: 6, 9: 1}))
    many = Counter({k: 1 for k in range(1, 318)} | {3: 50})
    report._packing(prepared.manifest, few, many)
    [(_, per_pack), (per_block,)] = drawn
    assert [((left + right) / 2, height) for left, right, height in _bars(per_pack)] == [
        (value, few.segments_per_pack.get(value, 0)) for value in range(1, 10)]
    _numeric_ticks(per_pack)
    bars = _bars(per_block)
    assert len(bars) <= report.MAX_COUNT_BARS
    assert sum(height for *_, height in bars) == sum(many.values())
    [(_, _, last)] = [bar for bar in bars if bar[0] <= 317 <= bar[1]]
    assert last >= 1 and bars[0][0] < 1 and max(_numeric_ticks(per_block)) >= 300
    assert "(bins of 6)" in per_block.title


def test_sft_lengths_are_drawn_on_a_log_count_axis_with_a_marker_at_seq_len(prepared, charts):
    drawn = charts
    seq_len = prepared.manifest["instruction"]["seq_len"]
    sft = scan_packs([str(f) for f in (prepared.output / "sft").glob("*.parquet")], seq_len)
    report._lengths(prepared.manifest, sft)
    _, lengths = drawn[0]
    assert lengths.log_y and lengths.x_labels is None  # a numeric length axis
    assert [x for x, _ in lengths.marks] == [seq_len]
    assert [key.label for key in lengths.keys] == [f"seq_len {seq_len:,}"]
    assert sum(height for *_, height in _bars(lengths)) == sft.examples


def test_trained_share_and_truncation_per_source(prepared, charts):
    drawn = charts
    manifest = prepared.manifest
    sources = {e["name"]: e["tokenized"]["instruction"] for e in manifest["inputs"]
               if "instruction" in e["tokenized"]}
    assert set(sources) == {"alpaca", "sharegpt", "toolcall", "gsm8k"}
    # Counted where the run total is: the per-source counts add up to it.
    assert sum(f["truncated"] for f in sources.values()) == manifest["instruction"]["truncated"]
    truncated = json.loads(json.dumps(manifest))  # one source truncated, to see it drawn
    truncated["inputs"][3]["tokenized"]["instruction"].update(truncated=6, truncated_tokens=900)
    page = report._sft_sources(truncated)
    [(trained, cut)] = drawn
    assert trained.y_labels == list(sources)
    shares = _widths(trained)
    assert shares == pytest.approx([100 * f["trained_tokens"] / f["tokens"]
                                    for f in sources.values()])
    sharegpt = sources["sharegpt"]
    assert _widths(cut)[1] == 100 * 6 / sharegpt["records"]
    assert (f"<td>sharegpt</td><td>{sharegpt['records']:,}</td><td>{sharegpt['tokens']:,}</td>"
            f"<td>{sharegpt['trained_tokens']:,}</td>"
            f"<td>{sharegpt['trained_tokens'] / sharegpt['tokens']:.2%}</td><td>6</td>"
            f"<td>900</td><td>{sharegpt['short_replies']:,}</td>") in page


def test_languages_are_drawn_by_documents_and_by_tokens(prepared, charts):
    drawn = charts
    found = prepared.manifest["languages"]["by_language"]
    assert len(found) > 1
    page = report._languages(prepared.manifest)
    [(documents, tokens)] = drawn
    for ax, metric in ((documents, "documents"), (tokens, "tokens")):
        assert ax.log_y
        assert ax.x_labels == list(found)[:20]
        assert [h for *_, h in _bars(ax)] == [c[metric] for c in found.values()][:20]
    for code, counts in found.items():
        assert f"<td>{code}</td><td>{counts['documents']:,}</td><td>{counts['tokens']:,}</td>" \
               in page


def test_personal_data_is_listed_per_kind(prepared):
    pii = prepared.manifest["personal_data"]
    assert pii["mode"] == "redact"
    page = (prepared.output / REPORT_NAME).read_text()
    for kind in pii["kinds"]:
        assert (f"<td>{kind}</td><td>{pii['knowledge']['by_kind'][kind]:,}</td>"
                f"<td>{pii['instruction']['by_kind'][kind]:,}</td>") in page
    assert (f"<td>documents / examples holding any</td><td>{pii['knowledge']['records']:,}"
            f"</td><td>{pii['instruction']['records']:,}</td>") in page


DOMAINS = {  # a manifest's domains section: two of its domains kept, one only dropped
    "documents": 9, "kept": 6, "tokens": 700, "distinct": 3, "blocklist": ["spam.example"],
    "blocklisted": 2, "top_kept": [
        {"domain": "a.example", "documents": 5, "kept": 4, "dropped": 1, "tokens": 600},
        {"domain": "b.example", "documents": 2, "kept": 2, "dropped": 0, "tokens": 100}],
    "top_dropped": [
        {"domain": "spam.example", "documents": 2, "kept": 0, "dropped": 2, "tokens": 0},
        {"domain": "a.example", "documents": 5, "kept": 4, "dropped": 1, "tokens": 600}]}


def test_top_domains_kept_and_dropped_are_drawn_and_listed(charts):
    drawn = charts
    page = report._domains({"domains": DOMAINS})
    [(kept, dropped)] = drawn
    for ax, key, metric in ((kept, "top_kept", "tokens"), (dropped, "top_dropped", "dropped")):
        assert ax.y_labels == [e["domain"] for e in DOMAINS[key]]
        assert _widths(ax) == [e[metric] for e in DOMAINS[key]]
    assert "9 documents from 3 domains, 6 kept with 700 tokens; 2 filtered" in page
    assert "<td>spam.example</td><td>2</td><td>0</td><td>0</td><td>2</td>" in page


def test_boilerplate_removed_and_documents_left_too_short_are_listed():
    manifest = {"config": {"knowledge": {"boilerplate": {"min_chars": 100}}},
                "knowledge": {"boilerplate": {"documents_changed": 25, "paragraphs_removed": 50,
                                              "lines_removed": 0, "chars_removed": 17_431},
                              "dropped": {"boilerplate_too_short": 1, "too_few_words": 3}}}
    page = report._boilerplate(manifest)
    assert "<td>paragraphs removed</td><td>50</td>" in page
    assert "<td>chars removed</td><td>17,431</td>" in page
    assert "<td>documents left too short (boilerplate_too_short)</td><td>1</td>" in page
    manifest["config"]["knowledge"]["boilerplate"] = None
    assert "not looked for" in report._boilerplate(manifest)


def test_figures_make_room_for_their_labels_and_survive_one_longer_than_the_figure():
    short, long = Panel(), Panel()
    report._hbars(short, ["a.example", "b.example"], [3, 4], "short names", "red", "docs")
    report._hbars(long, ["x" * 250, "y"], [1, 2], "a 250-character host", "blue", "docs")
    (left, *_), (right, *_) = layout([short, long], 540, 216)
    assert 0 < left.x0 < left.x1 < right.x0 < right.x1 <= 540  # side by side, in the figure
    assert left.x0 > len("a.example") * EM_PER_CHAR * FONT  # room for the short labels
    assert right.x0 - left.x1 >= 0.4 * 270  # the long ones' room, cut at 40% of a panel
    drawn = report._figure(lambda *panels: None, columns=2)
    assert drawn.startswith('<img class="plot" alt="" src="data:image/svg+xml;base64,')


def test_a_hostile_host_name_does_not_stop_the_report(prepared, tmp_path):
    """A URL's host with a control character reaches the domains chart and table (a run
    rejects records with lone surrogates, but a manifest edited by hand can hold one): the
    report is still written, its SVG well-formed."""
    copy = tmp_path / "hostile"
    shutil.copytree(prepared.output, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    hostile = [{"domain": name, "documents": 2, "kept": 1, "dropped": 1, "tokens": 50}
               for name in ("a\x01b.example", "c\ud800d.example")]
    manifest["domains"] = {**DOMAINS, "top_kept": hostile, "top_dropped": hostile}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    page = Path(report.write_report(str(copy))).read_text(errors="strict")
    images = [base64.b64decode(part.split('"', 1)[0])
              for part in page.split("data:image/svg+xml;base64,")[1:]]
    for svg in images:
        ET.fromstring(svg)
    assert any(b"ab.example" in svg for svg in images)
