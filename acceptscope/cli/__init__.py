"""The ``acceptscope`` command line.

One module per command group; each defines ``register(app)``. Modules import
their heavy dependencies (torch, streamlit, estimators) inside the command
functions so that ``acceptscope --help`` stays fast; everything else at module
top. The measured costs are ``LAZY_IMPORTS`` in tests/test_layers.py.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

import typer
from typer.models import OptionInfo

from acceptscope.console import one_line
from acceptscope.exit_codes import EXIT_FAILURE

# 4 kB pages for numpy's arrays in this process (numpy's own switch, read when numpy is first imported: no
# command module imports it before a command runs; a value the user set is kept). Why: numpy asks for
# 2 MB pages for every array over 4 MB, and the kernel clears a whole 2 MB page at its first touch; the
# estimators' short-lived replicate arrays made that a quarter of `estimate`'s CPU over a fleet of runs
# (system time 10.1 of 41.9 CPU-s; 6.3 of 36.5 with 4 kB pages, the same peak and the same JSON; docs/scale.md §11)
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

app = typer.Typer(
    name="acceptscope",
    help=(
        "Observability and block-accept estimation for DSpark speculative decoding.\n\n"
        "Typical audit:  acceptscope audit --engine reference --workload mixed --db audit.duckdb"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # plain click help: paragraphs rewrapped to the terminal (rich kept our line breaks and wrapped again,
    # ragged at 80 columns) and square brackets kept ("the [spark] extra"; rich read them as markup)
    rich_markup_mode=None,
)

# Command modules, in --help order. A module listed here that does not exist yet is skipped.
_COMMAND_MODULES = (
    "audit",
    "run",
    "ingest",
    "estimate",
    "calibrate",
    "report",
    "dashboard",
    "export",
    "train",
    "profile",
    "live",
)

for _name in _COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"acceptscope.cli.{_name}")
    except ModuleNotFoundError as e:  # only tolerate the module itself being absent
        if e.name != f"acceptscope.cli.{_name}":
            raise
        continue
    _mod.register(app)

# an option's type word when it names none: typer labels flags "<bool>" and ranges "<int range>"
_METAVARS = {"bool": "", "Path": "PATH", "int": "INT", "float": "FLOAT", "str": "TEXT"}


def _plain_metavars(t: typer.Typer) -> None:
    """Flags show no metavar and valued options a plain word (PATH, INT, FLOAT, TEXT) in every --help."""
    for info in t.registered_commands:
        for prm in inspect.signature(info.callback).parameters.values():
            opt = prm.default
            if isinstance(opt, OptionInfo) and opt.metavar is None:
                word = str(prm.annotation).replace("Optional[", "").split(" |")[0].split("[")[0].strip("]")
                if word in _METAVARS:
                    opt.metavar = _METAVARS[word]
    for group in t.registered_groups:
        _plain_metavars(group.typer_instance)


_plain_metavars(app)


def main() -> None:  # pragma: no cover - console entry point
    """Run the command; a failure nothing below caught is one line on stderr and exit 1 (130 on Ctrl-C),
    never a traceback (``ACCEPTSCOPE_DEBUG=1`` re-raises it)."""
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("acceptscope: interrupted\n")
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the last line of defence; every command should catch its own
        if os.environ.get("ACCEPTSCOPE_DEBUG"):
            raise
        sys.stderr.write("acceptscope: " + one_line(e) + "\n")
        sys.exit(EXIT_FAILURE)
