"""The renderer and the placement sentence on their own."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpulayer_kernel.contracts import PlacementReport, Reason, ReasonCount, Resources
from gpulayer_kernel.scheduler.explain import (
    STAGE_ORDER,
    finish,
    make_report,
    render,
    sentence_parts,
)
from gpulayer_kernel.scheduler.feasible import make_shape
from gpulayer_kernel.scheduler.placed import PlacedNode, placed_sentence


def test_every_reason_has_a_place_in_the_check_order() -> None:
    assert set(STAGE_ORDER) == set(Reason)
    assert len(STAGE_ORDER) == len(Reason)


def test_ties_follow_the_check_order_and_counts_lead() -> None:
    report = PlacementReport(
        job_id="abcdef0123",
        workers_total=4,
        filtered=[
            ReasonCount(
                code=Reason.GPU_KIND, workers=1, detail="no GPU of kind l4", waiting_helps=False
            ),
            ReasonCount(code=Reason.CORDONED, workers=1, detail="cordoned", waiting_helps=False),
        ],
        exhausted=[
            ReasonCount(
                code=Reason.GPUS_BUSY,
                workers=2,
                detail="too few free GPUs (need 1)",
                waiting_helps=True,
            )
        ],
    )
    assert render(report) == (
        "0/4 workers can run job abcdef01: 2 have too few free GPUs (need 1; waiting helps), "
        "1 is cordoned (waiting won't help), 1 has no GPU of kind l4 (waiting won't help)"
    )


def test_finish_matches_render_for_every_job() -> None:
    shape = make_shape(Resources(gpus=2, gpu_kind=["h100", "a100"], nodes=2))
    template = make_report(
        shape,
        {Reason.GPU_KIND: 2, Reason.GPUS_BUSY: 3, Reason.NOT_ENOUGH_NODES: 1},
        total=6,
        feasible=1,
        reservation=["w9"],
    )
    parts = sentence_parts(template)
    for position, job_id in enumerate(["x", "0123456789abcdef", "\u00e9t\u00e9"], 1):
        report = finish(template, parts, job_id, position)
        assert report.job_id == job_id and report.position == position
        assert report.sentence == render(report)
        # finish copies the template without model_copy (for speed): the same model, all through.
        same = template.model_copy(
            update={"job_id": job_id, "position": position, "sentence": report.sentence}
        )
        assert report == same and report.model_fields_set == same.model_fields_set
        assert report.model_dump_json() == same.model_dump_json()
        assert PlacementReport.model_validate_json(report.model_dump_json()) == report
        with pytest.raises(ValidationError):  # as frozen as the template
            report.position = 0  # type: ignore[misc]
    assert report.sentence == (
        "1/6 workers can run job \u00e9t\u00e9, which needs 2 at once: 3 have too few free GPUs "
        "(need 2; waiting helps), 2 have no GPU of kind h100 or a100 (waiting won't help), "
        "1 has room now, but the job needs 2 workers at once (waiting helps); GPUs are reserved "
        "for it on w9; position 3 in the queue"
    )


def test_placed_sentence_for_uneven_gangs() -> None:
    shape = make_shape(Resources(gpus=2, nodes=2))
    nodes = [PlacedNode("a", (0, 1), 0, False), PlacedNode("b", (4, 5), 2, False)]
    assert placed_sentence(shape, nodes) == (
        "placed on a devices [0,1] (node 0) and b devices [4,5] (node 1): "
        "tightest fit, 0 and 2 GPUs left free"
    )
