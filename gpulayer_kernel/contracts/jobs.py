"""Job contracts: what a user submits (JobSpec) and what the control plane knows (Job)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, JsonValue, field_validator, model_validator

from ..display import human_bytes
from ._base import SHA256_PATTERN, Contract, ensure_json
from .artifacts import Artifact
from .costs import AttemptRecord
from .limits import MAX_LINE_CHARS
from .scheduling import PlacementReport
from .workspace import WorkspaceSource

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")


def _env_names(v: dict[str, str]) -> dict[str, str]:
    for key in v:
        if not ENV_NAME_RE.match(key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
    return v


def _secret_names(v: list[str]) -> list[str]:
    for key in v:
        if not ENV_NAME_RE.match(key):
            raise ValueError(f"{key!r} is not a valid secret name (letters, digits, _)")
    return v


def _label_keys(v: dict[str, str]) -> dict[str, str]:
    for key in v:
        if not LABEL_KEY_RE.match(key):
            raise ValueError(f"{key!r} is not a valid label key")
    return v


# The fields a job and a session share (a session's are its job's), checked the same way.
EnvVars = Annotated[dict[str, str], AfterValidator(_env_names)]
SecretNames = Annotated[list[str], AfterValidator(_secret_names)]
Labels = Annotated[dict[str, str], AfterValidator(_label_keys)]
# Linux's MAX_ARG_STRLEN (32 pages) for one argv/environ string; a total well under the usual
# 2 MiB ARG_MAX leaves room for the environment the worker adds itself.
MAX_ARG_STRLEN = 128 * 1024
MAX_EXEC_BYTES = 1024 * 1024
DEFAULT_IDLE_TIMEOUT = 1800.0  # seconds (30 min): an idle session frees its GPUs after this
MAX_IDLE_TIMEOUT = 7 * 24 * 3600.0

MimeBundle = dict[str, JsonValue]
"""One display as Jupyter's display content: ``{"data": {"text/plain": "...", "image/png":
"<base64>", ...}, "metadata": {...}}`` (``transient`` and ``update`` when set)."""
# The user of the embedded, single-user default and the first admin of a served control plane:
# whatever predates users (jobs, client tokens, secrets) belongs to this one.
ADMIN_USER = "admin"


class JobState(StrEnum):
    QUEUED = "queued"
    PLACED = "placed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST}
)


class Resources(Contract):
    """What a job needs. ``gpus`` is per node; ``nodes`` > 1 makes a multi-node gang."""

    gpus: int = Field(0, ge=0, le=64)
    gpu_kind: list[str] = Field(
        default_factory=list, description="acceptable GPU kinds, tried in the order given"
    )
    gpu_memory_min: int | None = Field(None, ge=0, description="bytes per GPU")
    cpus: float | None = Field(None, gt=0)
    nodes: int = Field(1, ge=1, le=64)
    fallback: list[Literal["cpu"]] = Field(
        default_factory=list, description='["cpu"] lets a GPU job run on a CPU-only worker'
    )
    selector: dict[str, str] = Field(
        default_factory=dict, description="worker labels that must all match"
    )
    worker: str | None = Field(None, description="run only on the worker with this name")

    @field_validator("gpu_kind")
    @classmethod
    def _kinds_lower(cls, v: list[str]) -> list[str]:
        return [k.strip().lower() for k in v if k.strip()]

    @model_validator(mode="after")
    def _nodes_need_gpus(self) -> Resources:
        if self.nodes > 1 and self.gpus == 0:
            raise ValueError("nodes > 1 needs gpus >= 1 per node")
        return self


class CommandWorkload(Contract):
    """Run an argv as it is (no shell); with ``bundle``, inside that bundle unpacked."""

    kind: Literal["command"] = "command"
    argv: list[str] = Field(min_length=1)
    bundle: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="a content-addressed bundle (`gpulayer run --files`), unpacked on the "
        "worker as the command's working directory (instead of `workdir`)",
    )
    workspace: WorkspaceSource | None = Field(
        None,
        description="the notebook's folder (ADR 0022): the job runs in it, in place, or in a "
        "copy on a worker that does not see it (left out when none)",
        exclude_if=lambda v: v is None,
    )

    @field_validator("argv")
    @classmethod
    def _no_empty_program(cls, v: list[str]) -> list[str]:
        if not v[0]:
            raise ValueError("argv[0] (the program) is empty")
        return v


class PythonWorkload(Contract):
    """Run Python from a content-addressed bundle.

    ``entrypoint`` is ``"pkg.mod:func"`` (called with ``**args``; its return value is the result),
    a script path inside the bundle (``"train.py"``, run as ``__main__`` with ``args`` available
    through ``gpulayer_kernel.job.args()``), or ``"cell:<file>"`` (a notebook cell: the value of
    its last expression is the result).
    """

    kind: Literal["python"] = "python"
    bundle: str = Field(pattern=SHA256_PATTERN)
    entrypoint: str = Field(min_length=1, max_length=500)
    args: dict[str, JsonValue] = Field(default_factory=dict)
    workspace: WorkspaceSource | None = Field(
        None,
        description="the notebook's folder (ADR 0022): the job runs in it, in place, or in a "
        "copy on a worker that does not see it (left out when none)",
        exclude_if=lambda v: v is None,
    )

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_shape(cls, v: str) -> str:
        if v.startswith("cell:") or v.endswith(".py"):
            path = v.removeprefix("cell:")
            if path.startswith("/") or ".." in path.split("/"):
                raise ValueError("script path must be relative and inside the bundle")
            return v
        mod, sep, func = v.partition(":")
        ident = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
        if not sep or not all(ident.match(p) for p in mod.split(".")) or not ident.match(func):
            raise ValueError('must be "package.module:function", "script.py" or "cell:file.py"')
        return v

    @field_validator("args", mode="before")
    @classmethod
    def _args_are_json(cls, v: Any) -> Any:
        return ensure_json(v, "args")


class SessionWorkload(Contract):
    """The workload of a session's job: processes that keep state until stopped or idle."""

    kind: Literal["session"] = "session"
    idle_timeout: float = Field(
        DEFAULT_IDLE_TIMEOUT,
        gt=0,
        le=MAX_IDLE_TIMEOUT,
        description="seconds without a running cell after which the session ends and frees "
        "its GPUs",
    )
    kernel: bool = Field(
        False,
        description="a GPU kernel (ADR 0021): rank 0 is an ipykernel whose messages the control "
        "plane relays, in place of the session's cells (left out when false)",
        # A worker from before GPU kernels forbids unknown fields: a session must look as it did.
        exclude_if=lambda v: not v,
    )
    workspace: WorkspaceSource | None = Field(
        None,
        description="the notebook's folder (ADR 0022): the ranks run in it, in place or synced "
        "(left out when none)",
        exclude_if=lambda v: v is None,
    )


