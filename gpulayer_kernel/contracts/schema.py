"""Export the JSON Schema of every contract to the checked-in ``schema.json``.

Run ``python -m gpulayer_kernel.contracts.schema`` after changing a contract; a test fails while
the file is stale, so a contract cannot change without the change showing up in review.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from . import (
    Artifact,
    AttachRequest,
    AttemptRecord,
    Budget,
    BudgetList,
    BudgetStatus,
    CellList,
    CellPage,
    CellReport,
    CellRequest,
    CellResult,
    CostEntry,
    CostReport,
    Event,
    EventCursor,
    EventPage,
    FinishReport,
    Instance,
    InstanceList,
    Job,
    JobAssignment,
    JobFollow,
    JobList,
    JobReport,
    JobSpec,
    LogBatch,
    LogLine,
    LogPage,
    LogRecord,
    Offer,
    PlacementReport,
    ProgressReport,
    ProviderCheck,
    ProviderList,
    Refusal,
    Rendezvous,
    ReportAnswer,
    ReportBatch,
    RunRequest,
    SessionInfo,
    SessionList,
    SessionReport,
    SessionSpec,
    SubmitAnswer,
    SubmitBatch,
    Work,
    WorkerCapabilities,
    WorkerInfo,
    WorkerRegistration,
)

SCHEMA_PATH = Path(__file__).with_name("schema.json")

CONTRACTS: tuple[type[BaseModel], ...] = (
    JobSpec,
    Job,
    JobList,
    LogLine,
    LogRecord,
    LogPage,
    LogBatch,
    Artifact,
    WorkerRegistration,
    WorkerCapabilities,
    WorkerInfo,
    PlacementReport,
    JobAssignment,
    Work,
    FinishReport,
    ProgressReport,
    Rendezvous,
    Event,
    EventCursor,
    EventPage,
    SessionSpec,
    SessionInfo,
    SessionList,
    AttachRequest,
    CellRequest,
    CellPage,
    CellList,
    CellReport,
    SessionReport,
    Offer,
    Instance,
    InstanceList,
    ProviderCheck,
    ProviderList,
    AttemptRecord,
    CostEntry,
    CostReport,
    Budget,
    BudgetStatus,
    BudgetList,
    # protocol 1.1 (ADR 0003)
    JobReport,
    ReportBatch,
    Refusal,
    ReportAnswer,
    RunRequest,
    JobFollow,
    SubmitBatch,
    SubmitAnswer,
    # a one-shot cell's result (issue 34)
    CellResult,
)


def export_schema() -> dict[str, Any]:
    return {
        "api_version": "gpulayer/v1",
        "contracts": {c.__name__: c.model_json_schema() for c in CONTRACTS},
    }


def main() -> None:
    SCHEMA_PATH.write_text(json.dumps(export_schema(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SCHEMA_PATH}")


if __name__ == "__main__":
    main()
