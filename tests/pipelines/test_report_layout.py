"""The report's text and charts, without a run: a section for a step the recipe lacks says so,
no chart text overlaps another, and numbers share one format."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tokenmill.pipelines.recipe import load_recipe
from tokenmill.pipelines.report import number_cell, write_report
from tokenmill.pipelines.step_graph import build_plan
from tokenmill.pipelines.svg import (
    ASCENT_EM,
    DESCENT_EM,
    axis_labels,
    bar_chart,
    histogram,
    line_chart,
    text_width,
)


def _recipe(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "docs.txt").write_text("One document.\n")
    path = tmp_path / "recipe.yaml"
    path.write_text(
        textwrap.dedent("""
        name: notrain
        sources:
          - {name: docs, path: docs.txt, format: text}
        tokenize: {vocab_size: 300}
        blend:
          - {source: docs, weight: 1.0}
        """)
        + extra
    )
    return path


@pytest.mark.parametrize(
    ("extra", "training", "evaluation"),
    [
        ("", "The recipe has no training step.", "The recipe has no evaluation step."),
        ("train: {config: tiny}\n", "Training has not run yet.", "The recipe has no evaluation step."),
    ],
)
def test_sections_of_steps_the_recipe_lacks_say_so(tmp_path, extra, training, evaluation) -> None:
    recipe = load_recipe(_recipe(tmp_path, extra))
    work = tmp_path / "work"
    work.mkdir()
    md_path, html_path = write_report(recipe, work, build_plan(recipe, work))
    md, html = md_path.read_text(), html_path.read_text()
    section = lambda key, text: re.search(rf'<section id="{key}">.*?</section>', text, re.S).group(0)  # noqa: E731
    assert f"<p>{training}</p>" in section("training", html) and f"## Training\n\n{training}\n" in md
    assert f"<p>{evaluation}</p>" in section("evaluation", html)
    assert "has not run yet" not in section("evaluation", html)


def text_boxes(svg: str) -> list[tuple[str, float, float, float, float]]:
    """(text, x0, y0, x1, y1) of every <text>, drawn as a browser draws it, rotation included."""
    boxes = []
    for attrs, text in re.findall(r"<text ([^>]*)>([^<]*)</text>", svg):
        a = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs))
        x, y, size = float(a["x"]), float(a["y"]), float(a["font-size"])
        width = text_width(text, size)
        anchor = a.get("text-anchor", "start")
        start = {"start": 0.0, "middle": width / 2, "end": width}[anchor]
        if "rotate(-90" in a.get("transform", ""):
            # Read bottom to top: the glyphs rise towards smaller x.
            boxes.append((text, x - size * ASCENT_EM, y - width + start, x + size * DESCENT_EM, y + start))
        else:
            boxes.append((text, x - start, y - size * ASCENT_EM, x - start + width, y + size * DESCENT_EM))
    return boxes


def assert_no_text_overlaps(svg: str) -> None:
    boxes = text_boxes(svg)
    assert len(boxes) >= 4
    for i, (a, ax0, ay0, ax1, ay1) in enumerate(boxes):
        assert ax0 >= 0 and ay0 >= 0 and ax1 <= 640 and ay1 <= 300, f"{a!r} leaves the image"
        for b, bx0, by0, bx1, by1 in boxes[i + 1 :]:
            assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, f"{a!r} overlaps {b!r}"


def test_axis_titles_and_tick_labels_do_not_overlap() -> None:
    steps = list(range(10, 1001, 10))
    charts = [
        # Throughput in the hundreds of thousands, losses near 10, tiny shares, long names.
        line_chart("Throughput", {"tokens/s": [(s, 123_456.7 + 37 * s) for s in steps]}, "step", "tokens per second"),
        line_chart("Loss", {"train loss": [(s, 10.98 - s / 200) for s in steps]}, "step", "loss"),
        line_chart("MFU", {"mfu": [(s, 0.00012 + s * 1e-7) for s in steps]}, "step", "model FLOPs utilisation"),
        histogram("lengths", {"after ingest": [3, 40, 5_000, 2_500_000], "after dedup": [40, 600]}, "characters"),
        bar_chart(
            "Blend",
            [f"a-source-with-a-long-name-{i}" for i in range(8)],
            {"requested": [0.125] * 8, "realised distribution share": [0.12] * 8},
            "share",
        ),
    ]
    for svg in charts:
        assert_no_text_overlaps(svg)


def test_numbers_have_one_format_per_axis_and_in_tables() -> None:
    assert axis_labels([0.0, 0.5, 1.0, 1.5]) == ["0.0", "0.5", "1.0", "1.5"]
    assert axis_labels([0, 50_000, 100_000, 150_000]) == ["0", "50k", "100k", "150k"]
    assert axis_labels([2e6, 2.5e6, 3e6]) == ["2.0M", "2.5M", "3.0M"]
    svg = histogram("lengths", {"docs": [1, 20, 300, 4_000, 50_000, 600_000]}, "characters")
    x_labels = [t for t, *_ in text_boxes(svg) if t[0].isdigit()]
    assert {"1", "10", "100", "1k", "10k", "100k"} <= set(x_labels)
    assert not any("e+" in t or "e-" in t for t, *_ in text_boxes(svg))
    assert [number_cell(v) for v in (1234567, 12345.67, 3.14159, 0.000123, "x", True)] == [
        "1,234,567",
        "12,346",
        "3.142",
        "0.000123",
        None,
        None,
    ]
