"""The kernel routes over a served API (``HttpLink``, as a Jupyter host talking to
``gpulayer serve``): authenticated, contract in and out, errors with their codes; a token
lacking the role, or another user's, drives no kernel."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from gpulayer_kernel.contracts import JobState, SessionHolder
from gpulayer_kernel.contracts.kernels import KernelConnection, KernelStart
from gpulayer_kernel.errors import GPUlayerError
from gpulayer_kernel.kernels.link import HttpLink
from gpulayer_kernel.security.roles import Role
from gpulayer_kernel.wire.kernels import KernelMessage

from ..api.conftest import Api
from ..api.conftest import gl_api as gl_api  # the served-API fixture, used here too


async def test_the_kernel_routes_over_http(gl_api: Api) -> None:
    link = HttpLink(gl_api.url, gl_api.client_token)
    try:
        req = KernelStart(gpus=1, key="k" * 32, holder=SessionHolder(client="host-a"))
        info = await link.start(req)  # no worker has a GPU: it waits, with its sentence
        assert info.kernel and info.job.state == JobState.QUEUED
        assert "job" in await link.explain(info.id)  # the scheduler's sentence names it
        await link.send(info.id, [KernelMessage("shell", [b"{}"])])
        page = await link.receive(info.id, 0, 0.2)
        assert page.status.state == "waiting" and page.messages == []
        assert (await link.attach(info.id, KernelConnection(key="k" * 32))).id == info.id
        with pytest.raises(GPUlayerError) as err:
            await link.receive("nosuchkernel", 0, 0)
        assert err.value.status == 404 and err.value.code == "kernel_not_found"
        anonymous = HttpLink(gl_api.url, "")
        with pytest.raises(GPUlayerError) as err:
            await anonymous.receive(info.id, 0, 0)
        assert err.value.status == 401
        await anonymous.close()
        await link.stop(info.id, "test over")
        page = await link.receive(info.id, 0, 5)
        assert page.status.state == "ended" and "test over" in (page.status.reason or "")
        assert page.status.final  # stopped: no restart brings it back (over the stream too)
    finally:
        await link.close()


async def test_a_token_lacking_the_role_or_the_ownership_is_refused_over_http(gl_api: Api) -> None:
    for name, role in (("alice", Role.USER), ("bob", Role.USER), ("vera", Role.VIEWER)):
        await gl_api.cp.users.add(name, role)
    token = {n: await gl_api.new_token("client", owner=n) for n in ("alice", "bob", "vera")}
    # alice's own token, narrowed to viewer: a token may carry less than its user's role
    narrowed = await gl_api.new_token("client", owner="alice", role=Role.VIEWER)
    alice = HttpLink(gl_api.url, token["alice"])
    others = {n: HttpLink(gl_api.url, t) for n, t in (*token.items(), ("narrowed", narrowed))}
    try:
        req = KernelStart(gpus=1, key="k" * 32, holder=SessionHolder(client="host-v"))
        for who in ("vera", "narrowed"):  # a viewer starts no kernel
            with pytest.raises(GPUlayerError) as err:
                await others[who].start(req)
            assert (err.value.status, err.value.code) == (403, "role_forbidden"), who
        info = await alice.start(req)
        assert info.job.owner == "alice"
        frame = KernelMessage("shell", [b"{}"])
        refusals = {"bob": "not_yours", "vera": "role_forbidden", "narrowed": "role_forbidden"}
        for who, code in refusals.items():
            link = others[who]
            calls: list[Callable[..., Awaitable[object]]] = [
                lambda link=link: link.send(info.id, [frame]),
                lambda link=link: link.receive(info.id, 0, 0),
                lambda link=link: link.interrupt(info.id),
                lambda link=link: link.attach(info.id, KernelConnection(key="x" * 32)),
            ]
            for call in calls:
                with pytest.raises(GPUlayerError) as err:
                    await call()
                assert (err.value.status, err.value.code) == (403, code), (who, err.value)
        with pytest.raises(GPUlayerError) as err:
            await others["bob"].stop(info.id, "not mine")
        assert (err.value.status, err.value.code) == (403, "not_yours"), err.value
        assert (await alice.session(info.id)).job.state == JobState.QUEUED  # untouched
        await alice.send(info.id, [frame])  # the owner still drives it
        await alice.stop(info.id, "test over")
    finally:
        for link in (alice, *others.values()):
            await link.close()
