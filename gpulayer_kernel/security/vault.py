"""Secrets sealed at rest: AES-256-GCM, with a key that never enters the database.

A stored value reads ``gv1:<key id>:<base64(nonce | ciphertext+tag)>``. The key id is the first 8
hex of the key's sha256, so a wrong key is named as such instead of failing as "bad data"; the
secret's owner and name are the associated data, so a sealed value moved to another name or user
does not open. Values are opened only to hand them to the job that names them, and to the
redactor; no API returns one.

Where the key comes from (``key_source``), first match wins:

- ``GPULAYER_SECRETS_KEY``: the key itself (base64), or several separated by commas;
- ``GPULAYER_SECRETS_KEY_COMMAND``: a command that prints them, one per line (a KMS, a vault);
- a key file, by default ``secrets.key`` in the state directory (mode 0600), made on first use;
  a file others may read (0644) is refused, naming its mode: the key opens every secret.

A source holds several keys: one per line, each ``ID KEY`` (the id checked against the key, so a
garbled copy is named as such) or a bare ``KEY``; ``#`` starts a comment. The first seals, every
one opens. Rotation has three steps, so that a standby holding a copy of the file keeps working
throughout (docs/security.md): ``add_key`` appends a new key (nothing re-sealed: copy the file to
every standby now), ``reseal`` makes it the first and re-seals every stored secret with it in one
transaction, ``retire`` drops the keys no stored secret needs. ``rotate`` does all three at once,
for a lone server. A crash at any point leaves every value openable. On a database with standbys,
``reseal`` (and ``all``) is refused while a standby does not hold the key it would seal with:
each standby says which keys it holds (``ha/standby.py``), and a standby without the new key could
not take over.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import secrets
import shlex
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import InvalidInput, SecretsKeyError
from ..store import MetadataStore, SecretRecord

log = logging.getLogger("gpulayer.security")

KEY_ENV = "GPULAYER_SECRETS_KEY"
KEY_COMMAND_ENV = "GPULAYER_SECRETS_KEY_COMMAND"
KEY_FILE = "secrets.key"
PREFIX = "gv1"


def key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:8]


def new_key() -> bytes:
    return secrets.token_bytes(32)


def _encode(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode()


def _decode(text: str, where: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.strip() + "=" * (-len(text.strip()) % 4))
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise SecretsKeyError(
            f"{where} holds something that is not a secrets key",
            hint="a key is 32 random bytes in base64 (as `gpulayer secret rotate-key` writes)",
            details={"source": where},
        )
    return key


def parse_keys(text: str, where: str) -> list[bytes]:
    """The keys in ``text``: one per line or comma, each ``ID KEY`` or ``KEY``; ``#`` comments."""
    keys: list[bytes] = []
    entries = [e for line in text.splitlines() for e in line.split("#", 1)[0].split(",")]
    for n, entry in enumerate(entries, 1):
        parts = entry.split()
        if not parts:
            continue
        key = _decode(parts[-1], where)
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != key_id(key)):
            raise SecretsKeyError(
                f"{where}, entry {n}: the key is labelled {parts[0]!r}, but its id is "
                f"{key_id(key)}: the copy is garbled",
                hint="copy the key file again from the control plane that rotated the key",
                details={"source": where, "entry": n},
            )
        keys.append(key)
    return keys


def is_sealed(value: str) -> bool:
    return value.startswith(PREFIX + ":")


def check_private(path: Path) -> None:
    """Refuse a key file that others than its owner may read or write (0644: any local user
    could open every secret), saying its mode and the fix."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SecretsKeyError(
            f"the key file {path} has mode {mode:04o}: users other than its owner can read or "
            "write it, and it opens every secret",
            hint=f"chmod 600 {path} (GPUlayer writes it 0600; copy it with its mode, e.g. "
            "`install -m 600`)",
            details={"source": str(path), "mode": f"{mode:04o}"},
        )


# The key of ``MEMORY_KEYS``: one per process, for tests and stores that end with the process.
_PROCESS_KEY = new_key()


@dataclass(frozen=True)
class KeySource:
    """Where the keys come from: an environment variable, a command, a file, or memory."""

    kind: str  # env | command | file | memory
    where: str  # the variable, the command line, or the file's path

    @property
    def writable(self) -> bool:
        return self.kind == "file"

    def read(self, *, create: bool) -> list[bytes] | None:
        """The keys; None when a file source has no file (and ``create`` is false)."""
        if self.kind == "env":
            return parse_keys(os.environ.get(self.where, ""), f"${self.where}")
        if self.kind == "command":
            return parse_keys(self._run(), f"${KEY_COMMAND_ENV}")
        if self.kind == "memory":
            return [_PROCESS_KEY]
        path = Path(self.where)
        if not path.exists():
            if not create:
                return None
            self.write([new_key()])
        check_private(path)
        return parse_keys(path.read_text(), str(path))

    def _run(self) -> str:
        try:
            out = subprocess.run(
                shlex.split(self.where), capture_output=True, text=True, timeout=30, check=True
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise SecretsKeyError(
                f"the secrets key command failed: {exc}",
                hint=f"check ${KEY_COMMAND_ENV}: it must print the key(s), one per line",
            ) from None
        return out.stdout

    def write(self, keys: Sequence[bytes]) -> None:
        """Replace the file's keys (temp file, fsync, rename; mode 0600)."""
        if not self.writable:
            raise InvalidInput(
                f"the secrets keys come from {self.describe()}, which GPUlayer cannot rewrite",
                hint="put the new key first in that source, keep the old one after it, run "
                "`gpulayer secret rotate-key`, then drop the old key",
                code="key_not_writable",
            )
        path = Path(self.where)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, (_HEADER + "".join(f"{key_id(k)} {_encode(k)}\n" for k in keys)).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def describe(self) -> str:
        return {
            "env": f"${self.where}",
            "command": f"${KEY_COMMAND_ENV}",
            "memory": "this process's key",
        }.get(self.kind, f"the key file {self.where}")


