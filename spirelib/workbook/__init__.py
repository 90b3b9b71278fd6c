"""The workbook (layer 6, beside `bench`): the papermill runner, the HTML reports and their index, recorded
results, and the notebooks' tables, figures and widgets. Uses every layer below it
(docs/ARCHITECTURE.md)."""
