"""The Jinja2 environment over templates/ (autoescaped; a missing name fails): `render` turns a template
and its data into HTML, for the run index (`report`) and the live explorer's summary (`plots.explorer`)
alike. It imports no notebook stack (nbformat, nbconvert), so a notebook's kernel loads only Jinja."""

from __future__ import annotations

import json
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

TEMPLATES = Environment(loader=PackageLoader("spirelib.workbook", "templates"), autoescape=select_autoescape(["html"]),
                        undefined=StrictUndefined)
# What the templates format with (Python's format specs, json.dumps) and the JSON types they tell apart
# (macros.html's `value`) as Python does
TEMPLATES.filters.update(fmt=format, json=json.dumps)
TEMPLATES.tests.update(dict=lambda v: isinstance(v, dict), list=lambda v: isinstance(v, list),
                       container=lambda v: isinstance(v, (dict, list)),
                       json_literal=lambda v: isinstance(v, (bool, int)) or v is None)


def render(template: str, **context) -> str:
    """The HTML of templates/`template` (autoescaped) with `context`."""
    return TEMPLATES.get_template(template).render(**context)


def render_value(value: Any, max_items: int = 12) -> str:
    """Readable HTML for a JSON value: dicts as key/value tables, short lists inline (templates/macros.html)."""
    return TEMPLATES.get_template("macros.html").module.value(value, max_items)
