"""The client calls of providers, instances, costs and budgets, for both clients (ADR 0010, 0011).

As in ``calls.py``, each call is written once as a generator of requests; ``AsyncProvisioning``
and ``Provisioning`` are the two clients' methods over them (``clients.py`` mixes them in), the
same names and answers as the ControlPlane's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar
from urllib.parse import quote

from ..contracts import Budget, BudgetList, BudgetStatus, CostReport, InstanceList, ProviderList
from ..contracts.costs import GroupBy
from .calls import Call, Req

T = TypeVar("T")


class ProvisioningCalls:
    def providers(self) -> Call[ProviderList]:
        # Checking a provider may take it a while (an SSH host, sinfo): a longer timeout.
        resp = yield Req("GET", "/providers", timeout=90.0)
        return ProviderList.model_validate_json(resp.content)

    def instances(self, ended: bool = False) -> Call[InstanceList]:
        resp = yield Req("GET", "/instances", params=[("ended", "1" if ended else "0")])
        return InstanceList.model_validate_json(resp.content)

    def costs(self, by: GroupBy = "job", since: float | None = None) -> Call[CostReport]:
        params = [("by", by)] + ([("since", f"{since:.3f}")] if since is not None else [])
        resp = yield Req("GET", "/costs", params=params)
        return CostReport.model_validate_json(resp.content)

    def budgets(self) -> Call[BudgetList]:
        return BudgetList.model_validate_json((yield Req("GET", "/budgets")).content)

    def set_budget(self, budget: Budget) -> Call[BudgetStatus]:
        resp = yield Req("POST", "/budgets", json=budget.model_dump_json())
        return BudgetStatus.model_validate_json(resp.content)

    def delete_budget(self, name: str) -> Call[None]:
        yield Req("DELETE", f"/budgets/{quote(name, safe='')}")


_CALLS = ProvisioningCalls()


class AsyncProvisioning:
    """``AsyncClient``'s provisioning methods (it provides ``_run``)."""

    if TYPE_CHECKING:  # AsyncClient's

        async def _run(self, call: Call[T]) -> T: ...

    async def providers(self) -> ProviderList:
        return await self._run(_CALLS.providers())

    async def instances(self, ended: bool = False) -> InstanceList:
        return await self._run(_CALLS.instances(ended))

    async def costs(self, by: GroupBy = "job", since: float | None = None) -> CostReport:
        return await self._run(_CALLS.costs(by, since))

    async def budgets(self) -> BudgetList:
        return await self._run(_CALLS.budgets())

    async def set_budget(self, budget: Budget) -> BudgetStatus:
        return await self._run(_CALLS.set_budget(budget))

    async def delete_budget(self, name: str) -> None:
        await self._run(_CALLS.delete_budget(name))


class Provisioning:
    """``Client``'s provisioning methods (it provides ``_run``)."""

    if TYPE_CHECKING:  # Client's

        def _run(self, call: Call[T]) -> T: ...

    def providers(self) -> ProviderList:
        return self._run(_CALLS.providers())

    def instances(self, ended: bool = False) -> InstanceList:
        return self._run(_CALLS.instances(ended))

    def costs(self, by: GroupBy = "job", since: float | None = None) -> CostReport:
        return self._run(_CALLS.costs(by, since))

    def budgets(self) -> BudgetList:
        return self._run(_CALLS.budgets())

    def set_budget(self, budget: Budget) -> BudgetStatus:
        return self._run(_CALLS.set_budget(budget))

    def delete_budget(self, name: str) -> None:
        self._run(_CALLS.delete_budget(name))
