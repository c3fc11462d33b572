"""The report's Jinja2 environment: the templates in ``shoal/report/templates``, autoescaped.

``report.html.j2`` is the page; ``macros.html.j2`` holds its building blocks
(an inlined image, a section frame, the routing tables), which other code
may render on their own.
"""

from __future__ import annotations

import json
from functools import cache

import jinja2


@cache
def environment() -> jinja2.Environment:
    """The report's templates, autoescaped: every value from a run is text, never markup."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("shoal.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "html.j2"]), keep_trailing_newline=True)
    env.tests["json"] = lambda value: isinstance(value, (dict, list))
    env.filters["tojson_text"] = json.dumps
    return env


def template() -> jinja2.Template:
    """The report page."""
    return environment().get_template("report.html.j2")


def macro(name: str) -> jinja2.runtime.Macro:
    """One of the page's building blocks, to render on its own (``macro("routing_tables")(data)``)."""
    return getattr(environment().get_template("macros.html.j2").module, name)
