"""The rows of the notebooks' tables and the numbers they summarize, one module per topic
(as `plots/` builds the figures): notebooks call these and display the rows with
`display.show_table(rows, COLUMNS)`, each module's COLUMNS naming the headers, and record
what they summarize with `results.record_all`."""
