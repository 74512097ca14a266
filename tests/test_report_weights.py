"""The report's weights line says what the per-call checksum reads and how to skip it."""

from kopt.report import describe_weights


def _weights(check: str) -> dict:
    return {"live": 3, "derived": 4, "watched": 2, "check": check, "watched_bytes": 3 * 2**20,
            "on_change": "derive them again in place"}


def test_checksum_line_gives_the_read_and_the_way_out():
    line = describe_weights(_weights("checksum"))
    assert "reading 3.0 MiB per call" in line
    assert "weight_check='version' skips the read and misses writes through param.data" in line


def test_version_check_reads_nothing():
    line = describe_weights(_weights("version"))
    assert "watched by version" in line and "MiB" not in line
