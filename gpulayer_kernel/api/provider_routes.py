"""The user routes of providers, instances, costs and budgets (ADR 0010, 0011; docs/costs.md).

Thin, like every route: parse, call one ControlPlane method, answer its contract.
"""

from __future__ import annotations

from ..contracts import Budget, BudgetList, BudgetStatus, CostReport, InstanceList, ProviderList
from ..security.roles import Role
from .mixin import GLMixin
from .ops import op
from .params import Param


class ProvidersHandler(GLMixin):
    route = "/providers"

    @op(
        "every configured provider, checked now: reachable or why not, its offers, its "
        "instances and backoff",
        answer=ProviderList,
        role=Role.VIEWER,
    )
    async def get(self) -> ProviderList:
        return await self.cp.providers(who=self.who)


class InstancesHandler(GLMixin):
    route = "/instances"

    @op(
        "provider instances, newest first",
        answer=InstanceList,
        query=(Param("ended", "integer", 0, 0, 1, "1: the ended ones too"),),
        role=Role.VIEWER,
    )
    async def get(self, ended: float) -> InstanceList:
        return await self.cp.instances(ended=bool(ended), who=self.who)


class CostsHandler(GLMixin):
    route = "/costs"

    @op(
        "estimates and charges summed by `by` (user, job, provider, day, project); a user "
        "sees its own jobs' only",
        answer=CostReport,
        query=(
            Param("by", "string", "job", description="user, job, provider, day or project"),
            Param("since", "number", None, 0, 1e11, "epoch seconds: rows recorded from then"),
        ),
        errors=(400,),
        role=Role.VIEWER,
    )
    async def get(self, by: str, since: float | None) -> CostReport:
        return await self.cp.costs(by, since, who=self.who)  # type: ignore[arg-type]


class BudgetsHandler(GLMixin):
    route = "/budgets"

    @op(
        "every budget with what it spent, has committed and has left (a user: those its jobs "
        "spend from)",
        answer=BudgetList,
        role=Role.VIEWER,
    )
    async def get(self) -> BudgetList:
        return await self.cp.budgets(who=self.who)

    @op(
        "create or change a budget (by its name)",
        body=Budget,
        answer=BudgetStatus,
        status=201,
        errors=(422,),
        role=Role.ADMIN,
    )
    async def post(self, body: Budget) -> BudgetStatus:
        return await self.cp.set_budget(body, who=self.who)


class BudgetHandler(GLMixin):
    route = "/budgets/{name}"

    @op("delete a budget", answer=None, status=204, errors=(404,), role=Role.ADMIN)
    async def delete(self, name: str) -> None:
        await self.cp.delete_budget(name, who=self.who)
