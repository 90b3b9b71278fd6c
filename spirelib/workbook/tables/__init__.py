"""The rows of the notebooks' tables and the results they record, one module per topic (as
`plots/` builds the figures): notebooks call these and display the rows with
`display.show_table(rows, COLUMNS)`, each module's COLUMNS naming the headers, and record
what they summarize with `results.record_all`. The words beside them are `narrative/`'s; what
they are computed from, `throughput/`'s and `measure/`'s."""
