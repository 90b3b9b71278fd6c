"""`units`: one way to write a big number in every report, plan line and error message."""

from spirelib.units import count, duration, si


def test_counts_keep_three_digits_and_amounts_one_decimal():
    assert [count(n) for n in (67_117_056, 8_390_656, 1_342_341_120, 4_096, 512)] == ["67.1M", "8.39M", "1.34B",
                                                                                     "4.1k", "512"]
    assert [si(x) for x in (1.23e12, 3.45e9, 999.0, 0)] == ["1.2T", "3.5G", "999", ""]


def test_durations_read_in_seconds_minutes_or_hours():
    assert [duration(s) for s in (0.01, 8.04, 42.4, 89.9, 90.0, 5399.0, 5400.0, float("nan"))] == [
        "0 s", "8.0 s", "42 s", "90 s", "1.5 min", "90.0 min", "1.5 h", "-"]
