"""Session contracts (ADR 0019): a GPU that remembers, as a placed, long-lived workload.

A session *is* a job whose workload is :class:`SessionWorkload`: the scheduler places it like
any job (it waits in the queue with its explanation, and holds its devices while it runs); it
ends ``cancelled`` when stopped or idle past its timeout, ``lost`` with its worker, ``failed``
when its processes cannot start. What a job does not have lives in :class:`SessionInfo`: which
notebook holds it (``holder``, changed by ``attach``), whether it is idle, busy or broken, and
its cells.

Each cell run in a session is a :class:`CellRun`, numbered per session (1, 2, …). Its outputs —
stdout, stderr and display data (MIME bundles) — are records of the session's log, tagged with
the cell's number (``LogRecord.cell``), so they stream, page and are redacted like any job's
log; the end of a cell carries each rank's outcome (its displayed value or its error).
Everything is JSON: display data are MIME bundles (``image/png`` as base64), values that move
between kernel and session travel as tensor-safe blobs (``transfer.py``), never pickle.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from .. import display
from ._base import SHA256_PATTERN, Contract, ensure_json
from .jobs import (
    DEFAULT_IDLE_TIMEOUT,
    MAX_IDLE_TIMEOUT,
    EnvVars,
    Job,
    Labels,
    LogLine,
    LogRecord,
    MimeBundle,
    Resources,
    SecretNames,
)
from .limits import MAX_LINES
from .workspace import WorkspaceSource, WorkspaceView

SESSION_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
MAX_CODE_BYTES = 1 << 20  # one cell's source
MAX_NAMES = 64  # variables one --in/--out/push/pull may name

VarName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=200)]


class SessionHolder(Contract):
    """Who holds a session: the client (one kernel's connection) that may run cells in it."""

    client: str = Field(
        min_length=1,
        max_length=200,
        description="an opaque id of the holding client (each kernel makes its own); only it "
        "(and an admin) may run cells, until another client attaches",
    )
    notebook: str | None = Field(None, max_length=1000, description="the holder's notebook path")
    kernel: str | None = Field(None, max_length=200, description="the holder's kernel id")

    @property
    def label(self) -> str:
        """How a sentence names the holder: its notebook, else its client."""
        return f"`{self.notebook}`" if self.notebook else f"client {self.client[:12]}"


class SessionSpec(Contract):
    """What ``%gpulayer session start`` asks for; the control plane makes it a session's job."""

    name: str = Field(pattern=SESSION_NAME_PATTERN, description="unique among live sessions")
    resources: Resources = Field(default_factory=Resources)
    idle_timeout: float = Field(DEFAULT_IDLE_TIMEOUT, gt=0, le=MAX_IDLE_TIMEOUT)
    holder: SessionHolder
    env: EnvVars = Field(default_factory=dict)
    secrets: SecretNames = Field(default_factory=list)
    labels: Labels = Field(default_factory=dict)
    wait_for_capacity: bool = False
    kernel: bool = Field(
        False, description="a GPU kernel (ADR 0021): started by a kernel provisioner, not cells"
    )
    workspace: WorkspaceSource | None = Field(
        None, description="the notebook's folder, where the ranks run (ADR 0022)"
    )


class SessionStatus(StrEnum):
    """Where a session is in its life (its job's state says where the job is)."""

    WAITING = "waiting"  # its job is queued or placed: the ranks are not up yet
    IDLE = "idle"  # up, no cell running: the idle timer runs
    BUSY = "busy"  # a cell runs (or waits behind one)
    BROKEN = "broken"  # a rank died or the process group broke: restart it
    ENDED = "ended"  # its job is final

    @property
    def live(self) -> bool:
        return self not in (SessionStatus.ENDED,)


class SessionInfo(Contract):
    """A session as the API, the CLI and the panel show it."""

    id: str = Field(description="the session's job id")
    name: str
    status: SessionStatus
    job: Job
    holder: SessionHolder
    ranks: int = Field(1, ge=1, description="processes: one per GPU of each node (one on CPU)")
    cells: int = Field(0, ge=0, description="cells run so far")
    busy_cell: int | None = Field(None, description="the cell running now")
    idle_since: float | None = Field(None, description="when the last cell ended (or it came up)")
    idle_timeout: float
    reason: str | None = Field(None, description="why it is broken or ended")
    ends_at: float | None = Field(
        None,
        description="computed by the server: when an idle session ends unless a cell runs "
        "first (idle_since + idle_timeout); clients read it rather than repeat the rule",
    )
    kernel: bool = Field(
        False,
        description="a GPU kernel picked in JupyterLab's launcher (ADR 0021), not a session "
        "of cells: the panel marks it",
    )
    workspace: WorkspaceView | None = Field(
        None,
        description="where its code runs (ADR 0022): the notebook's folder in place, a synced "
        "copy, or none and why (left out when the session named no folder)",
        exclude_if=lambda v: v is None,
    )

    @model_validator(mode="before")
    @classmethod
    def _compute_ends_at(cls, data: Any) -> Any:
        # Derived, never trusted from input: one rule, written here, for every reader.
        if isinstance(data, dict):
            idle = data.get("status") in (SessionStatus.IDLE, "idle")
            since = data.get("idle_since")
            ends = since + data["idle_timeout"] if idle and since is not None else None
            data = {**data, "ends_at": ends}
        return data

    @property
    def live(self) -> bool:
        return self.status.live


class SessionRecord(Contract):
    """What the store keeps of a session beside its job (what an attach or a cell changes)."""

    id: str
    name: str
    holder: SessionHolder
    cells: int = Field(0, ge=0)
    broken: str | None = None


class SessionList(Contract):
    sessions: list[SessionInfo]


class AttachRequest(Contract):
    """Take a session over: its cells are this client's from now on (a restarted kernel)."""

    holder: SessionHolder


class CellRequest(Contract):
    """One cell to run in a session, on every rank."""

    code: str = Field("", max_length=MAX_CODE_BYTES)
    client: str | None = Field(
        None, max_length=200, description="the requesting client (see SessionHolder.client)"
    )
    count: int | None = Field(
        None, ge=0, le=1 << 40, description="the kernel's execution count: tracebacks say In[n]"
    )
    all_ranks: bool = Field(False, description="show every rank's value, not rank 0's only")
    inputs: dict[str, JsonValue] = Field(
        default_factory=dict, description="JSON values bound before the cell runs (--in)"
    )
    inputs_blob: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        description="a tensor-safe blob (safetensors) of values bound before the cell (push, --in)",
    )
    outputs: list[VarName] = Field(
        default_factory=list,
        max_length=MAX_NAMES,
        description="variables sent back after the cell (--out, pull), from rank 0",
    )
    history: bool = Field(True, description="False: a push/pull, not a cell of the history")

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs_json(cls, v: Any) -> Any:
        return ensure_json(v, "inputs")

    @field_validator("code")
    @classmethod
    def _code_size(cls, v: str) -> str:
        if len(v.encode()) > MAX_CODE_BYTES:
            raise ValueError(f"the cell is over {display.human_bytes(MAX_CODE_BYTES)}")
        if "\x00" in v:
            raise ValueError("the cell contains a NUL byte")
        return v