_HEADER = (
    "# GPUlayer secrets keys (docs/security.md): the first seals, every one opens.\n"
    "# Every control plane of the database needs a copy of this whole file.\n"
)

#: A key made when the process starts and gone when it ends: for tests, and for a ControlPlane
#: given no key source (its sealed secrets cannot be opened by another process).
MEMORY_KEYS = KeySource("memory", "")


def key_source(home: Path | None, key_file: str | None = None) -> KeySource:
    """The source in force: the environment first, then ``key_file``, then the home's file."""
    if os.environ.get(KEY_ENV):
        return KeySource("env", KEY_ENV)
    if os.environ.get(KEY_COMMAND_ENV):
        return KeySource("command", os.environ[KEY_COMMAND_ENV])
    if key_file:
        return KeySource("file", str(Path(key_file).expanduser().resolve()))
    if home is None:
        raise SecretsKeyError(
            "no key for secrets", hint=f"set {KEY_ENV} or pass --secrets-key FILE"
        )
    return KeySource("file", str(home / KEY_FILE))


class Vault:
    """Seals and opens secret values with the keys of one ``KeySource``."""

    def __init__(self, keys: Sequence[bytes], source: KeySource | None = None) -> None:
        if not keys:
            raise SecretsKeyError(
                "no secrets key was given", hint=f"set {KEY_ENV} to a key (base64 of 32 bytes)"
            )
        self.source = source
        self._use(keys)

    @classmethod
    async def open(cls, source: KeySource, store: MetadataStore) -> Vault:
        """The vault for ``store``: refuses (``SecretsKeyError``) when its key is missing or is not
        the one that sealed the stored secrets; seals values stored before encryption."""
        stored = await store.list_secrets()
        sealed = [s for s in stored if is_sealed(s.value)]
        keys = source.read(create=not sealed)
        if keys is None:
            raise SecretsKeyError(
                f"{source.describe()} is missing, and the database holds {len(sealed)} "
                f"secret(s) sealed with key {_kid(sealed[0].value)}",
                hint="restore the key file from your backup (it is never stored in the database), "
                f"or point to the key with --secrets-key FILE or {KEY_ENV}",
                details={"source": source.where, "sealed": len(sealed)},
            )
        vault = cls(keys, source)
        for s in sealed:
            vault.unseal(s)  # every one, now: a wrong key stops the start, not a job later
        plain = [s for s in stored if not is_sealed(s.value)]
        if plain:
            await store.replace_secrets([vault.sealed(s) for s in plain])
            log.info("sealed %d secret(s) stored before encryption at rest", len(plain))
        return vault

    def seal(self, owner: str, name: str, value: str) -> str:
        nonce = secrets.token_bytes(12)
        box = self._by_id[self.current].encrypt(nonce, value.encode(), _aad(owner, name))
        return f"{PREFIX}:{self.current}:{base64.b64encode(nonce + box).decode()}"

    def sealed(self, rec: SecretRecord) -> SecretRecord:
        """``rec`` with its plaintext value sealed."""
        return SecretRecord(
            rec.owner, rec.name, self.seal(rec.owner, rec.name, rec.value), rec.updated_at
        )

    def unseal(self, rec: SecretRecord) -> str:
        """The plaintext of a stored secret (refusing a value sealed with another key)."""
        kid = _kid(rec.value)
        aes = self._by_id.get(kid)
        if aes is None:
            raise SecretsKeyError(
                f"secret {rec.name} of {rec.owner} was sealed with key {kid}, which "
                f"{self.source.describe() if self.source else 'this vault'} does not hold "
                f"(it holds {', '.join(self._by_id)})",
                hint="point GPUlayer at the key the secrets were sealed with (the key file "
                f"beside the state, --secrets-key FILE or {KEY_ENV})",
                details={"secret": rec.name, "owner": rec.owner, "key": kid},
            )
        try:
            raw = base64.b64decode(rec.value.split(":", 2)[2])
            return aes.decrypt(raw[:12], raw[12:], _aad(rec.owner, rec.name)).decode()
        except (InvalidTag, binascii.Error, ValueError, IndexError):
            raise SecretsKeyError(
                f"secret {rec.name} of {rec.owner} does not open with key {kid}: the stored "
                "value was changed or moved",
                hint=f"set it again: gpulayer secret set {rec.name}",
                details={"secret": rec.name, "owner": rec.owner},
            ) from None

    def _use(self, keys: Sequence[bytes]) -> None:
        self.keys = list(keys)
        self._by_id = {key_id(k): AESGCM(k) for k in self.keys}
        self.current = key_id(self.keys[0])

    def _reread(self) -> list[bytes]:
        """The source's keys now (an admin may have changed it since the start)."""
        if self.source is None or self.source.kind == "memory":
            return self.keys
        return self.source.read(create=False) or self.keys

    def add_key(self) -> str:
        """Rotation step 1: append a new key to the key file; it seals nothing yet, so a standby
        without it keeps working until step 2. Returns the new key's id."""
        if self.source is None or not self.source.writable:
            raise InvalidInput(
                "the secrets keys come from "
                f"{self.source.describe() if self.source else 'memory'}, which GPUlayer cannot "
                "add a key to",
                hint="add the new key after the current one in that source on every control "
                "plane, restart them, then run `gpulayer secret rotate-key --step reseal "
                "--key ID`",
                code="key_not_writable",
            )
        keys = self._reread()
        fresh = new_key()
        self.source.write([*keys, fresh])
        self._use([*keys, fresh])
        return key_id(fresh)

    async def reseal(self, store: MetadataStore, key: str | None = None) -> str:
        """Rotation step 2: re-seal every stored secret with ``key`` (which must be named when
        the source holds several), which seals new values from now on; its id."""
        keys = self._reread()
        ids = [key_id(k) for k in keys]
        where = self.source.describe() if self.source else "memory"
        if key is None and len(ids) > 1 and not (self.source and not self.source.writable):
            raise InvalidInput(
                f"{where} holds several keys ({', '.join(ids)}): which one should seal?",
                hint="name it: `gpulayer secret rotate-key --step reseal --key ID` (the id "
                "`--step add` printed)",
                code="unknown_key",
                details={"held": ids},
            )
        target = key or ids[0]
        if target not in ids:
            raise InvalidInput(
                f"no key {target!r} in {where} (it holds {', '.join(ids)})",
                hint="name a key the source holds, or add one first: "
                "`gpulayer secret rotate-key --step add`",
                code="unknown_key",
                details={"key": target, "held": ids},
            )
        self._use(keys)  # opens every value sealed with any key the source holds
        stored = await store.list_secrets()
        plain = [SecretRecord(s.owner, s.name, self.unseal(s), s.updated_at) for s in stored]
        order = [keys[ids.index(target)], *(k for k in keys if key_id(k) != target)]
        if self.source is not None and self.source.writable:
            self.source.write(order)  # every key still there: a crash now leaves all openable
        target_vault = Vault(order, self.source)
        await store.replace_secrets([target_vault.sealed(s) for s in plain])
        self._use(order)
        return self.current

    async def retire(self, store: MetadataStore) -> list[str]:
        """Rotation step 3: drop from the key file every key that seals nothing stored (never
        the first); the ids dropped. A source GPUlayer cannot write is only checked."""
        keys = self._reread()
        used = {_kid(s.value) for s in await store.list_secrets() if is_sealed(s.value)}
        keep = [k for i, k in enumerate(keys) if i == 0 or key_id(k) in used]
        dropped = [key_id(k) for k in keys if k not in keep]
        if dropped and self.source is not None and self.source.writable:
            self.source.write(keep)
        self._use(keep if self.source is None or self.source.writable else keys)
        return dropped

    async def rotate(self, store: MetadataStore) -> str:
        """All three steps at once, for a lone control plane (or, for a source GPUlayer cannot
        write, a re-seal with its first key); the id of the key now in use."""
        if self.source is not None and self.source.writable:
            current = await self.reseal(store, self.add_key())
            await self.retire(store)
            return current
        return await self.reseal(store)


def missing_keys(keys: Sequence[bytes], needed: Iterable[str]) -> list[str]:
    """The key ids among ``needed`` (those sealing stored secrets) that ``keys`` cannot open."""
    held = {key_id(k) for k in keys}
    return sorted(set(needed) - held)


def _aad(owner: str, name: str) -> bytes:
    return f"{owner}\x00{name}".encode()


def _kid(value: str) -> str:
    parts = value.split(":", 2)
    return parts[1] if len(parts) == 3 else "?"
