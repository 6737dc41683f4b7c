"""A Delta table's log replayed to a version's files (archive/delta_log.py, pure): which files
to list and read, which version a number or a time names, what a version holds, and why a
version cannot be read. Listings and actions made by hand; real tables, against delta-rs, are
tests/pipeline/test_archive_delta_uri.py's."""

from __future__ import annotations

import datetime as dt
import fnmatch

import pytest

from mqttmesh.archive.delta_log import (
    Listing,
    LogError,
    check_protocol,
    commit_times,
    data_path,
    names_from,
    parse_listing,
    plan,
    plan_from,
    replay,
)

UTC = dt.UTC


def _name(v: int) -> str:
    return f"{v:020d}.json"


def _expand(glob: str) -> list[str]:
    """The alternatives of a ``{a,b}`` glob (Python's fnmatch has the rest of Hadoop's syntax)."""
    assert glob.startswith("{") and glob.endswith("}")
    return glob[1:-1].split(",")


@pytest.mark.parametrize("start", [0, 1, 9, 10, 99, 100, 1234, 19999, 10**19 - 1])
def test_names_from_a_version_match_exactly_the_log_files_of_that_version_and_later(start):
    alternatives = _expand(names_from(start))
    versions = sorted(
        {0, 1, 8, 9, 10, 11, 98, 99, 100, 101, 999, 1000, 1233, 1234, 1235, 1300, 2000, 19999, 20000}
        | {start - 1, start, start + 1, 10**19 - 1, 10**19} - {-1}
    )
    for v in versions:
        for name in (_name(v), f"{v:020d}.checkpoint.parquet", f"{v:020d}.crc"):
            matched = any(fnmatch.fnmatchcase(name, a) for a in alternatives)
            assert matched == (v >= start), (name, start)
    assert not any(fnmatch.fnmatchcase("_last_checkpoint", a) for a in alternatives)


def test_a_listing_keeps_commits_and_whole_checkpoints_only():
    listing = parse_listing(
        [
            (_name(0), 1000),
            (_name(1), 2000),
            ("00000000000000000001.checkpoint.parquet", 2100),
            ("00000000000000000002.checkpoint.0000000001.0000000002.parquet", 2200),  # (its part 2 is missing)
            ("00000000000000000003.checkpoint.0000000002.0000000002.parquet", 2300),
            ("00000000000000000003.checkpoint.0000000001.0000000002.parquet", 2300),
            ("_last_checkpoint", 2300),
            (".00000000000000000004.json.tmp", 2400),
            ("00000000000000000001.crc", 2000),
        ]
    )
    assert listing.commits == {0: 1000, 1: 2000}
    assert listing.checkpoints == {
        1: ["00000000000000000001.checkpoint.parquet"],
        3: [
            "00000000000000000003.checkpoint.0000000001.0000000002.parquet",
            "00000000000000000003.checkpoint.0000000002.0000000002.parquet",
        ],
    }


def test_commit_times_are_made_increasing_as_delta_lake_does():
    assert commit_times({0: 1000, 1: 3000, 2: 2000, 3: 3000, 4: 5000}) == {0: 1000, 1: 3000, 2: 3001, 3: 3002, 4: 5000}


def _at(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, UTC)


def test_a_plan_reads_the_newest_checkpoint_at_or_before_the_version_then_the_commits_after_it():
    listing = Listing({v: 1000 * (v + 1) for v in range(12)}, {4: ["4.cp"], 8: ["8.cp"]})
    assert (p := plan(listing)).version == 11 and p.checkpoint == ["8.cp"] and p.commits == [9, 10, 11]
    assert (p := plan(listing, 8)).checkpoint == ["8.cp"] and p.commits == []
    assert (p := plan(listing, 7)).checkpoint == ["4.cp"] and p.commits == [5, 6, 7]
    assert (p := plan(listing, 3)).checkpoint == [] and p.commits == [0, 1, 2, 3]
    assert plan(listing, _at(5000)).version == 4 and plan(listing, _at(5999)).version == 4
    assert plan(listing, _at(1000)).version == 0 and plan(listing, _at(10**13)).version == 11


