"""The docs follow the code: the config reference in docs/operations.md is the generated one."""

from pathlib import Path

from mqttmesh.config import OPTIONS, reference_markdown

ROOT = Path(__file__).resolve().parent.parent


def test_operations_md_embeds_the_current_config_reference():
    text = (ROOT / "docs" / "operations.md").read_text()
    begin = text.index("<!-- BEGIN config-reference -->\n") + len("<!-- BEGIN config-reference -->\n")
    end = text.index("<!-- END config-reference -->")
    assert text[begin:end] == reference_markdown(), (
        "docs/operations.md is stale: paste the output of `mqttmesh config-reference`"
    )


def test_every_option_is_documented_with_its_flag():
    text = (ROOT / "docs" / "operations.md").read_text()
    for option in OPTIONS:
        assert f"`{option.name}`" in text and f"`{option.flag}`" in text, option.name


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "make run" in readme and "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec make test" in ci
