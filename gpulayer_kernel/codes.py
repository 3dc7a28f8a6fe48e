"""Every error code GPUlayer raises or sends: one registry (issue 34), like the scheduler's Reason.

Each :class:`ErrorCode` is a stable string (never renamed once shipped; ``errors.py`` says so):
an error carries it as ``code``, the HTTP API sends it in ``{"code", "message", "hint",
"details"}``, and callers branch on it. ``codes.toml`` beside this file says, for each, its HTTP
status, when it happens and what to do; ``docs/troubleshooting.md``'s table is generated from it
(``python -m gpulayer_kernel.codes --write-docs``), and ``tests/test_codes.py`` checks that every
code the package raises is registered here, documented there, and the table current.

A code is a ``str`` (``ErrorCode.JOB_NOT_FOUND == "job_not_found"``): raise sites may pass either.
"""

from __future__ import annotations

import sys
import tomllib
from enum import StrEnum
from pathlib import Path

DOCS_PATH = Path(__file__).with_name("codes.toml")
TROUBLESHOOTING = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"
BEGIN, END = "<!-- codes:begin -->", "<!-- codes:end -->"


class ErrorCode(StrEnum):
    """The stable codes of GPUlayer's errors (``errors.GPUlayerError.code``)."""

    ARTIFACT_NOT_FOUND = "artifact_not_found"
    AUDIT_ACTION = "audit_action"
    AUDIT_LIMIT = "audit_limit"
    BACKUP_CORRUPT = "backup_corrupt"
    BACKUP_EXISTS = "backup_exists"
    BACKUP_INVALID = "backup_invalid"
    BACKUP_KIND = "backup_kind"
    BACKUP_SOURCE = "backup_source"
    BAD_ARTIFACT_NAME = "bad_artifact_name"
    BAD_CHANNEL = "bad_channel"
    BAD_FRAME = "bad_frame"
    BAD_GPUS = "bad_gpus"
    BAD_KERNEL_NAME = "bad_kernel_name"
    BAD_LIMIT = "bad_limit"
    BAD_OPTION = "bad_option"
    BAD_PARAMETER = "bad_parameter"
    BAD_REQUEST = "bad_request"
    BAD_SHARED_PATH = "bad_shared_path"
    BAD_URL = "bad_url"
    BAD_USER_NAME = "bad_user_name"
    BAD_WAIT = "bad_wait"
    BLOB_CORRUPT = "blob_corrupt"
    BLOB_NOT_FOUND = "blob_not_found"
    BODY_TOO_LARGE = "body_too_large"
    BUDGET_EXCEEDED = "budget_exceeded"
    BUDGET_NOT_FOUND = "budget_not_found"
    BUNDLE_INVALID = "bundle_invalid"
    BUNDLE_NOT_FOUND = "bundle_not_found"
    BUSY = "busy"
    CALLBACK_FAILED = "callback_failed"
    CALLBACK_INVALID = "callback_invalid"
    CELL_ABORTED = "cell_aborted"
    CELL_ERROR = "cell_error"
    CELL_NAME_UNDEFINED = "cell_name_undefined"
    CELL_NOT_FOUND = "cell_not_found"
    CELL_NOT_TAKEN = "cell_not_taken"
    CELL_OUTPUTS = "cell_outputs"
    CELL_RAISED = "cell_raised"
    CELL_SYNTAX = "cell_syntax"
    CHECKPOINT_INVALID = "checkpoint_invalid"
    CONFIG_CHANGED = "config_changed"
    CONFIG_INVALID = "config_invalid"
    CONFIGURE_OPTIMIZERS_INVALID = "configure_optimizers_invalid"
    CONFLICT = "conflict"
    DEPENDENCY_MISSING = "dependency_missing"
    DIST_NOT_FOUND = "dist_not_found"
    DIST_UNAVAILABLE = "dist_unavailable"
    FILE_EXISTS = "file_exists"
    FORBIDDEN = "forbidden"
    HOME_LOCKED = "home_locked"
    HOOK_MISSING = "hook_missing"
    HOST_KEY_REFUSED = "host_key_refused"
    IDEMPOTENCY_KEY_INVALID = "idempotency_key_invalid"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    IDEMPOTENCY_KEY_UNRESOLVED = "idempotency_key_unresolved"
    ILLEGAL_TRANSITION = "illegal_transition"
    ILLEGAL_UPDATE = "illegal_update"
    INSTANCE_EXISTS = "instance_exists"
    INTERNAL = "internal"
    INVALID_INPUT = "invalid_input"
    INVALID_STEP = "invalid_step"
    JOB_CANCELLED = "job_cancelled"
    JOB_FAILED = "job_failed"
    JOB_NOT_FOUND = "job_not_found"
    JOB_TOKEN_DERIVED = "job_token_derived"
    JOB_TOKEN_SCOPE = "job_token_scope"
    KERNEL_ENDED = "kernel_ended"
    KERNEL_LANE_FULL = "kernel_lane_full"
    KERNEL_MESSAGE_TOO_LARGE = "kernel_message_too_large"
    KERNEL_NOT_ATTACHED = "kernel_not_attached"
    KERNEL_NOT_FOUND = "kernel_not_found"
    KERNELSPEC_NOT_FOUND = "kernelspec_not_found"
    KEY_NOT_WRITABLE = "key_not_writable"
    LAST_ADMIN = "last_admin"
    LOSS_NOT_FINITE = "loss_not_finite"
    MANUAL_OPTIMIZATION_INVALID = "manual_optimization_invalid"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    METRIC_INVALID = "metric_invalid"
    METRIC_NOT_FOUND = "metric_not_found"
    MISSING_EXTRA = "missing_extra"
    NO_IDENTITY = "no_identity"
    NO_RESULT = "no_result"
    NO_SESSION = "no_session"
    NO_TRAINING_DATA = "no_training_data"
    NOT_A_KERNEL = "not_a_kernel"
    NOT_A_SESSION = "not_a_session"
    NOT_ASSIGNED = "not_assigned"
    NOT_FORWARDED = "not_forwarded"
    NOT_FOUND = "not_found"
    NOT_JSON = "not_json"
    NOT_LEADER = "not_leader"
    NOT_OVER_TUNNEL = "not_over_tunnel"
    NOT_RUNNING = "not_running"
    NOT_TRANSFERABLE = "not_transferable"
    NOT_UP = "not_up"
    NOT_YOUR_BLOB = "not_your_blob"
    NOT_YOUR_JOB = "not_your_job"
    NOT_YOUR_TOKEN = "not_your_token"
    NOT_YOURS = "not_yours"
    ORIGINAL_STILL_LEADS = "original_still_leads"
    PG_TOOL_FAILED = "pg_tool_failed"
    PG_TOOLS_MISSING = "pg_tools_missing"
    PRECISION_UNSUPPORTED = "precision_unsupported"
    PROTOCOL_UNSUPPORTED = "protocol_unsupported"
    PROVIDER_ERROR = "provider_error"
    QUOTA_EXCEEDED = "quota_exceeded"
    RENDEZVOUS_PENDING = "rendezvous_pending"
    RESTORE_NOT_EMPTY = "restore_not_empty"
    RESTORE_WHILE_LED = "restore_while_led"
    ROLE_FORBIDDEN = "role_forbidden"
    ROLE_TOO_HIGH = "role_too_high"
    SCHEDULER_UNSUPPORTED = "scheduler_unsupported"
    SCHEMA_TOO_NEW = "schema_too_new"
    SECRET_NOT_FOUND = "secret_not_found"
    SECRETS_KEY = "secrets_key"
    SERVER_UNREACHABLE = "server_unreachable"
    SESSION_BROKEN = "session_broken"
    SESSION_ENDED = "session_ended"
    SESSION_FAILED = "session_failed"
    SESSION_HELD = "session_held"
    SESSION_IS_KERNEL = "session_is_kernel"
    SESSION_LINK_LOST = "session_link_lost"
    SESSION_NAME_TAKEN = "session_name_taken"
    SESSION_NOT_FOUND = "session_not_found"
    SESSION_NOT_READY = "session_not_ready"
    SESSION_OPTION = "session_option"
    SHUTTING_DOWN = "shutting_down"
    STALE_ATTEMPT = "stale_attempt"
    STANDBY_LACKS_KEY = "standby_lacks_key"
    START_FAILED = "start_failed"
    STARTING = "starting"
    STORE_AUTH = "store_auth"
    STORE_DRIVER_MISSING = "store_driver_missing"
    STORE_ERROR = "store_error"
    STORE_LOCKED = "store_locked"
    STORE_MISSING = "store_missing"
    STORE_UNAVAILABLE = "store_unavailable"
    STORE_URL = "store_url"
    STREAM_UNSUPPORTED = "stream_unsupported"
    TLS_INCOMPLETE = "tls_incomplete"
    TLS_INVALID = "tls_invalid"
    TLS_REQUIRED = "tls_required"
    TOKEN_EXPIRED = "token_expired"
    TOKEN_IN_URL = "token_in_url"
    TOKEN_INVALID = "token_invalid"
    TOKEN_JOB_ENDED = "token_job_ended"
    TOKEN_MALFORMED = "token_malformed"
    TOKEN_MISSING = "token_missing"
    TOKEN_NOT_FOUND = "token_not_found"
    TOKEN_REPLAYED = "token_replayed"
    TOKEN_REVOKED = "token_revoked"
    TOKEN_USER = "token_user"
    TOO_LARGE = "too_large"
    TRAINING_STEP_INVALID = "training_step_invalid"
    TRANSFER_INVALID = "transfer_invalid"
    TRANSFER_TOO_LARGE = "transfer_too_large"
    UNAUTHORIZED = "unauthorized"
    UNAVAILABLE = "unavailable"
    UNKNOWN_KEY = "unknown_key"
    UNKNOWN_OPTION = "unknown_option"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    UNUSED_PARAMETERS = "unused_parameters"
    UPLOADS_BUSY = "uploads_busy"
    USER_DISABLED = "user_disabled"
    USER_EXISTS = "user_exists"
    USER_NOT_FOUND = "user_not_found"
    USER_UNKNOWN = "user_unknown"
    VALIDATION_FAILED = "validation_failed"
    VALIDATION_STEP_INVALID = "validation_step_invalid"
    WORKER_BUSY = "worker_busy"
    WORKER_LIVE = "worker_live"
    WORKER_NOT_FOUND = "worker_not_found"
    WORKSPACE_DISK_FULL = "workspace_disk_full"
    WORKSPACE_MANIFEST_INVALID = "workspace_manifest_invalid"
    WORKSPACE_MANIFEST_MISSING = "workspace_manifest_missing"
    WORKSPACE_NO_MANIFEST = "workspace_no_manifest"
    WORKSPACE_NONE = "workspace_none"
    WORKSPACE_NOT_SYNCED = "workspace_not_synced"
    WORKSPACE_NOT_THIS_NODE = "workspace_not_this_node"
    WORKSPACE_TIMEOUT = "workspace_timeout"
    WORKSPACE_TOO_BIG = "workspace_too_big"
    WORKSPACE_UNSAFE_NAME = "workspace_unsafe_name"
    WRONG_TOKEN_KIND = "wrong_token_kind"


def docs() -> dict[str, dict[str, object]]:
    """``codes.toml``: for each code, ``status``, ``when`` and ``todo``."""
    with DOCS_PATH.open("rb") as f:
        return tomllib.load(f)


def table() -> str:
    """The Markdown table of every code (what ``docs/troubleshooting.md`` shows)."""
    rows = ["| code | status | when | what to do |", "| --- | --- | --- | --- |"]
    for code, doc in sorted(docs().items()):
        rows.append(f"| `{code}` | {doc['status']} | {doc['when']} | {doc['todo']} |")
    return "\n".join(rows)


def write_docs(path: Path = TROUBLESHOOTING) -> bool:
    """Put :func:`table` between the markers of ``path``; whether it changed."""
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{table()}\n{END}{tail}"
    if new == text:
        return False
    path.write_text(new)
    return True


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-docs"]:
        sys.exit("usage: python -m gpulayer_kernel.codes --write-docs")
    print("docs/troubleshooting.md", "written" if write_docs() else "already current")
