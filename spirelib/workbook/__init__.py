"""The workbook (layer 4): the papermill runner, the HTML reports and their index, recorded
results, and the notebooks' tables, figures and widgets. Uses every layer below it
(docs/ARCHITECTURE.md)."""