def test_a_plan_from_the_last_checkpoint_needs_only_the_files_from_it_or_says_it_needs_more():
    listing = Listing({v: 1000 * (v + 1) for v in range(12)}, {4: ["4.cp"], 8: ["8.cp"]})
    assert plan_from(listing, 8) == plan(listing)
    assert plan_from(listing, 8, 9) == plan(listing, 9) and plan_from(listing, 8, 7) is None
    assert plan_from(listing, 8, _at(9000)) == plan(listing, _at(9000))
    assert plan_from(listing, 8, _at(8999)) is None  # (before that checkpoint's commit)
    assert plan_from(listing, 5) is None  # (no whole checkpoint there)
    with pytest.raises(LogError, match="no such version"):
        plan_from(listing, 8, 12)
    # a commit before the checkpoint whose file is newer than the checkpoint's commit (another
    # writer's clock): over the whole log it pushes the times after it; from the checkpoint on,
    # as Delta Lake lists commits from a checkpoint, it does not count
    skewed = Listing({**listing.commits, 6: 20_000}, listing.checkpoints)
    assert plan(skewed, _at(12_000)).version == 5
    assert plan_from(skewed, 8, _at(12_000)).version == 11


def test_a_plan_says_why_a_version_cannot_be_read():
    listing = Listing({v: 1000 * (v + 1) for v in range(3)}, {})
    with pytest.raises(LogError, match=r"--as-of 3: no such version \(the latest is 2\)"):
        plan(listing, 3)
    with pytest.raises(
        LogError, match=r"before the table's first commit \(version 0, at 1970-01-01T00:00:01.000\+00:00\)"
    ):
        plan(listing, _at(999))
    cleaned = Listing({v: 1000 * (v + 1) for v in range(5, 9)}, {5: ["5.cp"]})
    with pytest.raises(
        LogError, match=r"--as-of 4: the log no longer has that version \(cleaned up; the oldest it can give is 5\)"
    ):
        plan(cleaned, 4)
    with pytest.raises(
        LogError, match=r"no longer has the commits before version 5 \(at 1970-01-01T00:00:06.000\+00:00; cleaned up\)"
    ):
        plan(cleaned, _at(5999))
    assert plan(cleaned, _at(6000)).version == 5
    gap = Listing({0: 1, 1: 2, 3: 4}, {})
    with pytest.raises(LogError, match="lacks commit 2"):
        plan(gap)
    with pytest.raises(LogError, match="no commit"):
        plan(Listing({}, {}))


def test_replay_adds_and_removes_in_commit_order_over_the_checkpoint():
    files = replay(
        [("a", {"hour": "13"}), ("b", {"hour": "13"})],
        [
            (7, [{"add": {"path": "d", "partitionValues": {"hour": "14"}}}, {"remove": {"path": "c"}}]),
            (6, [{"remove": {"path": "a"}}, {"add": {"path": "c", "partitionValues": {"hour": "14"}}}]),
            (8, [{"commitInfo": {}}, {"txn": {"appId": "x", "version": 1}}]),
        ],
    )
    assert files == {"b": {"hour": "13"}, "d": {"hour": "14"}}
    check_protocol({"minReaderVersion": 1, "minWriterVersion": 2})
    check_protocol({"minReaderVersion": 3, "readerFeatures": ["timestampNtz"]})
    with pytest.raises(LogError, match="deletionVectors"):
        replay([], [(0, [{"protocol": {"minReaderVersion": 3, "readerFeatures": ["deletionVectors"]}}])])
    with pytest.raises(LogError, match="column mapping"):
        check_protocol({"minReaderVersion": 2})
    assert data_path("s3a://b/arc/publish/", "date=x/p%20q.parquet") == "s3a://b/arc/publish/date=x/p q.parquet"
    assert data_path("s3a://b/arc/publish", "s3a://c/p.parquet") == "s3a://c/p.parquet"
