"""The collection guard of tests/conftest.py: a test that reaches a fixture starting processes
or Spark without the matching marker stops the run before anything starts.

Each case is a small suite of its own, run in this process by pytester, with a conftest that
has the same hook as tests/conftest.py and fixtures that only borrow the names of the real
ones (they start nothing).
"""

from __future__ import annotations

import pytest

CONFTEST = """
import pytest

from support.markers import refuse_unmarked


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    refuse_unmarked(items)


@pytest.fixture
def broker_factory():
    return "a stand-in: starts nothing"


@pytest.fixture
def durable(broker_factory):
    return broker_factory


@pytest.fixture
def spark():
    return "a stand-in: starts nothing"
"""

INI = """
[pytest]
markers =
    process: starts processes
    spark: uses Spark
    interop: uses mosquitto tools
    slow: long
    hostile: the hostile suite
"""


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini(INI)
    return pytester


def run(suite, *args):
    # hypothesis' plugin is not needed here, and importing it again for every run is most of the time
    return suite.runpytest("-p", "no:hypothesispytest", *args)


def test_a_broker_fixture_without_the_process_marker_stops_collection(suite):
    suite.makepyfile(test_one="def test_talks_to_a_broker(broker_factory):\n    pass\n")
    result = run(suite, "-m", "not process")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*test_one.py::test_talks_to_a_broker: needs @pytest.mark.process (uses broker_factory)*"]
    )


def test_a_marked_test_collects_and_the_fast_subset_leaves_it_out(suite):
    suite.makepyfile(
        test_one="""
import pytest

pytestmark = pytest.mark.process


def test_talks_to_a_broker(broker_factory):
    pass
""",
        test_two="def test_pure():\n    pass\n",
    )
    result = run(suite, "-m", "not process")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, deselected=1)


def test_a_fixture_reached_through_another_fixture_counts(suite):
    suite.makepyfile(test_one="def test_durable(durable):\n    pass\n")
    result = run(suite)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_durable: needs @pytest.mark.process (uses broker_factory)*"])


def test_spark_needs_the_spark_marker_not_process(suite):
    suite.makepyfile(
        test_one="""
import pytest


@pytest.mark.process
def test_wrong_marker(spark):
    pass


@pytest.mark.spark
def test_right_marker(spark):
    pass
"""
    )
    result = run(suite)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_wrong_marker: needs @pytest.mark.spark (uses spark)*"])
    assert "test_right_marker" not in result.stderr.str()


def test_every_test_of_the_hostile_directory_needs_hostile_and_process(suite):
    (suite.path / "hostile").mkdir()
    (suite.path / "hostile" / "test_attack.py").write_text("def test_attack():\n    pass\n")
    result = run(suite)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_attack: needs @pytest.mark.hostile, @pytest.mark.process*"])


def test_a_parametrized_argument_with_a_fixture_name_starts_nothing(suite):
    suite.makepyfile(
        test_one="""
import pytest


@pytest.mark.parametrize("broker", ["not a fixture"])
def test_named_like_a_fixture(broker):
    pass
"""
    )
    result = run(suite)
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1)


def test_a_test_whose_tools_are_missing_is_skipped_naming_the_package(suite):
    """Without root, `make test` cannot install the Debian tools: the tests that use them are
    skipped with the package to install, never failed (scripts/system-deps)."""
    suite.makeconftest(
        CONFTEST.replace(
            "from support.markers import refuse_unmarked",
            "from support.markers import refuse_unmarked, skip_missing_tools",
        ).replace(
            "    refuse_unmarked(items)\n",
            "    refuse_unmarked(items)\n    skip_missing_tools(items, which=lambda command: None)\n",
        )
    )
    suite.makepyfile(
        test_one="""
import pytest

@pytest.mark.interop
def test_mosquitto_tools():
    pass

@pytest.mark.spark
def test_uses_spark(spark):
    pass

def test_pure():
    pass
"""
    )
    result = run(suite, "-rs")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*mosquitto_pub, mosquitto_sub not installed: apt-get install mosquitto-clients*",
            "*java not installed: apt-get install openjdk-17-jre-headless*",
        ]
    )
