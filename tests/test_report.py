"""The data report: written at the end of a run and named by the summary's last line, opened in
headless Chromium (no console errors, no request leaving the file, every section and every plot
shown, a screenshot kept), its figures checked against the Parquet outputs read independently,
and rebuilt from a copied output folder alone."""

import doctest
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_pipeline import report
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


def test_without_matplotlib_the_card_is_written_and_the_line_says_how(prepared, tmp_path,
                                                                       monkeypatch):
    copy = tmp_path / "no-plots"
    shutil.copytree(prepared.output, copy)
    (copy / REPORT_NAME).unlink()
    (copy / "README.md").unlink()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    line = publish(str(copy))
    assert line == (f"report: not written, matplotlib is missing; {report.INSTALL_HINT}, then "
                    f"python -m beam_pipeline.report {copy}")
    assert (copy / "README.md").is_file() and not (copy / REPORT_NAME).exists()


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
