"""What every panel receives: the file, the selection, and cached loaders keyed on the data version."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~$:])")


def plain(value: Any) -> str:
    """``value`` as literal text inside Streamlit markdown (st.info/error/caption, help tooltips).

    Streamlit never renders raw HTML there, but markdown is still markup: a run id, workload name
    or error message (all data) could otherwise draw links, images or LaTeX. Every markdown
    metacharacter is backslash-escaped, so it shows exactly as stored.
    """
    return _MD_SPECIAL.sub(r"\\\1", str(value))


@dataclass
class Ctx:
    db: str
    version: tuple
    run_ids: tuple[str, ...]
    runs: pd.DataFrame  # all runs in the file (run picker source)
    load: Callable[..., Any]  # load(method_name, *args) -> cached Reader.<method>(*args)
    workloads: tuple[str, ...] = ()  # workload filter (empty: all)

    def q(self, method: str, *args: Any) -> Any:
        return self.load(self.db, self.version, method, *args)

    def arm_of(self, run_id: str) -> str:
        m = self.runs.set_index("run_id")["arm"]
        return str(m.get(run_id, "?"))

    def role_of(self, run_id: str) -> str:
        """production | audit | calibration | curve (acceptscope.schema.ROLES)."""
        m = self.runs.set_index("run_id")["role"] if "role" in self.runs else {}
        return str(m.get(run_id, "?"))

    def whole_run_note(self, what: str) -> str | None:
        """With a workload filter on: the caption of a view that cannot be split by workload."""
        if not self.workloads:
            return None
        return f"{what} cover every workload of the run: the workload filter does not split them."

    def by_workload(self, df: pd.DataFrame) -> pd.DataFrame:
        if not self.workloads or "workload" not in df.columns:
            return df
        return df[df["workload"].isin(self.workloads)]
