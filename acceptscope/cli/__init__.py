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

# The numeric libraries' process-wide settings for a command's process, each read when its library first
# loads (no command module loads one before a command runs: tests/test_packaging.py); a value the user set
# is kept. Measured on `estimate` over a fleet of 23 runs, 2M request-steps (docs/scale.md §11): 32.2 -> 27.6
# CPU-s with the three, the same JSON bit for bit, peak 1,157 -> 1,069 MB.
PROCESS_DEFAULTS = {
    # numpy asks for 2 MB pages for every array over 4 MB and the kernel clears a whole page at its first
    # touch: the estimators' short-lived replicate arrays made that a fifth of the CPU (system time)
    "NUMPY_MADVISE_HUGEPAGE": "0",
    # the same for Arrow's buffers in pyarrow's default (mimalloc) arenas: 0.6 of a 125k-row run's 4 CPU-s
    "ARROW_DEFAULT_MEMORY_POOL": "system",
    # the estimators' matrix products are small (a replicate block by a chunk's requests): OpenBLAS's
    # threads spin waiting for work (blas_thread_server, 6% of the CPU) and change no number
    "OPENBLAS_NUM_THREADS": "1",
}
for _name, _value in PROCESS_DEFAULTS.items():
    os.environ.setdefault(_name, _value)

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
