"""Who may drive a GPU kernel: its owner (or an admin); another user is refused, a viewer may
look at its session but not drive it. The relay's checks, on a real control plane."""

from __future__ import annotations

import pytest

from gpulayer_kernel.contracts import SessionHolder
from gpulayer_kernel.contracts.kernels import KernelStart
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.security.roles import Identity, Role
from gpulayer_kernel.wire.kernels import KernelMessage

from .conftest import Plane

ALICE = Identity("alice", Role.USER)
BOB = Identity("bob", Role.USER)
CAROL = Identity("carol", Role.VIEWER)


def test_only_the_owner_drives_a_kernel(gl_plane: Plane) -> None:
    relay = gl_plane.cp.kernels
    req = KernelStart(gpus=1, key="k" * 32, holder=SessionHolder(client="alice-kernel"))
    info = gl_plane.call(relay.start(req, ALICE))
    assert info.kernel and info.job.owner == "alice"
    frame = KernelMessage("shell", [b"{}"])
    gl_plane.call(relay.send(info.id, [frame], ALICE))
    for who, code in ((BOB, "not_yours"), (CAROL, "role_forbidden")):
        with pytest.raises(GPUlayerError) as err:
            gl_plane.call(relay.send(info.id, [frame], who))
        assert err.value.status == 403, (who, err.value)
        assert err.value.code == code, err.value
        with pytest.raises(GPUlayerError):
            gl_plane.call(relay.interrupt(info.id, who))
    # a viewer still sees the session (it is listed like any session)
    seen = gl_plane.call(gl_plane.cp.get_session(info.id, who=Identity("carol", Role.ADMIN)))
    assert seen.kernel
    with pytest.raises(GPUlayerError) as err:
        gl_plane.call(relay.send(info.id, [KernelMessage("iopub", [])], ALICE))
    assert err.value.code == "bad_channel"
    gl_plane.call(gl_plane.cp.stop_session(info.id))
