"""Plotly figure builders and ipywidgets explorers, one module per topic."""

