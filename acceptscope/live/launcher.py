"""Launch (or attach to) SGLang 0.5.23 DSpark servers for the two audit arms.

Why a data-first launcher: the command line and environment of each arm are
the experiment's definition (verify mode, info-dump components, estimator and
STS side files), so they are built as plain data (:class:`ArmSpec` ->
``argv()`` / ``env()``), validated against SGLang's own rules before anything
starts, and recorded in the run's ``config_json``. Process management
(:class:`ServerProcess`) is separate: own process group, logs to files,
readiness wait on ``/health`` then ``/server_info``, SIGTERM then SIGKILL.

SGLang facts encoded here (reference §1, §3.1, §5.1):
* the verify mode is the env var ``SGLANG_RAGGED_VERIFY_MODE``, not a flag;
* the info dump needs ``SGLANG_DSPARK_DEBUG_DUMP`` tokens from a fixed set;
* the block-accept estimator is silent under folded proposals, so an arm that
  records it also sets ``SGLANG_DSPARK_FOLDED_PROPOSAL=0``;
* STS collection needs a confidence head (not static) and refuses a loaded
  non-identity STS table;
* compact + attention-DP + a dense draft needs ``--disable-cuda-graph``;
* attention-DP needs ``--enable-dp-lm-head``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from acceptscope.live.http import FetchError, fetch
from acceptscope.schema import ARMS

INFO_COMPONENTS = ("core", "step_cpu_time", "step_gpu_time", "draft_gpu_time", "target_verify_gpu_time", "reqs")
DEFAULT_DUMP = ("core", "reqs", "step_cpu_time")
SGLANG_ENTRY = ("-m", "sglang.launch_server")


class LaunchConfigError(ValueError):
    """An arm configuration SGLang would refuse (or that would silently record nothing)."""


class SGLangUnavailable(RuntimeError):
    """sglang is not installed or no GPU is visible: the real stack cannot run here."""


class ServerStartError(RuntimeError):
    """The server process exited or did not become ready in time."""


@dataclass
class ArmSpec:
    """Everything needed to start one DSpark server arm. ``argv()``/``env()`` are pure."""

    arm: str
    target_model: str
    draft_model: str | None = None
    gamma: int = 7
    host: str = "127.0.0.1"
    port: int = 30000
    sps_table_path: str | None = None
    sts_table_path: str | None = None
    tp_size: int = 1
    attn_dp_size: int | None = None
    dense_draft: bool = True
    disable_cuda_graph: bool = False
    disable_overlap_schedule: bool = False
    enable_metrics: bool = True
    max_running_requests: int | None = None
    debug_dump: tuple[str, ...] = DEFAULT_DUMP
    estimator_path: str | None = None
    estimator_online_interval: int = 0
    sts_collect_stem: str | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    python: str = sys.executable

    # -- validation ---------------------------------------------------------
    def validate(self) -> list[str]:
        """Raise LaunchConfigError for configs SGLang rejects; return warnings for silent no-ops."""
        warnings: list[str] = []
        if self.arm not in ARMS:
            raise LaunchConfigError(f"arm {self.arm!r}: must be one of {ARMS}")
        if self.gamma <= 0:
            raise LaunchConfigError(f"gamma (--speculative-dspark-block-size) must be > 0, got {self.gamma}")
        if not self.target_model:
            raise LaunchConfigError("target_model (--model-path) is required")
        if not (0 < int(self.port) < 65536):
            raise LaunchConfigError(f"port {self.port} out of range")
        toks = [t.strip() for t in self.debug_dump if t.strip()]
        bad = [t for t in toks if t not in INFO_COMPONENTS and t != "all"]
        if bad:
            raise LaunchConfigError(
                f"SGLANG_DSPARK_DEBUG_DUMP tokens {bad} are invalid; valid: {list(INFO_COMPONENTS)} or 'all'"
            )
        if self.attn_dp_size is not None and self.attn_dp_size < 1:
            raise LaunchConfigError(f"--attn-dp-size must be positive, got {self.attn_dp_size}")
        dp_attn = (self.attn_dp_size or 1) > 1
        if self.arm == "compact" and dp_attn and self.dense_draft and not self.disable_cuda_graph:
            raise LaunchConfigError(
                "compact + attention-DP (--attn-dp-size > 1) with a dense (non-MoE) draft is refused by SGLang "
                "0.5.23 under CUDA graphs: set disable_cuda_graph=True (--disable-cuda-graph) or use the static arm"
            )
        sim = self.extra_env.get("SGLANG_SIMULATE_ACC_LEN")
        if self.estimator_path and sim not in (None, "", "-1") and float(sim) > 0:
            raise LaunchConfigError("the block-accept estimator cannot be combined with SGLANG_SIMULATE_ACC_LEN > 0")
        if self.sts_collect_stem:
            if self.arm == "static":
                raise LaunchConfigError(
                    "STS collection (SGLANG_DSPARK_STS_COLLECT_PATH) needs a confidence head; the static arm has none"
                )
            if self.sts_table_path:
                temps = read_sts_temperatures(self.sts_table_path)
                if any(t != 1.0 for t in temps):
                    raise LaunchConfigError(
                        f"{self.sts_table_path}: STS collection requires identity temperatures but this table is "
                        "non-identity; SGLang refuses it ('Collect pre-calibration logits with no table'). "
                        "Omit sts_table_path on the collecting arm"
                    )
            if self.arm == "compact":
                warnings.append("STS collection in compact: prefix labels are right-censored at verify_len (collect on cap-accept)")
        if self.sts_table_path:
            temps = read_sts_temperatures(self.sts_table_path)
            if len(temps) != self.gamma:
                raise LaunchConfigError(
                    f"{self.sts_table_path}: field 'temperatures' has {len(temps)} entries but gamma is {self.gamma}; "
                    "SGLang refuses a table fit for another gamma"
                )
            if self.arm == "static":
                warnings.append("STS table is ignored by SGLang in static mode (no confidence head)")
        if self.sps_table_path and self.arm == "static":
            warnings.append("SPS table is a no-op in static mode")
        if self.arm == "compact" and not self.sps_table_path:
            warnings.append("compact without an SPS table degenerates to verify-all (zero scheduling gain)")
        if self.estimator_path and not self.disable_cuda_graph:
            warnings.append(
                "estimator records only with SGLANG_DSPARK_FOLDED_PROPOSAL=0 (set) and only non-greedy, "
                "pure-temperature rows of TP rank 0"
            )
        if self.arm == "static" and self.debug_dump and "reqs" in self.debug_dump:
            warnings.append("static arm: reqs carry no confidence/survival (no head)")
        return warnings

    # -- command line -------------------------------------------------------
    def argv(self, entry: Sequence[str] | None = None) -> list[str]:
        """The full command line; ``entry`` replaces ``[python, -m, sglang.launch_server]`` (tests)."""
        cmd = list(entry) if entry is not None else [self.python, *SGLANG_ENTRY]
        cmd += ["--model-path", self.target_model, "--host", self.host, "--port", str(self.port)]
        cmd += ["--speculative-algorithm", "DSPARK"]
        if self.draft_model:
            cmd += ["--speculative-draft-model-path", self.draft_model]
        cmd += ["--speculative-dspark-block-size", str(self.gamma)]
        if self.sps_table_path:
            cmd += ["--speculative-dspark-sps-table-path", str(self.sps_table_path)]
        if self.sts_table_path:
            cmd += ["--speculative-dspark-confidence-sts-path", str(self.sts_table_path)]
        if self.tp_size != 1:
            cmd += ["--tp-size", str(self.tp_size)]
        if (self.attn_dp_size or 1) > 1:
            cmd += ["--attn-dp-size", str(self.attn_dp_size), "--enable-dp-lm-head"]
        if self.max_running_requests is not None:
            cmd += ["--max-running-requests", str(self.max_running_requests)]
        if self.disable_cuda_graph:
            cmd.append("--disable-cuda-graph")
        if self.disable_overlap_schedule:
            cmd.append("--disable-overlap-schedule")
        if self.enable_metrics:
            cmd.append("--enable-metrics")
        cmd += list(self.extra_args)
        return cmd

    def env(self) -> dict[str, str]:
        """Environment variables this arm sets (on top of the parent's environment)."""
        e: dict[str, str] = {"SGLANG_RAGGED_VERIFY_MODE": self.arm}
        if self.debug_dump:
            e["SGLANG_DSPARK_DEBUG_DUMP"] = ",".join(self.debug_dump)
        if self.estimator_path:
            e["SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH"] = str(self.estimator_path)
            e["SGLANG_DSPARK_FOLDED_PROPOSAL"] = "0"
        if self.estimator_online_interval > 0:
            e["SGLANG_DSPARK_BLOCK_ACCEPT_ONLINE_INTERVAL"] = str(self.estimator_online_interval)
        if self.sts_collect_stem:
            e["SGLANG_DSPARK_STS_COLLECT_PATH"] = str(self.sts_collect_stem)
        e.update({k: str(v) for k, v in self.extra_env.items()})
        return e

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def to_config(self) -> dict[str, Any]:
        """JSON-able description for the run's config_json."""
        d = asdict(self)
        d["argv"] = self.argv()
        d["env"] = self.env()
        return d


def read_sts_temperatures(path: str | os.PathLike) -> list[float]:
    """The ``temperatures`` list of an STS JSON, with a clear error naming the file and field."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except FileNotFoundError:
        raise LaunchConfigError(f"{p}: STS table not found") from None
    except json.JSONDecodeError as e:
        raise LaunchConfigError(f"{p}:{e.lineno}: invalid JSON ({e.msg})") from None
    temps = obj.get("temperatures") if isinstance(obj, dict) else None
    if not isinstance(temps, list) or not temps or not all(isinstance(t, (int, float)) and t > 0 for t in temps):
        raise LaunchConfigError(f"{p}: field 'temperatures' must be a non-empty list of positive numbers")
    return [float(t) for t in temps]


def audit_arms(
    target_model: str,
    draft_model: str | None,
    gamma: int,
    *,
    out_dir: str | os.PathLike,
    base_port: int = 30000,
    host: str = "127.0.0.1",
    sps_table_path: str | None = None,
    sts_table_path: str | None = None,
    attn_dp_size: int | None = None,
    dense_draft: bool = True,
    disable_cuda_graph: bool = False,
    record_estimator: tuple[str, ...] = ("compact", "cap-accept"),
    collect_sts: bool = True,
) -> tuple[ArmSpec, ArmSpec]:
    """The compact (production) and cap-accept (measurement) arms of one audit.

    Both record the info dump (core, reqs, step_cpu_time; cap-accept also the GPU
    timing components). The estimator JSONL is recorded on the arms named in
    ``record_estimator``. STS shards are collected on cap-accept (uncensored
    labels) only when no non-identity STS table is loaded, per SGLang's guard.
    """
    out = Path(out_dir)
    cuda_graph_off = disable_cuda_graph or ((attn_dp_size or 1) > 1 and dense_draft)
    common = dict(
        target_model=target_model, draft_model=draft_model, gamma=gamma, host=host,
        sps_table_path=sps_table_path, sts_table_path=sts_table_path, attn_dp_size=attn_dp_size,
        dense_draft=dense_draft,
    )
    compact = ArmSpec(
        arm="compact", port=base_port, disable_cuda_graph=cuda_graph_off,
        estimator_path=str(out / "compact.estimator.jsonl") if "compact" in record_estimator else None,
        **common,
    )
    sts_identity = sts_table_path is None or all(t == 1.0 for t in read_sts_temperatures(sts_table_path))
    cap = ArmSpec(
        arm="cap-accept", port=base_port + 1, disable_cuda_graph=disable_cuda_graph,
        debug_dump=("core", "reqs", "step_cpu_time", "step_gpu_time", "draft_gpu_time", "target_verify_gpu_time"),
        estimator_path=str(out / "cap-accept.estimator.jsonl") if "cap-accept" in record_estimator else None,
        sts_collect_stem=str(out / "cap-accept.sts") if (collect_sts and sts_identity) else None,
        **common,
    )
    return compact, cap


# ---------------------------------------------------------------------------
# preflight
# ---------------------------------------------------------------------------
def gpu_available() -> tuple[bool, str]:
    """(available, how we know): torch.cuda first, then nvidia-smi."""
    try:
        import torch

        if torch.cuda.is_available():
            return True, f"torch.cuda: {torch.cuda.device_count()} device(s)"
    except Exception as e:  # noqa: BLE001 - torch import problems mean 'no'
        reason = f"torch import failed: {e}"
    else:
        reason = "torch.cuda.is_available() is False"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and "GPU" in out.stdout:
                return True, "nvidia-smi: " + out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return False, reason + "; nvidia-smi not found or lists no GPU"


def preflight() -> None:
    """Raise SGLangUnavailable with a clear message unless sglang and a GPU are both present."""
    if importlib.util.find_spec("sglang") is None:
        raise SGLangUnavailable(
            "sglang is not installed in this environment: `pip install 'acceptscope[sglang-gpu]'` "
            "(sglang==0.5.23) on a GPU machine, or attach to a running server with --url"
        )
    ok, how = gpu_available()
    if not ok:
        raise SGLangUnavailable(f"no GPU visible ({how}); SGLang DSpark needs CUDA. Attach with --url instead")


# ---------------------------------------------------------------------------
# process management
# ---------------------------------------------------------------------------
def wait_ready(base_url: str, timeout_s: float, *, proc: subprocess.Popen | None = None, interval_s: float = 0.5) -> dict:
    """Poll ``/health`` until 200, then return ``/server_info``; raise ServerStartError on timeout or exit."""
    deadline = time.monotonic() + timeout_s
    last = "no response"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerStartError(f"server process exited with code {proc.returncode} before becoming ready")
        try:  # (the one bounded client: no request runs past the readiness deadline)
            r = fetch(base_url + "/health", deadline_s=5, max_bytes=1 << 20, until=deadline)
            if r.status == 200:
                return fetch(base_url + "/server_info", deadline_s=30, until=deadline).json()
            last = f"/health HTTP {r.status}"
        except (FetchError, ValueError) as e:
            last = type(e).__name__
        time.sleep(interval_s)
    raise ServerStartError(f"{base_url} not ready after {timeout_s:.0f}s (last: {last})")


def health(base_url: str, timeout_s: float = 5.0) -> bool:
    """True when ``/health`` answers 200."""
    try:
        return fetch(base_url + "/health", deadline_s=timeout_s, max_bytes=1 << 20).status == 200
    except FetchError:
        return False


class ServerProcess:
    """One launched server: own process group, logs to files, clean stop.

    ``entry`` overrides the ``python -m sglang.launch_server`` prefix (tests run
    tests/fake_sglang_server.py); with an override the sglang/GPU preflight is skipped.
    """

    def __init__(self, spec: ArmSpec, log_dir: str | os.PathLike, *, entry: Sequence[str] | None = None):
        self.spec = spec
        self.entry = list(entry) if entry is not None else None
        self.log_dir = Path(log_dir)
        self.proc: subprocess.Popen | None = None
        self.stdout_path = self.log_dir / f"{spec.arm}.stdout.log"
        self.stderr_path = self.log_dir / f"{spec.arm}.stderr.log"
        self.warnings: list[str] = []
        self._files: list[Any] = []

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    def start(self) -> "ServerProcess":
        self.warnings = self.spec.validate()
        if self.entry is None:
            preflight()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.spec.env())
        out = open(self.stdout_path, "ab")
        err = open(self.stderr_path, "ab")
        self._files = [out, err]
        self.proc = subprocess.Popen(
            self.spec.argv(self.entry), env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    def wait_ready(self, timeout_s: float = 600.0) -> dict:
        try:
            return wait_ready(self.base_url, timeout_s, proc=self.proc)
        except ServerStartError as e:
            raise ServerStartError(f"{e}; see {self.stderr_path}") from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        return self.alive() and health(self.base_url)

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the process group, then SIGKILL after ``grace_s``; returns the exit code."""
        if self.proc is None:
            return None
        try:
            if self.proc.poll() is None:
                pgid = os.getpgid(self.proc.pid)
                os.killpg(pgid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    os.killpg(pgid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        finally:
            for f in self._files:
                f.close()
            self._files = []
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
