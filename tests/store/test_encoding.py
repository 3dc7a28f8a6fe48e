"""The job encoder: the body it writes reads back as the job; its spec cache never goes stale."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulayer_kernel.contracts import (
    CommandWorkload,
    Job,
    JobSpec,
    JobState,
    NodePlacement,
    Placement,
    PythonWorkload,
)
from gpulayer_kernel.store.encoding import JobEncoder

# Any Unicode but NUL (no process can be given one: JobSpec refuses it) and lone surrogates.
text = st.text(
    st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), min_size=1, max_size=12
)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
workloads = st.one_of(
    st.builds(CommandWorkload, argv=st.lists(text, min_size=1, max_size=3)),
    st.builds(
        PythonWorkload,
        bundle=st.just("ab" * 32),
        entrypoint=st.just("pkg.mod:main"),
        args=st.dictionaries(names, json_values, max_size=3),
    ),
)
specs = st.builds(
    JobSpec,
    name=text,
    workload=workloads,
    env=st.dictionaries(names, text, max_size=3),
    labels=st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9.-]{0,6}", fullmatch=True), text, max_size=3
    ),
    priority=st.integers(-1000, 1000),
)
placements = st.none() | st.builds(
    Placement,
    nodes=st.lists(
        st.builds(
            NodePlacement, worker_id=text, worker_name=text, devices=st.lists(st.integers(0, 7))
        ),
        min_size=1,
        max_size=2,
    ),
)
jobs = st.builds(
    Job,
    id=st.from_regex(r"[0-9a-f]{12}", fullmatch=True),
    seq=st.integers(1, 10**9),
    spec=specs,
    state=st.sampled_from(JobState),
    placement=placements,
    submitted_at=st.floats(0, 2e9),
    exit_code=st.none() | st.integers(-255, 255),
    reason=st.none() | text,
    result=json_values,
    progress=st.none() | st.dictionaries(text, json_values, max_size=3),
    owner=text,
)


@settings(max_examples=200, deadline=None)
@given(jobs)
def test_the_body_reads_back_as_the_job_and_holds_what_model_dump_json_holds(job: Job) -> None:
    encode = JobEncoder()
    for _ in range(2):  # the first encoding fills the cache, the second uses it
        body = encode(job)
        assert Job.model_validate_json(body) == job
        assert json.loads(body) == json.loads(job.model_dump_json())


def _job(state: JobState = JobState.QUEUED, name: str = "a") -> Job:
    spec = JobSpec(name=name, workload=CommandWorkload(argv=["true"]))
    return Job(id="j1", seq=1, spec=spec, state=state, submitted_at=1.0)


def test_a_new_spec_object_is_encoded_afresh_never_from_the_cache() -> None:
    encode = JobEncoder()
    first = _job()
    encode(first)
    renamed = first.model_copy(update={"spec": first.spec.model_copy(update={"name": "b"})})
    assert json.loads(encode(renamed))["spec"]["name"] == "b"
    placed = renamed.model_copy(update={"state": JobState.PLACED})  # shares renamed's spec
    assert json.loads(encode(placed))["spec"]["name"] == "b"


def test_a_job_leaves_the_cache_at_its_final_write_and_the_oldest_past_capacity() -> None:
    encode = JobEncoder(capacity=2)
    job = _job()
    encode(job)
    assert len(encode) == 1
    encode(job.model_copy(update={"state": JobState.SUCCEEDED}))
    assert len(encode) == 0
    encode(job.model_copy(update={"state": JobState.FAILED}))  # final at once: never cached
    assert len(encode) == 0
    for i in range(5):
        encode(job.model_copy(update={"id": f"j{i}"}))
    assert len(encode) == 2
