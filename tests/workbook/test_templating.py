"""The Jinja2 environment: autoescaped values, JSON types told apart as Python does, no notebook stack."""

from __future__ import annotations

from spirelib.workbook import templating


def test_render_value_escapes_and_folds_long_lists():
    assert templating.render_value("<b>") == "&lt;b&gt;"
    assert templating.render_value(1 / 3) == "<span class='num'>0.333333</span>"
    assert templating.render_value(list(range(100))).startswith("<details><summary>list of 100</summary>")
