"""The report's SVG charts: ticks that name their own positions, bars drawn to scale on linear
and logarithmic axes, labels that make room for themselves, and SVG a browser can parse."""

import itertools
import math
import xml.etree.ElementTree as ET

import pytest

from beam_pipeline.charts import (
    EM_PER_CHAR,
    FONT,
    PAD,
    TICK,
    Panel,
    category_axis,
    figure,
    layout,
    number_axis,
)

SVG = "{http://www.w3.org/2000/svg}"


def _value(label: str) -> float:
    """A tick label read back as a number: 1,000 or 2.5M or 100k."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(label[-1], 1)
    return float(label.rstrip("kMG").replace(",", "")) * scale


@pytest.mark.parametrize(("values", "whole"), [
    ([0, 137], False), ([0, 2], True), ([0, 1], False), ([-0.4, 12.6], True),
    ([0, 3_570_000], False), ([0.05, 0.95], False), ([0, 41], True), ([7, 7], False)])
def test_linear_ticks_are_round_numbers_inside_the_axis_that_name_their_place(values, whole):
    axis = number_axis(values, 150, vertical=True, whole=whole)
    positions = [at for at, _ in axis.ticks]
    assert 2 <= len(positions) <= 150 / 20
    assert all(axis.lo <= at <= axis.hi for at in positions)
    assert all(_value(label) == pytest.approx(at) for at, label in axis.ticks)
    steps = {round(b - a, 9) for a, b in itertools.pairwise(positions)}
    [step] = steps  # evenly spaced
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert round(mantissa, 9) in (1, 2, 2.5, 5)
    if whole:
        assert step == int(step)
    assert axis.lo <= min(values) and axis.hi >= max(values)


def test_a_bars_base_is_the_axis_end_and_the_other_end_has_room():
    axis = number_axis([0, 10], 150, vertical=True, base=True)
    assert axis.lo == 0 and axis.hi == pytest.approx(10.5)
    assert number_axis([0, 10], 150, vertical=True).lo == pytest.approx(-0.5)


def test_large_numbers_are_written_short_and_small_steps_keep_their_decimals():
    big = number_axis([0, 3_400_000], 300, vertical=False)
    assert {label[-1] for _, label in big.ticks if label != "0"} == {"M"}
    fine = number_axis([0.0, 0.3], 300, vertical=True)
    assert [label for _, label in fine.ticks][:3] == ["0", "0.05", "0.10"]  # one number of decimals
    assert [label for _, label in number_axis([0, 4_000], 150, vertical=True).ticks][-1] \
        == "4,000"


def test_log_axes_tick_powers_of_ten_and_leave_the_least_bar_a_height():
    axis = number_axis([1, 36], 150, vertical=True, log=True)
    assert [label for _, label in axis.ticks] == ["1", "10", "100"]
    assert axis.fraction(1) > 0 and axis.fraction(36) < 1
    assert axis.fraction(0) < 0  # a bar from 0 starts below the frame, which clips it
    wide = number_axis([3, 2_000_000], 300, vertical=True, log=True)
    assert [label for _, label in wide.ticks] == ["1", "10", "100", "1,000", "10,000", "100k",
                                                  "1M", "10M"]
    short = number_axis([3, 2_000_000], 100, vertical=True, log=True)  # every other one fits
    assert [label for _, label in short.ticks] == ["1", "100", "10,000", "1M"]


def test_crowded_category_labels_are_turned():
    assert not category_axis(["en", "fr"], 200).rotated
    assert category_axis(["documents_changed", "paragraphs_removed"] * 5, 200).rotated
    lying = category_axis(["first", "second", "third"], 100, top_first=True)
    assert lying.ticks == ((2, "first"), (1, "second"), (0, "third"))


def _rects(svg: str) -> list[dict]:
    """The bars of an SVG figure: every rect inside a clipped group."""
    root = ET.fromstring(svg)
    return [rect.attrib for group in root.iter(f"{SVG}g") for rect in group.iter(f"{SVG}rect")]


def test_bars_are_drawn_to_scale_on_one_baseline():
    panel = Panel(title="t <&> \"q\"")
    panel.bars(["a", "b", "c"], [1, 2, 4], "#123456")
    svg = figure([panel], 7.5, 3.0)
    root = ET.fromstring(svg)  # well-formed, the title escaped
    assert root.get("viewBox") == "0 0 540 216"
    rects = _rects(svg)
    heights = [float(r["height"]) for r in rects]
    assert heights[1] == pytest.approx(2 * heights[0], abs=0.02)
    assert heights[2] == pytest.approx(4 * heights[0], abs=0.02)
    bottoms = {round(float(r["y"]) + float(r["height"]), 1) for r in rects}
    assert len(bottoms) == 1
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert {"a", "b", "c", "t <&> \"q\""} <= set(texts)


def test_stacked_lying_bars_start_where_the_previous_ended():
    panel = Panel()
    panel.hbars(["x", "y"], [3, 1], "#111", key="kept")
    panel.hbars(["x", "y"], [2, 5], "#222", starts=[3, 1], key="dropped")
    (frame, x, _), = layout([panel], 540, 216)
    rects = _rects(figure([panel], 7.5, 3.0))
    lefts = [float(r["x"]) for r in rects]
    rights = [float(r["x"]) + float(r["width"]) for r in rects]
    assert lefts[2] == pytest.approx(rights[0], abs=0.02)  # x: 3 then 2 more
    assert lefts[3] == pytest.approx(rights[1], abs=0.02)  # y: 1 then 5 more
    assert lefts[0] == pytest.approx(frame.x0, abs=0.02) and x.lo == 0
    assert [key.label for key in panel.keys] == ["kept", "dropped"]


def test_lines_marks_and_an_outside_legend_stay_inside_the_figure():
    panel = Panel(legend="outside", legend_font=7)
    panel.x_labels = ["8", "16", "32"]
    panel.line([0.1, 0.5, 0.4], dashed=False, key="web (knowledge)")
    panel.line([0.0, 0.2, 0.8], dashed=True, key="chat (instruction)")
    (frame, _, y), = layout([panel], 540, 216)
    assert frame.x1 < 540 - 7 * 0.62 * len("chat (instruction)")  # room for the legend
    assert y.lo < 0 and y.hi > 0.8
    root = ET.fromstring(figure([panel], 7.5, 3.0))
    assert len(list(root.iter(f"{SVG}polyline"))) == 2
    assert len(list(root.iter(f"{SVG}circle"))) == 6 + 1  # markers, and the solid key's


def test_an_empty_panel_draws_its_title_and_no_ticks():
    empty = Panel(title="SFT: no examples")
    root = ET.fromstring(figure([empty], 3.0, 2.0))
    assert [t.text for t in root.iter(f"{SVG}text")] == ["SFT: no examples"]


def _texts(root: ET.Element) -> dict[str, ET.Element]:
    return {t.text: t for t in root.iter(f"{SVG}text")}


def test_log_ticks_stand_where_their_powers_of_ten_are():
    panel = Panel(log_y=True)
    panel.bars(["a", "b"], [1, 100], "#111")
    root = ET.fromstring(figure([panel], 7.5, 3.0))
    at = {label: float(_texts(root)[label].get("y")) for label in ("1", "10", "100")}
    assert at["1"] > at["10"] > at["100"]
    assert at["1"] - at["10"] == pytest.approx(at["10"] - at["100"], abs=0.02)
    tops = sorted(float(r["y"]) for r in _rects(ET.tostring(root, encoding="unicode")))
    assert tops[0] == pytest.approx(at["100"] - 0.35 * FONT, abs=0.02)  # the 100 bar's top


def test_horizontal_axes_leave_room_for_wide_labels():
    upright = number_axis([0, 3_000_000], 200, vertical=True)
    lying = number_axis([0, 3_000_000], 200, vertical=False)
    assert len(lying.ticks) < len(upright.ticks)
    widths = [len(label) * EM_PER_CHAR * FONT for _, label in lying.ticks]
    spacing = 200 / (lying.hi - lying.lo) * (lying.ticks[1][0] - lying.ticks[0][0])
    assert max(widths) < spacing


def test_marks_are_dashed_lines_and_an_outside_legend_lies_beside_the_frame():
    panel = Panel(legend="outside")
    panel.columns([0, 10, 20], [5, 7, 2], 10, "#111")
    panel.mark(25, "#c00", "seq_len 25")
    (frame, x, _), = layout([panel], 540, 216)
    root = ET.fromstring(figure([panel], 7.5, 3.0))
    [mark] = [line for line in root.iter(f"{SVG}line") if line.get("stroke") == "#c00"
              and line.get("y1") != line.get("y2")]
    assert mark.get("stroke-dasharray")
    assert float(mark.get("x1")) == pytest.approx(
        frame.x0 + (25 - x.lo) / (x.hi - x.lo) * (frame.x1 - frame.x0), abs=0.02)
    boxes = [r for r in root.iter(f"{SVG}rect") if r.get("stroke") == "#ccc"]
    assert len(boxes) == 1 and float(boxes[0].get("x")) >= frame.x1


def test_turned_labels_are_turned_and_the_axis_title_stays_in_the_figure():
    panel = Panel(xlabel="tokens")
    panel.bars([f"a label of thirty characters {i}" for i in range(10)], range(10), "#111")
    root = ET.fromstring(figure([panel], 7.5, 3.0))
    texts = _texts(root)
    assert "rotate(-45" in texts["a label of thirty characters 0"].get("transform")
    assert 0 < float(texts["tokens"].get("y")) <= 216


def test_margins_fit_the_labels_of_the_final_axes():
    panel = Panel(ylabel="count")
    panel.bars(["a", "b"], [3, 16.6], "#111")
    (frame, _, y), = layout([panel], 540, 216)
    widest = max(len(label) for _, label in y.ticks) * EM_PER_CHAR * FONT
    # the pad, the ticks, their labels and the axis title: 2.5-steps need "12.5", wider than
    # the "15" of the first guess's axis
    assert frame.x0 >= PAD + TICK + 3 + widest + 1.4 * FONT - 1e-9
    root = ET.fromstring(figure([panel], 7.5, 3.0))
    assert float(_texts(root)["count"].get("x")) > 0


def test_a_long_label_is_cut_at_its_panel_not_drawn_over_the_next():
    left, right = Panel(), Panel()
    left.hbars(["a"], [1], "#111")
    right.hbars(["x" * 250], [1], "#222")
    root = ET.fromstring(figure([left, right], 7.5, 3.0))
    cells = sorted(float(c[0].get("x")) for c in root.iter(f"{SVG}clipPath")
                   if c.get("id").endswith("-cell"))
    assert cells == [0, 270]
    [label] = [t for t in root.iter(f"{SVG}text") if t.text == "x" * 250]
    assert float(label.get("x")) > 270  # its end, at the right panel's frame


def test_hostile_text_and_missing_values_still_make_a_figure():
    panel = Panel(title="a\x01b\ud800c")
    panel.hbars(["host\x00.example", "b.example"], [float("nan"), 2], "#111")
    svg = figure([panel], 7.5, 3.0)
    root = ET.fromstring(svg.encode())  # well-formed, and encodable as UTF-8
    assert "nan" not in svg.lower() and "inf" not in svg
    assert "abc" in _texts(root)
    assert number_axis([float("nan"), 0, 5, float("inf")], 150, vertical=True).hi \
        == pytest.approx(5.25)


@pytest.mark.parametrize("values", [[1, 1 + 1e-7], [1e-9, 3e-9], [2e-5, 9e-5]])
def test_tiny_spans_get_distinct_labels_that_name_their_place(values):
    axis = number_axis(values, 150, vertical=True)
    labels = [label for _, label in axis.ticks]
    assert len(set(labels)) == len(labels) >= 2
    assert all(float(label) == pytest.approx(at, rel=1e-9) for at, label in axis.ticks)