class CellState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    OK = "ok"
    ERROR = "error"  # a rank raised (KeyboardInterrupt included: an interrupted cell)
    ABORTED = "aborted"  # it never ended on its ranks: the session ended, broke or restarted

    @property
    def done(self) -> bool:
        return self in (CellState.OK, CellState.ERROR, CellState.ABORTED)


class CellError(Contract):
    """An exception raised in a cell, as IPython shows it (the traceback's lines, ANSI colours)."""

    ename: str = Field(max_length=500)
    evalue: str = Field(max_length=20_000)
    traceback: list[str] = Field(default_factory=list, max_length=2_000)
    rank: int | None = None


class RankOutcome(Contract):
    """How one rank ran one cell."""

    rank: int = Field(ge=0)
    status: Literal["ok", "error", "aborted"]
    error: CellError | None = None
    value: MimeBundle | None = Field(
        None,
        description="the cell's displayed value (Out[n]) as Jupyter's display content: "
        '{"data": {mime: ...}, "metadata": {...}}',
    )
    duration: float = Field(0.0, ge=0)

    @field_validator("duration")
    @classmethod
    def _finite(cls, v: float) -> float:
        return v if math.isfinite(v) else 0.0


class CellRun(Contract):
    """One cell run in a session: recorded like a job (code digest, logs, outcome, duration)."""

    session_id: str
    number: int = Field(ge=1)
    state: CellState = CellState.QUEUED
    code_sha256: str = Field(pattern=SHA256_PATTERN)
    code: str = Field("", description="the cell's source (redacted)")
    history: bool = True
    all_ranks: bool = False
    ranks_expected: int = Field(1, ge=1)
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    ranks: list[RankOutcome] = Field(default_factory=list)
    error: CellError | None = Field(None, description="the root cause: the first rank to fail")
    reason: str | None = Field(None, description="why it was aborted, or what else went wrong")
    value: MimeBundle | None = Field(None, description="rank 0's displayed value")
    outputs: dict[str, JsonValue] = Field(
        default_factory=dict, description="--out/pull values that are plain JSON"
    )
    outputs_blob: str | None = Field(
        None, pattern=SHA256_PATTERN, description="--out/pull values as a tensor-safe blob"
    )
    first_seq: int = Field(0, ge=0, description="the session log seq before this cell's records")
    broken: str | None = Field(
        None, description="the session broke during this cell (why): it needs a restart"
    )

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return max(0.0, self.finished_at - self.started_at)

    @property
    def summary(self) -> str:
        """One line: how it ended and what it showed."""
        if self.error is not None:
            ranked = self.error.rank is not None and self.ranks_expected > 1
            where = f" on rank {self.error.rank}" if ranked else ""
            value = f": {self.error.evalue}" if self.error.evalue else ""
            return _one_line(f"{self.error.ename}{where}{value}")
        if self.reason:
            return _one_line(self.reason)
        return _one_line(display.text_of(self.value))


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class CellList(Contract):
    cells: list[CellRun]


