"""The markers a test must carry for what it starts, checked when the suite is collected.

``make check`` runs ``-m "not process and not spark and not interop and not slow and not
hostile"``: it can only leave out what is marked. tests/conftest.py calls ``refuse_unmarked``
on every collected test, which stops the run if any test reaches one of the fixtures below
(directly or through other fixtures) without the marker, so the fast subset never starts a
broker, a JVM or a mosquitto tool by accident.

Tests that start a process themselves (``subprocess.run`` of the CLI, say) carry the marker
by hand: no fixture tells on them.
"""

from __future__ import annotations

import pytest

# fixture -> the marker a test that uses it needs
NEEDS_MARKER = {
    "broker_factory": "process",  # tests/conftest.py: `mqttmesh broker` processes
    "broker": "process",
    "nodes": "process",  # tests/hostile/conftest.py
    "module_nodes": "process",
    "shared_broker": "process",  # tests/integration/test_badinput.py
    "fuzz_env": "process",
    "pki": "process",  # `openssl`: tests/test_tls.py, tests/hostile/test_hostile_tls.py
    "pwfile": "process",  # `mqttmesh passwd`: test_security, test_logins, test_hostile_auth
    "spark": "spark",  # tests/pipeline/conftest.py: a local SparkSession (a JVM)
    "mosq_sub": "interop",  # tests/integration/test_interop.py: mosquitto_sub
    "browser": "process",  # tests/conftest.py: headless Chromium (selenium)
}

# a directory under tests/ -> the markers every test in it needs
DIRECTORY_MARKERS = {
    "hostile": ("hostile", "process"),
}


def needed(item: pytest.Item) -> set[str]:
    """The markers ``item`` must carry."""
    need = {NEEDS_MARKER[name] for name in _fixtures(item) if name in NEEDS_MARKER}
    try:
        parts = item.path.relative_to(item.config.rootpath).parts[:-1]
    except ValueError:
        parts = ()
    for directory, markers in DIRECTORY_MARKERS.items():
        if directory in parts:
            need.update(markers)
    return need


def unmarked(items: list[pytest.Item]) -> list[str]:
    """One line per test that lacks a marker it needs."""
    problems = []
    for item in items:
        missing = needed(item) - {m.name for m in item.iter_markers()}
        if missing:
            uses = sorted(n for n in _fixtures(item) if n in NEEDS_MARKER)
            problems.append(
                f"{item.nodeid}: needs {', '.join(f'@pytest.mark.{m}' for m in sorted(missing))}"
                + (f" (uses {', '.join(uses)})" if uses else "")
            )
    return problems


def refuse_unmarked(items: list[pytest.Item]) -> None:
    """Stop the run (a usage error, exit status 4) if any test lacks a marker it needs."""
    problems = unmarked(items)
    if problems:
        raise pytest.UsageError(
            "tests that start processes or Spark without the marker that lets `make check` leave "
            "them out (pyproject.toml lists the markers, tests/support/markers.py the fixtures):\n  "
            + "\n  ".join(problems)
        )


def _fixtures(item: pytest.Item) -> list[str]:
    """The fixtures ``item`` reaches, its own and theirs (``fixturenames`` is the closure),
    without parametrized arguments, which show up there too and start nothing."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    return [name for name in getattr(item, "fixturenames", ()) if name not in params]


# marker or fixture -> the commands its tests run, and the Debian package that has them
# (scripts/system-deps installs them under `make test` as root)
TOOLS = {
    "interop": (("mosquitto_pub", "mosquitto_sub"), "mosquitto-clients"),
    "spark": (("java",), "openjdk-17-jre-headless"),
    "pki": (("openssl",), "openssl"),
    "browser": (("chromium", "chromedriver"), "chromium chromium-driver"),
}


def skip_missing_tools(items: list[pytest.Item], which=None) -> None:
    """Skip, with a message naming the package, each test whose tools are not installed
    (``make test`` installs them as root; without root it says which are missing)."""
    import shutil

    which = which or shutil.which
    missing: dict[str, str] = {}
    for key, (commands, package) in TOOLS.items():
        absent = [c for c in commands if which(c) is None]
        if absent:
            missing[key] = f"{', '.join(absent)} not installed: apt-get install {package} (make test does, as root)"
    if not missing:
        return
    for item in items:
        names = {m.name for m in item.iter_markers()} | set(_fixtures(item))
        for key, why in missing.items():
            if key in names:
                item.add_marker(pytest.mark.skip(reason=why))
                break
