"""The job state machine: one table; every illegal move is refused with a Conflict."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulayer_kernel.contracts import TERMINAL_STATES, JobState
from gpulayer_kernel.controlplane import TRANSITIONS, check_transition
from gpulayer_kernel.errors import Conflict

LEGAL = {
    ("queued", "placed"),
    ("queued", "cancelled"),
    ("queued", "failed"),  # no worker here can ever run it, and it did not ask to wait
    ("placed", "running"),
    ("placed", "failed"),
    ("placed", "cancelled"),
    ("placed", "lost"),
    ("placed", "queued"),
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "lost"),
    ("running", "queued"),
}


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(JobState, JobState)))
def test_transition_table(src: JobState, dst: JobState) -> None:
    if (src.value, dst.value) in LEGAL:
        check_transition("j", src, dst)
    else:
        with pytest.raises(Conflict) as info:
            check_transition("j", src, dst)
        assert info.value.code == "illegal_transition"
        assert src.value in info.value.message and dst.value in info.value.message


def test_final_states_have_no_way_out() -> None:
    for state in TERMINAL_STATES:
        assert TRANSITIONS[state] == frozenset()
        assert state.terminal


@given(st.lists(st.sampled_from(list(JobState)), max_size=30))
def test_any_walk_through_the_table_ends_in_a_state_that_agrees(steps: list[JobState]) -> None:
    state = JobState.QUEUED
    for target in steps:
        if target in TRANSITIONS[state]:
            check_transition("j", state, target)
            state = target
        else:
            with pytest.raises(Conflict):
                check_transition("j", state, target)
    assert state.terminal == (not TRANSITIONS[state])
