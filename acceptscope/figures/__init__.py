"""THE figure library: every plotly figure the report, the dashboard and the notebook draw.

Why this package exists: figures sit in one layer above the estimators and below the surfaces, so the
estimators stay free of plotly and the core never imports the dashboard. ``tables`` draws straight from
the telemetry tables (through :class:`acceptscope.reader.Reader`), ``estimates`` draws estimator results
(:func:`figure_of` picks the figure for a result), ``regime`` sets an audit next to the SGLang blog.
"""

from acceptscope.figures import estimates, health, regime, tables, trim_regret  # health, trim_regret: figure_for
from acceptscope.figures.estimates import figure_for, figure_of

__all__ = ["estimates", "figure_for", "figure_of", "health", "regime", "tables", "trim_regret"]
