"""The key rotation's steps (``add``, ``reseal``, ``retire``, or ``all``), and who must hold a key
before it seals: every live standby of the database (``ha/standby.py`` says which keys each holds).

The steps themselves are the ``Vault``'s (``vault.py``); this runs one, refuses a re-seal that would
leave a standby unable to take over (``standby_lacks_key``), and says what the step did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import InvalidInput
from ..store import MetadataStore
from .vault import Vault, key_id

STEPS = ("all", "add", "reseal", "retire")


@dataclass(frozen=True)
class Rotation:
    """What one rotation step did: the key sealing now, the keys held, the key added or retired."""

    step: str
    key_id: str
    keys: list[str]
    source: str  # where the keys live (the key file's path), for "copy it to every standby"
    writable: bool
    added: str | None = None
    retired: tuple[str, ...] = ()


Standbys = Mapping[str, Sequence[str]]  # a standby's URL -> the key ids it holds


async def rotation_step(
    vault: Vault,
    store: MetadataStore,
    step: str,
    key: str | None,
    *,
    standbys: Standbys | None = None,
) -> Rotation:
    """Run one step of the rotation (``STEPS``) and say what it did; ``standbys``: the key ids
    each live standby holds (a re-seal is refused while one lacks the key it would seal with)."""
    if step not in STEPS:
        raise InvalidInput(
            f"no rotation step {step!r}",
            hint=f"one of: {', '.join(STEPS)} (docs/security.md)",
            code="invalid_step",
            details={"step": step},
        )
    if key is not None and step != "reseal":
        raise InvalidInput(
            f"a key is named only with the reseal step, not {step}",
            hint="gpulayer secret rotate-key --step reseal --key ID",
            code="invalid_step",
        )
    if step in ("reseal", "all") and standbys:
        _check_standbys(vault, step, key, standbys)
    added: str | None = None
    retired: tuple[str, ...] = ()
    if step == "add":
        added = vault.add_key()
    elif step == "reseal":
        await vault.reseal(store, key)
    elif step == "retire":
        retired = tuple(await vault.retire(store))
    else:
        await vault.rotate(store)
    src = vault.source
    return Rotation(
        step=step,
        key_id=vault.current,
        keys=[key_id(k) for k in vault.keys],
        source=src.where
        if src is not None and src.kind == "file"
        else (src.describe() if src else "memory"),
        writable=src is not None and src.writable,
        added=added,
        retired=retired,
    )


def _check_standbys(vault: Vault, step: str, key: str | None, standbys: Standbys) -> None:
    """Refuse to seal with a key a standby lacks: it could not take over (issue 32)."""
    src = vault.source
    where = src.where if src is not None and src.kind == "file" else "the key source"
    if step == "all" and src is not None and src.writable:
        # A one-step rotation seals at once with a key made now: no standby can hold it yet.
        raise InvalidInput(
            f"a one-step rotation would seal with a new key that no standby holds yet "
            f"({len(standbys)} standby: {', '.join(sorted(standbys))})",
            hint="rotate in three steps: `gpulayer secret rotate-key --step add`, copy "
            f"{where} to every standby, then `--step reseal --key ID` and `--step retire`",
            details={"standbys": sorted(standbys)},
            code="standby_lacks_key",
        )
    keys = vault._reread()
    target = key or (key_id(keys[0]) if keys else vault.current)
    lacking = {url: list(ids) for url, ids in standbys.items() if target not in ids}
    if lacking:
        said = "; ".join(
            f"{url} holds {', '.join(ids) or 'no key'}" for url, ids in sorted(lacking.items())
        )
        raise InvalidInput(
            f"standby {', '.join(sorted(lacking))} does not hold key {target} ({said}): sealing "
            "with it now would leave that standby unable to take over",
            hint=f"copy {where} to it (it re-reads its key file within seconds; its /health "
            "lists the keys it holds), then run this step again",
            details={"key": target, "standbys": lacking},
            code="standby_lacks_key",
        )
