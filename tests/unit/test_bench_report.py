"""bench/report.py writes BENCHMARKS.md whole; what other benchmarks put there between the
"kept" markers (bench/shared.py's figures) survives a new ``make bench``."""

from __future__ import annotations

from collections import defaultdict

from bench import report


def test_a_new_benchmarks_page_keeps_the_marked_sections(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    kept = f"{report.KEPT_BEGIN}: shared -->\n### Shared subscriptions\n\n| a | b |\n{report.KEPT_END}"
    path.write_text(f"# Benchmarks\n\nold rows\n\n{kept}\n\n## Method\n\nold\n")
    machine = defaultdict(str, nproc=2)
    options = defaultdict(lambda: 1)
    data = {
        "meta": {
            "date": "today",
            "command": "make bench",
            "machine": machine,
            "versions": defaultdict(str),
            "options": options,
        },
        "cells": [],
        "targets": [],
    }
    report.write_markdown(path, data)
    text = path.read_text()
    assert text.count(kept) == 1 and "{KEPT}" not in text
    assert text.index(kept) < text.index("## Method") and "old rows" not in text
    report.write_markdown(path, data)  # (and again: still once)
    assert path.read_text().count(kept) == 1
