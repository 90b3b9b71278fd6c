"""Notebook 09's figure (`plots.measured.speedup_scatter`) plots exactly the cells it is given: each
measured speedup with its own 95% CI against each prediction, a cell without that prediction left out."""

from spirelib.throughput.recorded import RecordedCell
from spirelib.workbook.plots.measured import speedup_scatter

CELLS = [RecordedCell(method="spire", B=1, L=32, measured_speedup=1.2, ci_low=1.1, ci_high=1.5, modeled_speedup=1.6,
                      profiled_speedup=1.25),
         RecordedCell(method="spire", B=2, L=64, measured_speedup=0.9, ci_low=0.8, ci_high=0.95, modeled_speedup=1.4,
                      profiled_speedup=0.85, held_out=True),
         RecordedCell(method="vanilla", B=1, L=32, measured_speedup=1.05, ci_low=1.0, ci_high=1.1, modeled_speedup=1.3)]
PREDICTIONS = {"modeled_speedup": "paper's model", "profiled_speedup": "profiled model"}


def test_each_prediction_and_method_is_a_trace_of_its_cells_with_their_own_intervals():
    fig = speedup_scatter(CELLS, PREDICTIONS, scale="tiny models; cpu")
    traces = {t.name: t for t in fig.data}
    assert list(traces) == ["SPIRe, paper's model", "vanilla SD, paper's model", "SPIRe, profiled model",
                            "vanilla SD, profiled model", "prediction exact"]
    spire = traces["SPIRe, profiled model"]
    assert list(spire.x) == [1.25, 0.85] and list(spire.y) == [1.2, 0.9]
    assert [round(v, 9) for v in spire.error_y.array] == [0.3, 0.05]  # up to each CI's high end
    assert [round(v, 9) for v in spire.error_y.arrayminus] == [0.1, 0.1]  # down to its low end
    assert [list(c) for c in spire.customdata] == [[1, 32, "fitted"], [2, 64, "held out"]]
    assert len(traces["vanilla SD, profiled model"].x) == 0  # no profiled prediction: not plotted
    assert list(traces["prediction exact"].x) == [0, 1.1 * 1.6]  # the diagonal spans every value plotted
    assert "tiny models; cpu" in fig.layout.title.text