class CellPage(Contract):
    """A cell as it is now, with its log records after ``since`` (the answer to a run or a
    follow: one request carries the result and the output of a short cell)."""

    cell: CellRun
    records: list[LogRecord] = Field(default_factory=list)
    next_since: int = Field(0, ge=0, description="follow on from here")
    more: bool = Field(
        False,
        description="more of the cell's records wait after `next_since`: ask again at once (a "
        "cell that has ended has all its output only once a page says no more)",
    )

    @property
    def finished(self) -> bool:
        """The cell has ended and this page holds the last of its output: stop following."""
        return self.cell.state.done and not self.more


# -- between the control plane and the session's workers ------------------------------------------


class CellAssignment(Contract):
    """A cell for one worker of a session to run on its ranks."""

    session_id: str
    number: int = Field(ge=1)
    request: CellRequest
    resume: bool = Field(
        False,
        description="a cell of the control plane's previous life: do not run it; report it "
        "(again) if it ran here, as not run if it never came (left out when false)",
    )

    @model_serializer(mode="wrap")
    def _resume_only_when_set(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A worker from before ``resume`` forbids unknown fields: a new cell must look as it did.
        data = handler(self)
        if not self.resume and isinstance(data, dict):
            data.pop("resume", None)
        return data


class CellReport(Contract):
    """One worker's ranks' outcome of one cell, with the output records not yet shipped."""

    number: int = Field(ge=1)
    ranks: list[RankOutcome] = Field(default_factory=list)
    lines: list[LogLine] = Field(default_factory=list, max_length=MAX_LINES)
    started_at: float | None = None
    finished_at: float | None = None
    outputs: dict[str, JsonValue] = Field(default_factory=dict)
    outputs_blob: str | None = Field(None, pattern=SHA256_PATTERN)
    broken: str | None = Field(
        None, description="the session broke during this cell (why): it needs a restart"
    )
    reason: str | None = Field(
        None,
        max_length=20_000,
        description="what else went wrong: a rank that exited, --out values that could not move",
    )
    attempt: int | None = Field(None, ge=0, le=1_000_000)


class SessionReport(Contract):
    """A change of a session's processes outside a cell: up again after a restart, or broken."""

    status: Literal["ready", "broken"]
    reason: str | None = Field(None, max_length=20_000)
    attempt: int | None = Field(None, ge=0, le=1_000_000)
