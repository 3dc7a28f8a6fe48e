"""The secrets key file and its rotation in three steps (add, reseal, retire), on a real SQLite
store, and the standby's key check (``KeyWatch``) against what the store holds.

The point of the steps: a second control plane holding a copy of the key file taken after
``add`` can open every stored value at every later step, so both keep working throughout.
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpulayer_kernel.cli.secret import rotation_advice
from gpulayer_kernel.errors import InvalidInput, SecretsKeyError
from gpulayer_kernel.ha.standby import KeyWatch
from gpulayer_kernel.security.rotation import rotation_step
from gpulayer_kernel.security.vault import (
    KeySource,
    Vault,
    key_id,
    missing_keys,
    new_key,
    parse_keys,
)
from gpulayer_kernel.store import SecretRecord, SqliteStore


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "t.db")
    await s.open()
    yield s
    await s.close()


async def sealed_ids(store: SqliteStore) -> dict[str, int]:
    """What ``standby.sealing_keys`` reads on PostgreSQL, read here from SQLite."""
    ids: dict[str, int] = {}
    for rec in await store.list_secrets():
        kid = rec.value.split(":")[1]
        ids[kid] = ids.get(kid, 0) + 1
    return ids


async def opened(store: SqliteStore, source: KeySource) -> dict[str, str]:
    """Every stored value, opened the way a control plane taking over opens them."""
    vault = await Vault.open(source, store)
    return {r.name: vault.unseal(r) for r in await store.list_secrets()}


def test_a_key_file_lists_keys_by_id_and_a_garbled_copy_is_named(tmp_path: Path) -> None:
    a, b = new_key(), new_key()
    source = KeySource("file", str(tmp_path / "secrets.key"))
    source.write([a, b])
    text = (tmp_path / "secrets.key").read_text()
    assert f"{key_id(a)} " in text and f"{key_id(b)} " in text and text.startswith("#")
    assert os.stat(tmp_path / "secrets.key").st_mode & 0o777 == 0o600
    assert source.read(create=False) == [a, b]
    # A bare key per line (the old format) still reads; so does a comma list.
    bare = base64.urlsafe_b64encode(a).decode()
    assert parse_keys(f"{bare}\n\n# note\n", "f") == [a]
    assert parse_keys(f"{bare},{key_id(b)} {base64.urlsafe_b64encode(b).decode()}", "v") == [a, b]
    with pytest.raises(SecretsKeyError) as info:
        parse_keys(f"{key_id(b)} {bare}", "the key file K")
    assert info.value.code == "secrets_key" and "garbled" in info.value.message
    assert "the key file K, entry 1" in info.value.message
    with pytest.raises(SecretsKeyError, match="not a secrets key"):
        parse_keys("deadbeef c2hvcnQ=", "the key file K")
    assert missing_keys([a], {key_id(a): 2, key_id(b): 1}) == [key_id(b)]


async def test_rotating_in_steps_keeps_a_copy_taken_after_add_working(
    store: SqliteStore, tmp_path: Path
) -> None:
    leader_file, standby_file = tmp_path / "leader.key", tmp_path / "standby.key"
    leader = KeySource("file", str(leader_file))
    standby = KeySource("file", str(standby_file))
    vault = await Vault.open(leader, store)
    old = vault.current
    await store.replace_secrets([vault.sealed(SecretRecord("alice", "HF", "v1", 0.0))])
    shutil.copy(leader_file, standby_file)

    added = await rotation_step(vault, store, "add", None)
    assert added.added and added.keys == [old, added.added] and added.key_id == old
    assert added.source == str(leader_file) and added.writable
    assert await sealed_ids(store) == {old: 1}  # nothing re-sealed: the old copy still opens
    assert await opened(store, standby) == {"HF": "v1"}
    shutil.copy(leader_file, standby_file)  # what `rotate-key --step add` says to do

    with pytest.raises(InvalidInput) as info:  # two keys: which one seals must be said
        await rotation_step(vault, store, "reseal", None)
    assert info.value.code == "unknown_key"
    with pytest.raises(InvalidInput) as info:
        await rotation_step(vault, store, "reseal", "0badc0de")
    assert info.value.code == "unknown_key" and "0badc0de" in info.value.message
    resealed = await rotation_step(vault, store, "reseal", added.added)
    assert resealed.key_id == added.added and resealed.keys == [added.added, old]
    assert await sealed_ids(store) == {added.added: 1}
    assert await opened(store, standby) == {"HF": "v1"}  # the copy holds both
    await store.set_secret("NEW", vault.seal("alice", "NEW", "v2"), owner="alice")

    retired = await rotation_step(vault, store, "retire", None)
    assert retired.retired == (old,) and retired.keys == [added.added]
    assert leader.read(create=False) == vault.keys and len(vault.keys) == 1
    assert await opened(store, standby) == {"HF": "v1", "NEW": "v2"}
    assert await opened(store, leader) == {"HF": "v1", "NEW": "v2"}


async def test_one_step_rotation_and_bad_steps(store: SqliteStore, tmp_path: Path) -> None:
    source = KeySource("file", str(tmp_path / "k"))
    vault = await Vault.open(source, store)
    first = vault.current
    await store.replace_secrets([vault.sealed(SecretRecord("bob", "A", "x", 0.0))])
    done = await rotation_step(vault, store, "all", None)
    assert done.key_id != first and done.keys == [done.key_id]
    assert await sealed_ids(store) == {done.key_id: 1}
    for step, key in (("rewind", None), ("add", "abc")):
        with pytest.raises(InvalidInput) as info:
            await rotation_step(vault, store, step, key)
        assert info.value.code == "invalid_step"
    # A source GPUlayer cannot write gets no key added: it says where to add one.
    os.environ["GL_TEST_KEYS"] = base64.urlsafe_b64encode(new_key()).decode()
    try:
        env_vault = Vault(KeySource("env", "GL_TEST_KEYS").read(create=False) or [])
        env_vault.source = KeySource("env", "GL_TEST_KEYS")
        with pytest.raises(InvalidInput) as info:
            env_vault.add_key()
        assert info.value.code == "key_not_writable" and "$GL_TEST_KEYS" in info.value.message
    finally:
        del os.environ["GL_TEST_KEYS"]


async def test_the_standby_key_watch_names_a_missing_wrong_and_stale_key(
    store: SqliteStore, tmp_path: Path
) -> None:
    leader_file, mine = tmp_path / "leader.key", tmp_path / "standby.key"
    vault = await Vault.open(KeySource("file", str(leader_file)), store)
    watch = KeyWatch(KeySource("file", str(mine)), lambda: sealed_ids(store), every=0.1)
    assert await watch.check() is None  # nothing sealed yet, no file: nothing to open

    await store.replace_secrets([vault.sealed(SecretRecord("alice", "HF", "v", 0.0))])
    missing = await watch.check()
    assert missing is not None and missing.code == "secrets_key"
    assert "is missing" in missing.message and vault.current in missing.message

    KeySource("file", str(mine)).write([new_key()])  # a key, but not the leader's
    wrong = await watch.check()
    assert wrong is not None and f"cannot open key {vault.current}" in wrong.message
    assert wrong.details["missing"] == [vault.current]

    shutil.copy(leader_file, mine)
    assert await watch.check() is None and watch.problem is None

    await vault.rotate(store)  # the leader rotated in one step, the copy is stale
    stale = await watch.check()
    assert stale is not None and f"cannot open key {vault.current}" in stale.message
    assert watch.problem is stale
    shutil.copy(leader_file, mine)
    assert await watch.check() is None

    good = mine.read_text().splitlines()[-1].split()[1]
    mine.write_text(f"0000aaaa {good}\n")  # a hand-edited copy: the label is not the key's id
    garbled = await watch.check()
    assert garbled is not None and "garbled" in garbled.message


def test_each_step_says_what_to_copy_where() -> None:
    base = {"key_id": "aaaa1111", "keys": ["aaaa1111", "bbbb2222"], "added": None, "retired": []}
    file = {**base, "source": "/etc/gpulayer/secrets.key", "writable": True}
    add = rotation_advice({**file, "step": "add", "added": "bbbb2222"})
    assert "step 1 of 3" in add and "copy /etc/gpulayer/secrets.key" in add
    assert "every standby" in add and "--step reseal --key bbbb2222" in add
    assert "--step retire" in rotation_advice({**file, "step": "reseal"})
    retire = rotation_advice({**file, "step": "retire", "retired": ["cccc3333"]})
    assert "keys retired: cccc3333" in retire and "copy /etc/gpulayer/secrets.key" in retire
    one = rotation_advice({**file, "step": "all"})
    assert "sealed with key aaaa1111" in one and "If standbys share" in one
    env = {**base, "source": "$GPULAYER_SECRETS_KEY", "writable": False}
    said = rotation_advice({**env, "step": "retire", "retired": ["cccc3333"]})
    assert "change that source on every control plane" in said and "cccc3333" in said
