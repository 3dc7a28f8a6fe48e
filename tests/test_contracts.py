"""Contracts: strict validation with errors that name the field; JSON only, never pickle."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulayer_kernel.contracts import JobSpec, WorkerRegistration, ensure_json, parse
from gpulayer_kernel.contracts.schema import SCHEMA_PATH, export_schema
from gpulayer_kernel.errors import NotJSON, ValidationFailed

MINIMAL = {"workload": {"kind": "command", "argv": ["echo", "hi"]}}


def test_minimal_spec_gets_defaults() -> None:
    spec = parse(JobSpec, MINIMAL)
    assert spec.api_version == "gpulayer/v1"
    assert spec.retries == 0
    assert spec.resources.gpus == 0
    assert not spec.is_gang


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({**MINIMAL, "gpus": 2}, "gpus"),
        ({**MINIMAL, "resources": {"gpuz": 1}}, "resources.gpuz"),
        ({**MINIMAL, "resources": {"gpus": -1}}, "resources.gpus"),
        ({**MINIMAL, "resources": {"gpus": "two"}}, "resources.gpus"),
        ({**MINIMAL, "timeout": 0}, "timeout"),
        ({**MINIMAL, "env": {"1BAD": "x"}}, "env"),
        ({**MINIMAL, "api_version": "gpulayer/v0"}, "api_version"),
        ({"workload": {"kind": "command", "argv": []}}, "workload.command.argv"),
        ({"workload": {"kind": "shell", "argv": ["x"]}}, "workload"),
        (
            {"workload": {"kind": "python", "bundle": "0" * 64, "entrypoint": "not a thing"}},
            "workload.python.entrypoint",
        ),
        (
            {"workload": {"kind": "python", "bundle": "xyz", "entrypoint": "m:f"}},
            "workload.python.bundle",
        ),
        ({**MINIMAL, "resources": {"nodes": 2}}, "resources"),
    ],
)
def test_bad_spec_error_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        parse(JobSpec, data)
    assert info.value.details["errors"][0]["field"] == field
    assert field in info.value.message
    assert info.value.status == 422


def test_unknown_field_says_unknown() -> None:
    with pytest.raises(ValidationFailed, match="resources.gpuz: unknown field"):
        parse(JobSpec, {**MINIMAL, "resources": {"gpuz": 1}})


def test_malformed_json_text_is_a_validation_error() -> None:
    with pytest.raises(ValidationFailed):
        parse(JobSpec, '{"workload": ')


class Tensorish:
    """Stands in for a tensor: an object JSON cannot carry."""


@pytest.mark.parametrize(
    ("value", "path", "hint"),
    [
        ({"x": Tensorish()}, "args['x']", "artifact"),
        ({"f": print}, "args['f']", "artifact"),
        ({"nested": [1, {"bad": {1, 2}}]}, "args['nested'][1]['bad']", "artifact"),
        ({"nan": math.nan}, "args['nan']", "None or a string"),
        ({"k": {1: "int key"}}, "args['k']", "str"),
    ],
)
def test_non_json_arguments_are_refused_with_a_way_out(value: object, path: str, hint: str) -> None:
    with pytest.raises(NotJSON) as info:
        parse(
            JobSpec,
            {
                "workload": {
                    "kind": "python",
                    "bundle": "0" * 64,
                    "entrypoint": "m:f",
                    "args": value,
                }
            },
        )
    assert info.value.details["path"] == path
    assert hint in info.value.hint
    assert "JSON" in info.value.message


def test_oversized_json_is_refused() -> None:
    with pytest.raises(NotJSON, match="limit"):
        ensure_json({"blob": "x" * (2 << 20)}, "result")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(json_values)
def test_any_json_value_is_accepted_and_round_trips(value: object) -> None:
    assert json.loads(json.dumps(ensure_json(value))) == value


def test_json_schema_file_is_current() -> None:
    # Regenerate with: python -m gpulayer_kernel.contracts.schema
    assert json.loads(Path(SCHEMA_PATH).read_text()) == export_schema(), (
        "contracts/schema.json is stale: run `python -m gpulayer_kernel.contracts.schema`"
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"workload": {"kind": "command", "argv": ["echo", "a\x00b"]}}, "workload.argv[1]"),
        ({"name": "a\x00", "workload": {"kind": "command", "argv": ["echo"]}}, "name"),
        ({"workload": {"kind": "command", "argv": ["echo"]}, "env": {"A": "x\x00"}}, "env['A']"),
        ({"workload": {"kind": "command", "argv": ["echo"]}, "workdir": "/tmp\x00"}, "workdir"),
    ],
)
def test_nul_bytes_are_refused_at_submit_naming_the_field(spec: dict[str, Any], field: str) -> None:
    # Issue 12 item 8: no process can be given a NUL byte; say so at submit, not as "worker error".
    with pytest.raises(ValidationFailed, match=re.escape(f"{field} contains a NUL byte")):
        parse(JobSpec, spec)


def test_argv_and_env_past_the_exec_limits_are_refused_at_submit() -> None:
    one = {"workload": {"kind": "command", "argv": ["echo"]}, "env": {"BIG": "x" * 200_000}}
    with pytest.raises(ValidationFailed, match=r"env\['BIG'\] is 195.3 KiB; .* at most 128 KiB"):
        parse(JobSpec, one)
    many = {
        "workload": {"kind": "command", "argv": ["echo", *["y" * 100_000] * 11]},
    }
    with pytest.raises(ValidationFailed, match="argv and env add up to"):
        parse(JobSpec, many)
    fine = {"workload": {"kind": "command", "argv": ["echo", "y" * 100_000]}}
    assert parse(JobSpec, fine).workload.argv[1] == "y" * 100_000  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "device",
    [{"index": 10**12}, {"index": 1024}, {"memory_bytes": 1 << 61}, {"name": "x" * 300}],
)
def test_a_worker_registration_is_bounded(device: dict[str, Any]) -> None:
    # Issue 12 item 1: one absurd registration must be refused at the door.
    base = {"index": 0, "vendor": "sim", "name": "Sim", "kind": "sim"}
    reg = {"name": "w", "capabilities": {"devices": [base | device]}}
    with pytest.raises(ValidationFailed, match=r"capabilities\.devices\.0\."):
        parse(WorkerRegistration, reg)


def test_a_worker_cannot_claim_one_device_index_twice() -> None:
    dev = {"index": 0, "vendor": "sim", "name": "Sim", "kind": "sim"}
    with pytest.raises(ValidationFailed, match="device index 0 appears twice"):
        parse(WorkerRegistration, {"name": "w", "capabilities": {"devices": [dev, dev]}})


def test_ensure_json_refuses_a_cycle_or_a_too_deep_value_naming_the_path() -> None:
    loop: list[Any] = [1]
    loop.append({"back": loop})
    with pytest.raises(NotJSON, match=r"args\[1\]\['back'\] contains itself"):
        ensure_json(loop, "args")
    deep: list[Any] = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(NotJSON, match="nests deeper than 200"):
        ensure_json(deep, "args")
    shared = [1]
    assert ensure_json({"a": shared, "b": shared}) == {"a": [1], "b": [1]}
