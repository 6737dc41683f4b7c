"""docs/pipeline.md follows the code: the archive's columns, every analyze option, the jobs."""

from pathlib import Path

from mqttmesh.archive.schema import schema_markdown
from mqttmesh.pipeline.cli import JOBS, build_parser

DOC = (Path(__file__).resolve().parent.parent.parent / "docs" / "pipeline.md").read_text()


def test_pipeline_md_embeds_the_current_archive_schema():
    begin = DOC.index("<!-- BEGIN archive-schema -->\n") + len("<!-- BEGIN archive-schema -->\n")
    end = DOC.index("<!-- END archive-schema -->")
    assert DOC[begin:end] == schema_markdown(), "docs/pipeline.md is stale: paste archive.schema.schema_markdown()"


def test_every_job_and_option_of_analyze_is_documented():
    for job in JOBS:
        assert f"### {job}" in DOC, job
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--help":
                assert f"`{flag}" in DOC, flag