Workload = Annotated[
    CommandWorkload | PythonWorkload | SessionWorkload, Field(discriminator="kind")
]
RetryCause = Literal["lost", "preempted", "failed"]


def _default_retry_on() -> list[RetryCause]:
    return ["lost", "preempted"]


class JobSpec(Contract):
    """What a user asks for. Validated strictly: an unknown field is an error naming it."""

    name: str = Field("job", min_length=1, max_length=200)
    workload: Workload
    resources: Resources = Field(default_factory=Resources)
    env: EnvVars = Field(default_factory=dict)
    secrets: SecretNames = Field(default_factory=list, description="names resolved on the worker")
    timeout: float | None = Field(None, gt=0, description="seconds; the job is killed past it")
    retries: int = Field(
        0,
        ge=0,
        le=10,
        description="opt-in re-runs after a failure of a kind in `retry_on` (ADR 0011); a gang "
        "(multi-GPU) job only with `retry_gang`",
    )
    retry_on: list[RetryCause] = Field(
        default_factory=_default_retry_on,
        description='which failures retry: "lost" (its worker stopped answering), "preempted" '
        '(its instance was taken back), "failed" (any failing exit, timeouts included)',
    )
    retry_exit_codes: list[int] = Field(
        default_factory=list,
        max_length=64,
        description="failing exits with these codes retry too (without `failed` in `retry_on`)",
    )
    retry_backoff: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="seconds before the first retry; doubled each attempt, capped by "
        "`retry_backoff_max`, with jitter (a random half of it)",
    )
    retry_backoff_max: float = Field(300.0, ge=0, le=86400)
    retry_gang: bool = Field(
        False, description="let a gang be retried too (gangs fail fast and never retry unless)"
    )
    labels: Labels = Field(default_factory=dict)
    priority: int = Field(0, ge=-1000, le=1000)
    workdir: str | None = Field(
        None,
        description="directory on the worker to run a command in (it must exist there); "
        "default: the job's own scratch directory",
    )
    wait_for_capacity: bool = Field(
        False,
        description="keep waiting when no worker can ever run the job as asked (one may join); "
        "otherwise such a job fails at once, saying what exists",
    )

    @model_validator(mode="after")
    def _exec_safe(self) -> JobSpec:
        # What reaches execve must be representable there: a NUL byte cannot be passed, and
        # Linux refuses one string over MAX_ARG_STRLEN or an argv+environ past ARG_MAX. Refuse
        # at submit, naming the field, rather than fail later on the worker as "worker error".
        strings: list[tuple[str, str]] = [("name", self.name)]
        if isinstance(self.workload, CommandWorkload):
            strings += [(f"workload.argv[{i}]", a) for i, a in enumerate(self.workload.argv)]
        elif isinstance(self.workload, PythonWorkload):
            strings.append(("workload.entrypoint", self.workload.entrypoint))
        strings += [(f"env[{k!r}]", f"{k}={v}") for k, v in self.env.items()]
        strings += [(f"labels[{k!r}]", f"{k}={v}") for k, v in self.labels.items()]
        if self.workdir is not None:
            strings.append(("workdir", self.workdir))
        total = 0
        for field, text in strings:
            if "\x00" in text:
                raise ValueError(f"{field} contains a NUL byte, which no process can be given")
            size = len(text.encode()) + 1
            if size > MAX_ARG_STRLEN:
                raise ValueError(
                    f"{field} is {human_bytes(size)}; one argument or variable may be at most "
                    f"{human_bytes(MAX_ARG_STRLEN)} (pass large data in a file or artifact)"
                )
            total += size
        if total > MAX_EXEC_BYTES:
            raise ValueError(
                f"argv and env add up to {human_bytes(total)}; the limit is "
                f"{human_bytes(MAX_EXEC_BYTES)} "
                "(pass large data in a file or artifact)"
            )
        return self

    @property
    def is_gang(self) -> bool:
        """A job with more than one rank: it gets all its devices at once, and never retries."""
        return self.resources.gpus > 1 or self.resources.nodes > 1

    @property
    def is_session(self) -> bool:
        """A session (ADR 0019): placed like a job, holds its devices until it is stopped."""
        return isinstance(self.workload, SessionWorkload)


