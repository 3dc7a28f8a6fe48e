"""The audit log (store migration 8): who did what, names and ids only, in the action's own group
commit; admins read it (``GET /api/v1/audit``, ``gpulayer audit``) in bounded pages. Tokens
record their last use, at most one write a minute each. ``gpulayer costs`` is paged."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.cli.providers import costs_text
from gpulayer_kernel.contracts import CommandWorkload, CostReport, CostRow, JobSpec
from gpulayer_kernel.security import TokenKind, TokenService
from gpulayer_kernel.store import AuditQuery, SqliteStore
from gpulayer_kernel.testing import GL

from ..api.conftest import Api, running_api


@pytest.fixture
async def gl_api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path) as api:
        yield api


SECRET_VALUE = "hunter2-never-in-the-log"


async def test_actions_are_logged_with_names_and_ids_never_secret_values(gl_api: Api) -> None:
    api = gl_api
    r = await api.call(
        "POST", "/jobs", json={"name": "audited", "workload": {"kind": "command", "argv": ["true"]}}
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert (await api.call("POST", f"/jobs/{job_id}/cancel")).status_code == 200
    assert (await api.call("PUT", "/secrets/DB_PASS", json={"value": SECRET_VALUE})).is_success
    assert (await api.call("POST", "/users", json={"name": "ann", "role": "user"})).is_success
    assert (await api.call("POST", "/users/ann", json={"role": "viewer"})).is_success
    quota = {"max_gpus": 2, "max_queued": None}
    assert (await api.call("PUT", "/quotas/user/ann", json=quota)).is_success
    made = await api.call("POST", "/tokens", json={"kind": "client", "user": "ann"})
    token_id, ann_token = made.json()["token"]["id"], made.json()["secret"]
    assert (await api.call("POST", f"/tokens/{token_id}/revoke")).is_success
    budget = {"name": "b1", "scope": "project", "match": "p", "limit": 10}
    assert (await api.call("POST", "/budgets", json=budget)).is_success

    r = await api.call("GET", "/audit")
    assert r.status_code == 200, r.text
    page = r.json()
    actions = [e["action"] for e in reversed(page["entries"])]
    assert actions == [
        "job.submit",
        "job.cancel",
        "secret.set",
        "user.add",
        "user.update",
        "quota.set",
        "token.create",
        "token.revoke",
        "budget.set",
    ]
    assert page["total"] == 9 and page["next_before"] is None
    by_action = {e["action"]: e for e in page["entries"]}
    assert by_action["job.submit"]["target"] == job_id
    assert by_action["job.submit"]["user"] == "admin"
    assert by_action["secret.set"]["target"] == "DB_PASS"
    assert by_action["token.create"]["target"] == token_id
    assert by_action["user.update"]["detail"]["role"] == "viewer"
    assert by_action["user.add"]["target"] == "ann" and by_action["user.add"]["user"] == "admin"
    assert by_action["user.add"]["detail"]["role"] == "user"  # issue 32: it wrote no row
    assert SECRET_VALUE not in r.text and ann_token not in r.text
    # Stored: the database file holds no secret value either (the log is plain text).
    rows, _ = await api.store.list_audit(AuditQuery(limit=1000))
    assert SECRET_VALUE not in repr(rows)

    # Filters and paging: newest first, `before` goes on where the page ended.
    r = await api.call("GET", "/audit", params={"action": "job.submit"})
    assert [e["target"] for e in r.json()["entries"]] == [job_id]
    first = (await api.call("GET", "/audit", params={"limit": 3})).json()
    assert len(first["entries"]) == 3 and first["total"] == 9
    rest = (await api.call("GET", "/audit", params={"before": first["next_before"]})).json()
    seen = [e["seq"] for e in first["entries"] + rest["entries"]]
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == 9
    assert (await api.call("GET", "/audit", params={"user": "ann"})).json()["total"] == 0


async def test_only_admins_read_it_and_bad_filters_are_refused(gl_api: Api) -> None:
    api = gl_api
    await api.cp.users.add("vic", "viewer")
    viewer = await api.new_token("client", owner="vic")
    r = await api.call("GET", "/audit", viewer)
    assert r.status_code == 403
    # It says what was refused (issue 32: "vic (viewer) may not the audit log, newest first…").
    assert r.json()["message"].startswith("vic (viewer) may not call GET /audit: that needs")
    assert (await api.call("GET", "/audit", None)).status_code == 401
    r = await api.call("GET", "/audit", params={"action": "job.explode"})
    assert r.status_code == 400 and r.json()["code"] == "audit_action"
    assert "job.submit" in r.json()["hint"]
    r = await api.call("GET", "/audit", params={"limit": "5000"})
    assert r.status_code == 400 and r.json()["details"]["parameter"] == "limit"


async def test_a_submit_and_its_audit_row_share_one_commit(gl_api: Api) -> None:
    cp, store = gl_api.cp, gl_api.store
    await cp.scheduling.run_pass()  # nothing else in flight
    before = store.commits
    job = await cp.submit(JobSpec(workload=CommandWorkload(argv=["true"])))
    assert store.commits - before == 1  # the job row and the audit row: one transaction
    rows, total = await store.list_audit(AuditQuery(action="job.submit"))
    assert total == 1 and rows[0].target == job.id


async def test_the_numbering_carries_on_after_a_restart(tmp_path: Path) -> None:
    from gpulayer_kernel.controlplane.audit import AuditLog

    store = SqliteStore(tmp_path / "a.db")
    await store.open()
    log = AuditLog(store)
    await log.record(None, "budget.delete", "x")
    await log.record(None, "budget.delete", "y")
    again = AuditLog(store)
    await again.load()
    await again.record(None, "budget.delete", "z")
    rows, total = await store.list_audit(AuditQuery())
    assert [r.seq for r in rows] == [3, 2, 1] and total == 3
    await store.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_tokens_record_their_last_use_at_most_once_a_minute(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "t.db")
    await store.open()
    clock = Clock()
    tokens = await TokenService(store, clock=clock).load()
    rec, text = await tokens.create(TokenKind.CLIENT, name="ci")
    assert rec.last_used is None
    before = store.commits
    for _ in range(20):  # a busy client: one write
        await tokens.authenticate(text, (TokenKind.CLIENT,))
        clock.now += 1.0
    await store._drain()
    assert store.commits - before == 1
    assert (await store.token_uses()) == {rec.id: 1000.0}
    clock.now = 1000.0 + 61.0
    await tokens.authenticate(text, (TokenKind.CLIENT,))
    await store._drain()
    assert (await store.token_uses()) == {rec.id: 1061.0}
    reloaded = await TokenService(store, clock=clock).load()
    assert reloaded.get(rec.id).last_used == 1061.0
    await store.close()


async def test_the_tokens_listing_shows_the_last_use(gl_api: Api) -> None:
    await gl_api.call("GET", "/status")
    tokens = (await gl_api.call("GET", "/tokens")).json()["tokens"]
    used = [t for t in tokens if t["name"] == "test"]
    assert used and used[0]["last_used"] is not None
    assert all(t["last_used"] is None for t in tokens if t["name"] == "test-join")


def test_costs_show_the_costliest_rows_and_say_how_many_were_left_out() -> None:
    rows = [CostRow(key=f"job{i}", charge=float(i)) for i in range(473)]
    report = CostReport(by="job", rows=rows, total_charge=sum(r.charge for r in rows))
    text = costs_text(report, 50)
    lines = text.splitlines()
    assert len(lines) == 1 + 50 + 2
    assert "job472" in text and "job0 " not in text
    assert lines[-1].startswith("showing 50 of 473 rows")
    assert "showing" not in costs_text(report, 0)
    assert "showing" not in costs_text(report, 500)


@pytest.mark.slow  # ~8-12 s: six CLI processes, each opening the state directory
def test_the_cli_pages_the_audit_log_and_refuses_a_negative_costs_limit(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / "home")  # the state directory, opened by the CLI

    def gl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*GL, *args], capture_output=True, text=True, timeout=60, env=env)

    for name in ("ann", "bob", "cy"):
        assert gl("user", "add", name).returncode == 0
    for name in ("ann", "bob"):
        assert gl("quota", "set", "--user", name, "--max-gpus", "1").returncode == 0
    out = gl("audit", "--action", "quota.set", "--limit", "1")
    assert out.returncode == 0, out.stderr
    assert "quota.set" in out.stdout and "user/bob" in out.stdout
    assert "showing 1 of 2; next page: --before" in out.stdout
    seq = out.stdout.rsplit("--before ", 1)[1].strip()
    older = gl("audit", "--action", "quota.set", "--before", seq)
    assert "user/ann" in older.stdout and "showing 1 of 2" in older.stdout
    # `gpulayer user add` is audited too (issue 32: it wrote no row).
    added = gl("audit", "--action", "user.add")
    assert added.returncode == 0, added.stderr
    assert all(name in added.stdout for name in ("ann", "bob", "cy")), added.stdout
    bad = gl("audit", "--action", "nope")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    neg = gl("costs", "--limit", "-1")
    assert neg.returncode == 2 and "--limit -1 is negative" in neg.stderr


@pytest.mark.slow  # ~4 s with two xdist workers on two cores
def test_the_add_step_of_a_rotation_names_the_new_key(tmp_path: Path) -> None:
    """Issue 32, item 7: the `secret.rotate_key step=add` row named the old key (the one still
    sealing); it names the key added, with the sealing one beside it. The CLI's own path (no
    server) is audited too."""
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / "home")

    def gl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*GL, *args], capture_output=True, text=True, timeout=60, env=env)

    made = subprocess.run(
        [*GL, "secret", "set", "HF_TOKEN"], input="v", capture_output=True, text=True,
        timeout=60, env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    added = gl("secret", "rotate-key", "--step", "add")
    assert added.returncode == 0, added.stderr
    new = added.stderr.split("--key ")[1].split()[0]
    out = gl("audit", "--action", "secret.rotate_key", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["entries"]
    assert row["target"] == new and row["detail"]["step"] == "add"
    assert row["detail"]["sealing"] != new  # the key still sealing, beside it
