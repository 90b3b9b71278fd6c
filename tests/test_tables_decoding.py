"""Tables of measured acceptance (notebook 04): Table 1's shape and every measurement's counts."""

from spirelib.engine.tau import TauStats
from spirelib.workbook.tables.decoding import acceptance_rows, table1_rows


def stats(mean, per_position=(0.8, 0.5)):
    return TauStats(mean=mean, ci95=0.05, n_contexts=6, std=0.1, rounds=40, acceptance_rate=0.4,
                    per_position=per_position, accepted_at=(32, 16), reached=(40, 32))


STATS = {"vanilla": {64: stats(2.0), 32: stats(2.25)}, "spire": {32: stats(3.5)}}


def test_table1_rows_longest_first_with_the_paper_where_it_has_that_length():
    rows = table1_rows(STATS, {64: {"vanilla": 2.6, "spire": 3.4}})
    assert [r["L"] for r in rows] == [64, 32]
    assert rows[0] == {"L": 64, "vanilla SD": "2.000 ± 0.050", "vanilla SD (paper)": "2.600", "SPIRe": "",
                       "SPIRe (paper)": "3.400"}
    assert rows[1]["SPIRe"] == "3.500 ± 0.050" and rows[1]["SPIRe (paper)"] == "—"
    assert table1_rows(STATS)[1] == {"L": 32, "vanilla SD": "2.250 ± 0.050", "SPIRe": "3.500 ± 0.050"}


def test_acceptance_rows_one_per_method_and_length():
    rows = acceptance_rows(STATS)
    assert [(r["method"], r["L"]) for r in rows] == [("vanilla", 32), ("vanilla", 64), ("spire", 32)]
    assert rows[0] == {"method": "vanilla", "L": 32, "n_contexts": 6, "rounds": 40, "tau": "2.250 ± 0.050",
                       "acceptance_rate": 0.4, "per_position": "0.800, 0.500"}