class NodePlacement(Contract):
    """One worker's share of a placed job."""

    worker_id: str
    worker_name: str
    devices: list[int] = Field(default_factory=list)
    simulated: bool = False
    node_rank: int = 0
    cpu_fallback: bool = False


class Placement(Contract):
    nodes: list[NodePlacement] = Field(min_length=1)
    explanation: str = ""

    @property
    def worker_ids(self) -> list[str]:
        return [n.worker_id for n in self.nodes]


class Job(Contract):
    """The control plane's record of one job."""

    id: str
    seq: int
    spec: JobSpec
    state: JobState = JobState.QUEUED
    attempts: int = 0
    requeues: int = Field(
        0,
        ge=0,
        description="attempts put back in the queue before they started (their worker was lost "
        "first): each got a new attempt number, but none counts against `retries`",
    )
    placement: Placement | None = None
    pending: PlacementReport | None = None
    submitted_at: float
    placed_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    reason: str | None = Field(None, description="why it failed, was cancelled or lost")
    result: JsonValue = None
    artifacts: list[Artifact] = Field(default_factory=list)
    progress: dict[str, JsonValue] | None = None
    cancel_requested: bool = False
    owner: str = Field(
        ADMIN_USER,
        description="the user who submitted it (set by the control plane from the caller's "
        "identity; jobs from before users belong to the admin)",
    )
    history: list[AttemptRecord] = Field(
        default_factory=list,
        description="every attempt placed so far: where, how it ended, its estimate and charge",
    )
    retry_at: float | None = Field(
        None, description="a retried job waits (capped exponential backoff) until this time"
    )


LogStream = Literal["stdout", "stderr", "system", "display"]
CELL_DESCRIPTION = "the session cell this record belongs to (None: not a session cell's)"
DATA_DESCRIPTION = (
    "a display's MIME bundle (stream \"display\"; `text` is its text/plain form), as Jupyter's"
)


class LogRecord(Contract):
    seq: int
    time: float
    stream: LogStream
    rank: int | None = None
    text: str
    cell: int | None = Field(None, description=CELL_DESCRIPTION)
    data: MimeBundle | None = Field(None, description=DATA_DESCRIPTION)


class LogLine(Contract):
    """A log line as a worker sends it, before the control plane numbers it."""

    time: float
    stream: LogStream
    rank: int | None = None
    text: str = Field(
        max_length=MAX_LINE_CHARS,
        description="the line, without its newline (a longer one is sent in pieces)",
    )
    cell: int | None = Field(None, ge=1, description=CELL_DESCRIPTION)
    data: MimeBundle | None = Field(None, description=DATA_DESCRIPTION)


class JobList(Contract):
    jobs: list[Job]


class LogPage(Contract):
    job_id: str
    records: list[LogRecord]
    next_since: int
    state: JobState
