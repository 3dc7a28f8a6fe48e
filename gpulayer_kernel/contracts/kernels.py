"""GPU kernel contracts (ADR 0021): a real ipykernel placed on a worker as a session.

A GPU kernel *is* a session (``SessionWorkload(kernel=True)``): queued with its explanation, placed,
holding its GPUs, idle-culled, charged and lost like one. What it adds is a relay of the kernel's
raw ZMQ messages between the Jupyter server and the worker, over HTTP and outbound from both: each
message is a :class:`KernelFrame` (its channel and its multipart frames, base64), batched in a
:class:`KernelPage` per long-poll. The frames are relayed unchanged (signed by the kernel or the
Jupyter client with the connection file's key): the control plane neither reads nor signs them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Contract
from .jobs import DEFAULT_IDLE_TIMEOUT, MAX_IDLE_TIMEOUT, EnvVars
from .sessions import SESSION_NAME_PATTERN, SessionHolder
from .workspace import WorkspaceSource

Channel = Literal["shell", "control", "stdin", "iopub"]
MAX_FRAMES = 4_096  # messages one request may carry
MAX_PARTS = 64  # frames of one message (routing identities included)

# What the relay holds (issue 33): every lane is bounded in bytes and freed when its kernel ends.
MAX_MESSAGE = 32 << 20  # bytes of one message, any channel: past it, refused (413)
OUTPUT_CAP = 8 << 20  # bytes of one iopub message: past it, a note stands in for it
LANE_BYTES = 16 << 20  # bytes a lane holds unread (one bigger message passes alone)
WAITING_BYTES = 1 << 20  # bytes the Jupyter host may queue for a kernel that is not up yet
RELAY_BYTES = 128 << 20  # bytes every lane of a control plane holds together
MAX_FRAMES_BODY = (MAX_MESSAGE * 4) // 3 + (1 << 20)  # a frames request: one message, base64


class KernelFrame(Contract):
    """One ZMQ multipart message of a kernel channel, its frames base64-encoded."""

    channel: Channel
    parts: list[str] = Field(max_length=MAX_PARTS, description="the frames, base64")


class KernelFrames(Contract):
    """Messages one side sends (the Jupyter host's to the kernel, or the kernel's to it)."""

    frames: list[KernelFrame] = Field(default_factory=list, max_length=MAX_FRAMES)


KernelState = Literal["waiting", "up", "exited", "ended"]


class KernelPage(Contract):
    """A long-poll's answer: the messages after ``since``, and where the kernel is."""

    frames: list[KernelFrame] = Field(default_factory=list)
    next_since: int = Field(0, ge=0, description="ask again from here (acknowledges the rest)")
    state: KernelState = Field(
        "waiting",
        description="waiting: queued or starting; up: the kernel runs; exited: its process "
        "ended (a restart starts it again); ended: the session is over (see reason)",
    )
    generation: int = Field(0, ge=0, description="the kernel process's start count")
    reason: str | None = Field(None, description="why it exited or ended, or why it waits")
    final: bool = Field(
        False,
        description="ended on purpose (its session was stopped or idled out: `cancelled`), so "
        "no automatic restart brings it back; the Jupyter host keeps the kernel and answers "
        "its cells with the reason until the user restarts it (a lost worker: false)",
    )


class KernelStart(Contract):
    """What a kernel provisioner asks for: a session whose rank 0 is an ipykernel."""

    name: str | None = Field(
        None, pattern=SESSION_NAME_PATTERN, description="the session's name (default: kernel-<id>)"
    )
    gpus: int = Field(1, ge=0, le=64)
    gpu_kind: list[str] = Field(default_factory=list)
    key: str = Field(
        max_length=1024,
        description="the connection file's HMAC key: the kernel on the worker signs with it",
    )
    signature_scheme: str = Field("hmac-sha256", pattern=r"^hmac-[a-z0-9]+$")
    idle_timeout: float = Field(DEFAULT_IDLE_TIMEOUT, gt=0, le=MAX_IDLE_TIMEOUT)
    holder: SessionHolder
    wait_for_capacity: bool = False
    workspace: WorkspaceSource | None = Field(
        None, description="the notebook's folder: the kernel runs in it (ADR 0022)"
    )
    env: EnvVars = Field(
        default_factory=dict,
        description="set in the kernel process's environment (e.g. JPY_SESSION_NAME, the notebook)",
    )


class KernelConnection(Contract):
    """What the worker needs to start the kernel process (held in memory, never stored)."""

    key: str = Field(max_length=1024)
    signature_scheme: str = "hmac-sha256"
    generation: int = Field(0, ge=0, description="raised by each restart")


class KernelExit(Contract):
    """The worker's kernel process ended (a shutdown request, a crash, a kill)."""

    generation: int = Field(0, ge=0)
    code: int | None = None
    reason: str = Field("", max_length=2_000)
