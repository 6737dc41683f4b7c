"""bench/mesh_cost.py's page section: it replaces its own earlier one, or goes before "## Method",
inside the "kept" markers a new ``make bench`` keeps; and its table says the ratios."""

from __future__ import annotations

from bench import mesh_cost, report


def _results() -> mesh_cost.Results:
    r = mesh_cost.Results(
        {"command": "c", "date": "d", "rounds": 1, "warmup": 0.5, "duration": 3, "load_before": "1", "load_after": "2"}
    )
    for broker, cpu in (("same", 20.0), ("cross", 50.0), ("mosquitto", 10.0)):
        run = {
            "ok": True,
            "lost": 0,
            "delivered_per_s": 1000.0,
            "delivered_fraction": 1.0,
            "p50_ms": 0.2,
            "p99_ms": 1.0,
            "broker_cpu_us_per_msg": cpu,
            "broker_cpu_util": cpu / 1000,
        }
        r.add(mesh_cost.Cell("paced", broker, mesh_cost.paced(1000.0), 1), run)
    return r


def test_the_table_gives_cross_over_same():
    text = mesh_cost.tables(_results())
    row = next(line for line in text.splitlines() if line.startswith("| 1,000 | 1 |"))
    assert "| 20.0 | 50.0 | 2.50x | 10.0 |" in row


def test_the_section_replaces_its_earlier_one_and_is_kept_by_make_bench(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\nrows\n\n## Method\n\nold\n")
    first = mesh_cost.markdown(_results())
    mesh_cost.write_markdown(path, first)
    text = path.read_text()
    assert text.index(mesh_cost.MD_BEGIN) < text.index("## Method")
    second = first.replace("2.50x", "9.99x")
    mesh_cost.write_markdown(path, second)
    text = path.read_text()
    assert text.count(mesh_cost.MD_BEGIN) == 1 and "9.99x" in text and "2.50x" not in text
    assert mesh_cost.MD_BEGIN.startswith(report.KEPT_BEGIN) and mesh_cost.MD_END == report.KEPT_END
    assert second in report.kept_sections(path)
