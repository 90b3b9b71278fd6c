"""The rows of the notebooks' tables and the numbers they summarize, one module per topic
(as `plots/` builds the figures): notebooks call these and display the rows with
`display.show_table(rows, COLUMNS)`, each module's COLUMNS naming the headers, and record
what they summarize with `record_all`."""

from spirelib.results import record


def record_all(results: dict) -> None:
    """`results.record(key, value)` for every item of `results`, in order (one call for a
    cell's several results; the keys are results.json's)."""
    for key, value in results.items():
        record(key, value)
