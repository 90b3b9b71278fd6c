"""The winner of a (B, L) cell (`throughput.winners`) and a grid's values in words (`narrative.winners`):
AD wins where no method reaches 1, a measured cell's winner counts only when the clock resolves it,
and the cells won are counted per method, cells without a result left out."""

from spirelib.throughput.recorded import RecordedCell
from spirelib.throughput.winners import AD, by_cell, grid_counts, resolved, unresolved_cells, winner
from spirelib.workbook.narrative.winners import pow2, span


def cell(method, B, L, speedup, low, high):
    return RecordedCell(method=method, B=B, L=L, measured_speedup=speedup, ci_low=low, ci_high=high)


CELLS = [cell("spire", 1, 64, 1.5, 1.4, 1.6), cell("vanilla", 1, 64, 1.2, 1.1, 1.3),  # resolved: SPIRe
         cell("spire", 2, 64, 1.3, 1.1, 1.5), cell("vanilla", 2, 64, 1.2, 1.1, 1.3),  # overlapping CIs
         cell("spire", 2, 256, 0.8, 0.7, 0.9), RecordedCell(method="vanilla", B=2, L=256, measured_speedup=None)]


def test_a_method_wins_only_at_a_multiplier_of_1_or_more():
    assert winner({"spire": 1.0, "vanilla": 0.5}) == "spire"
    assert winner({"spire": 0.99, "vanilla": 0.5}) == AD


def test_cells_group_per_b_and_l_without_the_records_that_lack_the_speedup():
    grouped = by_cell(CELLS, "measured_speedup")
    assert grouped == {(1, 64): {"spire": 1.5, "vanilla": 1.2}, (2, 64): {"spire": 1.3, "vanilla": 1.2},
                       (2, 256): {"spire": 0.8}}


def test_a_winner_is_resolved_only_when_its_interval_clears_every_other_and_ad():
    assert resolved({"spire": 1.5, "vanilla": 1.2}, {"spire": 1.4, "vanilla": 1.1}, {"spire": 1.6, "vanilla": 1.3})
    assert not resolved({"spire": 1.5, "vanilla": 1.2}, {"spire": 1.25, "vanilla": 1.1},
                        {"spire": 1.6, "vanilla": 1.3})  # the CIs overlap
    assert resolved({"spire": 0.8}, {"spire": 0.7}, {"spire": 0.9})  # AD, every CI below 1
    assert not resolved({"spire": 1.5}, {}, {})  # no interval recorded
    assert unresolved_cells(CELLS, [1, 2], [64, 256]) == {(1, 0)}  # (B = 2, L = 64)


def test_cells_won_are_counted_per_method_most_first_without_the_empty_ones():
    assert grid_counts([["ad", "spire", "-"], ["spire", "spire", "ad"]]) == {"spire": 3, "ad": 2}
    assert list(grid_counts([["ad", "spire", "spire"]])) == ["spire", "ad"]


def test_grid_values_in_short():
    assert [pow2(v) for v in (64, 1024, 2048, 3000, 2 ** 20)] == ["64", "1K", "2K", "3000", "1M"]
    assert span([32, 64, 8192]) == "32..8K" and span([1, 2]) == "1, 2"
