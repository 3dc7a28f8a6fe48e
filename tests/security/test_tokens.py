"""TokenService and the TLS rule, without a server."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.errors import Forbidden, InvalidInput, Unauthorized
from gpulayer_kernel.security import (
    TokenKind,
    TokenService,
    check_serve,
    check_url,
    is_loopback,
    parse_ttl,
)
from gpulayer_kernel.security.tokens import enrolled_worker_id
from gpulayer_kernel.store import SqliteStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "t.db")
    await s.open()
    yield s
    await s.close()


async def test_tokens_are_random_typed_and_stored_only_as_hashes(
    store: SqliteStore, tmp_path: Path
) -> None:
    svc = TokenService(store)
    texts = {}
    for kind in set(TokenKind) - {TokenKind.JOB}:  # a job token is derived: the test below
        rec, text = await svc.create(kind, worker_id="w1" if kind == TokenKind.WORKER else None)
        assert text.startswith(f"glt_{text[4]}_{rec.id}_") and len(text) > 50
        texts[kind] = text
        p = await svc.authenticate(text, (kind,))
        assert p.kind == kind and p.token_id == rec.id
    assert len(set(texts.values())) == len(TokenKind) - 1
    await store.close()
    raw = sqlite3.connect(tmp_path / "t.db").execute("SELECT * FROM tokens").fetchall()
    dump = repr(raw)
    for text in texts.values():
        assert (
            text.split("_", 3)[3] not in dump and text not in dump
        )  # the secret (it may hold "_")
    await store.open()


async def test_a_job_token_is_derived_not_stored_and_lives_with_its_job(
    store: SqliteStore, tmp_path: Path
) -> None:
    """No row and no record per job (a worker takes one with each assignment); the job's own
    record says who it acts as and whether it still works; both servers of a pair agree."""
    live: dict[str, str] = {"0123456789ab": "alice"}
    svc = TokenService(store)
    svc.jobs.owner_of = live.get
    text = await svc.issue_job_token("0123456789ab")
    assert text.startswith("glt_s_0123456789ab_") and len(text) > 50
    assert await svc.issue_job_token("0123456789ab") == text  # the same job, the same token
    p = await svc.authenticate(text, (TokenKind.CLIENT, TokenKind.JOB))
    assert p.kind == TokenKind.JOB and p.name == "job:0123456789ab"
    assert p.identity is not None and (p.identity.user, p.identity.role.value) == ("alice", "user")
    assert svc.list(include_inactive=True) == []
    assert sqlite3.connect(tmp_path / "t.db").execute("SELECT * FROM tokens").fetchall() == []
    standby = TokenService(store)  # the other server of an HA pair: the same cluster key
    standby.jobs.owner_of = live.get
    assert (await standby.authenticate(text, (TokenKind.JOB,))).token_id == "0123456789ab"
    with pytest.raises(Forbidden) as kind:
        await svc.authenticate(text, (TokenKind.WORKER,))
    assert kind.value.code == "wrong_token_kind"
    # another job's id under this mac, a changed mac, another cluster's key: not valid
    forged = [
        text.replace("0123456789ab", "0123456789ac"),
        text[:-2] + ("AA" if not text.endswith("AA") else "BB"),
    ]
    other = tmp_path / "other.db"
    other_store = SqliteStore(other)
    await other_store.open()
    elsewhere = TokenService(other_store)
    elsewhere.jobs.owner_of = live.get
    forged_elsewhere = await elsewhere.issue_job_token("0123456789ab")
    await other_store.close()
    for bad in [*forged, forged_elsewhere]:
        with pytest.raises(Unauthorized) as err:
            await svc.authenticate(bad, (TokenKind.JOB,))
        assert err.value.code == "token_invalid", bad
    del live["0123456789ab"]  # the job ended
    with pytest.raises(Unauthorized) as ended:
        await svc.authenticate(text, (TokenKind.JOB,))
    assert ended.value.code == "token_job_ended"
    with pytest.raises(InvalidInput) as made:
        await svc.create(TokenKind.JOB)
    assert made.value.code == "job_token_derived"
    with pytest.raises(InvalidInput):
        await svc.issue_job_token("../etc")


async def test_records_survive_a_restart(store: SqliteStore) -> None:
    svc = TokenService(store)
    _, text = await svc.create("client", name="alice")
    again = await TokenService(store).load()
    assert (await again.authenticate(text, (TokenKind.CLIENT,))).name == "alice"


@pytest.mark.parametrize(
    ("mangle", "code"),
    [
        (lambda t: "", "token_missing"),
        (lambda t: "hello", "token_malformed"),
        (lambda t: t.replace("glt_", "gXt_", 1), "token_malformed"),
        (lambda t: t[:-3] + "xyz", "token_invalid"),
        (lambda t: t.replace("glt_c_", "glt_j_", 1), "token_invalid"),
        (lambda t: "glt_c_0123456789ab_" + t.rsplit("_", 1)[-1], "token_invalid"),
    ],
)
async def test_bad_tokens_are_unauthorized(store: SqliteStore, mangle, code: str) -> None:  # type: ignore[no-untyped-def]
    svc = TokenService(store)
    _, text = await svc.create("client")
    with pytest.raises(Unauthorized) as err:
        await svc.authenticate(mangle(text), (TokenKind.CLIENT,))
    assert err.value.code == code
    assert text not in str(err.value) and text not in str(err.value.to_json())


async def test_expiry_revocation_and_kinds(store: SqliteStore) -> None:
    clock = Clock()
    svc = TokenService(store, clock=clock)
    rec, text = await svc.create("join", ttl=parse_ttl("30m"))
    assert rec.expires_at == clock.now + 1800
    await svc.authenticate(text, (TokenKind.JOIN,))
    await svc.authenticate(text, (TokenKind.JOIN,))  # reusable until it expires
    with pytest.raises(Forbidden) as wrong:
        await svc.authenticate(text, (TokenKind.CLIENT,))
    assert wrong.value.code == "wrong_token_kind"
    clock.now += 1801
    with pytest.raises(Unauthorized) as expired:
        await svc.authenticate(text, (TokenKind.JOIN,))
    assert expired.value.code == "token_expired"
    rec2, text2 = await svc.create("client")
    await svc.revoke(rec2.id)
    with pytest.raises(Unauthorized) as revoked:
        await svc.authenticate(text2, (TokenKind.CLIENT,))
    assert revoked.value.code == "token_revoked"
    assert [r.id for r in svc.list()] == []
    assert {r.id for r in svc.list(include_inactive=True)} == {rec.id, rec2.id}


async def test_an_instance_token_works_once_and_a_replay_is_logged(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    svc = TokenService(store)
    rec, text = await svc.create("instance")
    kinds = (TokenKind.JOIN, TokenKind.INSTANCE)
    with pytest.raises(Forbidden):  # the wrong route does not spend it
        await svc.authenticate(text, (TokenKind.CLIENT,))
    # Checking does not spend it either, nor does a use that fails: only a successful one.
    principal = await svc.authenticate(text, kinds)
    with pytest.raises(RuntimeError):
        async with svc.spending(principal):
            raise RuntimeError("the enrolment failed")
    assert not svc.get(rec.id).used
    async with svc.spending(await svc.authenticate(text, kinds)):
        pass
    with pytest.raises(Unauthorized) as spent_twice:  # a second request spends it no more
        async with svc.spending(principal):
            pass
    assert spent_twice.value.code == "token_replayed"
    with caplog.at_level(logging.WARNING, logger="gpulayer.security"):
        with pytest.raises(Unauthorized) as replay:
            await svc.authenticate(text, kinds)
    assert replay.value.code == "token_replayed"
    assert any(rec.id in r.getMessage() and "second use" in r.getMessage() for r in caplog.records)
    assert all(text not in r.getMessage() for r in caplog.records)
    # Spent for good, across a restart too.
    with pytest.raises(Unauthorized):
        await (await TokenService(store).load()).authenticate(text, kinds)


async def test_an_enrolment_whose_answer_was_lost_is_the_same_worker_when_sent_again(
    store: SqliteStore,
) -> None:
    """The spend is stored, then the control plane is killed before its answer leaves: the
    worker sends the same enrolment (its nonce) to this control plane or the standby, and is the
    worker that spend made. Nothing else spends the token again."""
    svc = TokenService(store)
    rec, text = await svc.create("instance")
    kinds = (TokenKind.JOIN, TokenKind.INSTANCE)
    nonce, other = "ab" * 16, "cd" * 16
    first = await svc.authenticate(text, kinds, enrolment=nonce)
    assert first.worker_id == enrolled_worker_id(rec.id, nonce) != enrolled_worker_id(rec.id, other)
    async with svc.spending(first):
        # While it enrols, the same enrolment sent again waits for no second spend: refused.
        with pytest.raises(Unauthorized) as concurrent:
            async with svc.spending(await svc.authenticate(text, kinds, enrolment=nonce)):
                pass
        assert concurrent.value.code == "token_replayed"
    assert svc.get(rec.id).used and svc.get(rec.id).worker_id == first.worker_id
    for plane in (svc, await TokenService(store).load()):  # this one, or the standby
        again = await plane.authenticate(text, kinds, enrolment=nonce)
        assert again.worker_id == first.worker_id
        async with plane.spending(again):
            pass
        for wrong in (None, other, "not-hex", "AB" * 16):  # no nonce, another, malformed ones
            with pytest.raises(Unauthorized) as replay:
                await plane.authenticate(text, kinds, enrolment=wrong)
            assert replay.value.code == "token_replayed"
    # A nonce is an instance token's only: a join token's principal is none the different.
    _, join = await svc.create("join")
    assert (await svc.authenticate(join, kinds, enrolment=nonce)).worker_id is None
    # An enrolment that fails gives the spend back, and the worker id it would have made.
    rec2, text2 = await svc.create("instance")
    with pytest.raises(RuntimeError):
        async with svc.spending(await svc.authenticate(text2, kinds, enrolment=nonce)):
            raise RuntimeError("the enrolment failed")
    assert not svc.get(rec2.id).used and svc.get(rec2.id).worker_id is None


async def test_worker_sessions_rotate(store: SqliteStore) -> None:
    svc = TokenService(store)
    first = await svc.issue_worker_session("w1")
    other = await svc.issue_worker_session("w2")
    second = await svc.issue_worker_session("w1")
    p = await svc.authenticate(second, (TokenKind.WORKER,))
    assert p.worker_id == "w1"
    with pytest.raises(Unauthorized):
        await svc.authenticate(first, (TokenKind.WORKER,))
    assert (await svc.authenticate(other, (TokenKind.WORKER,))).worker_id == "w2"
    with pytest.raises(InvalidInput):
        await svc.create(TokenKind.WORKER)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("30m", 1800),
        ("1h", 3600),
        ("7d", 604800),
        ("2w", 1209600),
        ("1.5h", 5400),
        (None, None),
        ("never", None),
    ],
)
def test_parse_ttl(text: str | None, seconds: float | None) -> None:
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5", "1y", "0", "99999w"])
def test_parse_ttl_refuses_nonsense(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_ttl(text)


@pytest.mark.parametrize(
    ("host", "loop"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("gpu-head", False),
        ("localhost.evil.com", False),
        ("::", False),
    ],
)
def test_is_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


def test_the_tls_rule() -> None:
    check_url("http://127.0.0.1:8470")
    check_url("http://localhost:8470/api/v1")
    check_url("https://gpu-head.example:8470")
    with pytest.raises(InvalidInput) as err:
        check_url("http://gpu-head.example:8470")
    assert err.value.code == "tls_required"
    assert "https://gpu-head.example:8470" in err.value.hint and "ca-cert" in err.value.hint
    with pytest.raises(InvalidInput):
        check_url("ftp://127.0.0.1")
    check_serve("127.0.0.1", None, None)
    check_serve("0.0.0.0", "cert.pem", "key.pem")
    with pytest.raises(InvalidInput) as bind:
        check_serve("0.0.0.0", None, None)
    assert bind.value.code == "tls_required" and "--tls-cert" in bind.value.hint
    with pytest.raises(InvalidInput):
        check_serve("127.0.0.1", "cert.pem", None)
