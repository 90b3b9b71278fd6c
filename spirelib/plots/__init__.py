"""Plotly figure builders and ipywidgets explorers, one module per topic."""

import os

#: Set by the workbook runner for the kernels it starts: no live frontend will ever show a
#: widget there, and nbclient can hang on widget comm traffic (jupyter/nbclient#312).
HEADLESS_ENV = "SPIRE_HEADLESS"


def live_frontend() -> bool:
    """Whether a person may be looking at this kernel (JupyterLab), so live widgets make sense."""
    return os.environ.get(HEADLESS_ENV) != "1"
