"""The ControlPlane's administration: users' secrets, users (disabling one ends their work:
``people.py``), providers, costs and budgets (ADR 0010, 0011), each change in the audit log. A
service given only the parts it works with; ``ControlPlane`` offers its calls as its own. These
calls change with teams and accounting, not with jobs.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..contracts import (
    Budget,
    BudgetList,
    BudgetStatus,
    CostReport,
    InstanceList,
    ProviderList,
    SessionInfo,
    check_secret_name,
)
from ..contracts.costs import GroupBy
from ..security.roles import Identity, Role, check_role, resolved, sees_all
from ..store import UserRecord
from .people import end_work_of

if TYPE_CHECKING:
    from ..security.users import UserService
    from .audit import AuditLog
    from .jobs import JobTable
    from .outcomes import Outcomes
    from .provisioning.part import Provisioning
    from .secrets import SecretTable
    from .sessions.table import SessionTable


StopSession = Callable[[str, str], Awaitable[SessionInfo]]


class AdminCalls:
    """Secrets, users, providers, costs and budgets."""

    def __init__(
        self,
        *,
        secrets: SecretTable,
        users: UserService,
        audit: AuditLog,
        jobs: JobTable,
        outcomes: Outcomes,
        provisioning: Provisioning,
        sessions: SessionTable,
        stop_session: StopSession,
    ) -> None:
        self.secrets = secrets
        self.users = users
        self.audit = audit
        self.jobs = jobs
        self.outcomes = outcomes
        self.provisioning = provisioning
        self.sessions = sessions
        self.stop_session = stop_session  # the session calls': a disabled user's sessions end

    # -- secrets: sealed at rest, per owner, resolved for the worker at assignment, never returned

    async def set_secret(
        self, name: str, value: str, *, who: Identity | None = None, user: str | None = None
    ) -> None:
        owner = self.secrets.owner_for(who, user)
        await self.secrets.set(owner, check_secret_name(name), value)
        await self.audit.record(who, "secret.set", name, owner=owner)  # the name, never the value

    async def secret_names(
        self, *, who: Identity | None = None, user: str | None = None
    ) -> builtins.list[str]:
        return await self.secrets.names(self.secrets.owner_for(who, user))

    async def delete_secret(
        self, name: str, *, who: Identity | None = None, user: str | None = None
    ) -> bool:
        owner = self.secrets.owner_for(who, user)
        deleted = await self.secrets.delete(owner, name)
        if deleted:
            await self.audit.record(who, "secret.delete", name, owner=owner)
        return deleted

    # -- users (the records are ``users``'; what disabling one does to their work: people.py) --

    async def add_user(
        self,
        name: str,
        role: Role | str = Role.USER,
        *,
        group: str | None = None,
        who: Identity | None = None,
    ) -> UserRecord:
        """Add a user (in the audit log, as every change of who may do what)."""
        check_role(who, Role.ADMIN, "add users")
        rec = await self.users.add(name, role, group=group)
        await self.audit.record(who, "user.add", name, role=rec.role, group=rec.group)
        return rec

    async def update_user(
        self,
        name: str,
        *,
        role: Role | str | None = None,
        group: str | None = None,
        disabled: bool | None = None,
        who: Identity | None = None,
    ) -> UserRecord:
        """Change a user's role or group, or disable (enable) them. Disabling stops their
        sessions and cancels their queued jobs, saying who did it; running jobs finish."""
        check_role(who, Role.ADMIN, "change users")
        was = self.users.get(name).disabled
        rec = await self.users.update(name, role=role, group=group, disabled=disabled)
        await self.audit.record(
            who, "user.update", name, role=rec.role, group=rec.group, disabled=rec.disabled
        )
        if rec.disabled and not was:
            await end_work_of(
                name,
                resolved(who).user,
                sessions=self.sessions.live(),
                jobs=self.jobs.active(),
                stop_session=lambda ref, why: self.stop_session(ref, why),
                cancel=self.outcomes.cancel,
            )
        return rec

    # -- providers, costs, budgets (ADR 0010, 0011) ----------------------------------------------

    async def providers(self, *, who: Identity | None = None) -> ProviderList:
        """Every configured provider, checked now, with its offers and instance count."""
        check_role(who, Role.VIEWER, "see providers")
        return await self.provisioning.provider_list()

    async def instances(self, ended: bool = False, *, who: Identity | None = None) -> InstanceList:
        """Provider instances, newest first (with ``ended``: the ended ones too)."""
        check_role(who, Role.VIEWER, "see provider instances")
        return await self.provisioning.instance_list(ended)

    async def costs(
        self, by: GroupBy = "job", since: float | None = None, *, who: Identity | None = None
    ) -> CostReport:
        """Estimates and charges summed by user, job, provider, UTC day or project: everyone's
        for admins and viewers, a user's own jobs' for a user."""
        check_role(who, Role.VIEWER, "see costs")
        user = None if sees_all(who) else resolved(who).user
        return await self.provisioning.cost_report(by, since, user=user)

    async def budgets(self, *, who: Identity | None = None) -> BudgetList:
        """Budgets with what they spent and have left (a user: those its jobs spend from)."""
        check_role(who, Role.VIEWER, "see budgets")
        listed = self.provisioning.budget_list()
        if sees_all(who):
            return listed
        me = resolved(who).user
        mine = [s for s in listed.budgets if s.budget.scope != "user" or s.budget.match == me]
        return BudgetList(budgets=mine)

    async def set_budget(self, budget: Budget, *, who: Identity | None = None) -> BudgetStatus:
        check_role(who, Role.ADMIN, "set budgets")
        status = await self.provisioning.set_budget(budget)
        await self.audit.record(who, "budget.set", budget.name, limit=budget.limit)
        return status

    async def delete_budget(self, name: str, *, who: Identity | None = None) -> None:
        check_role(who, Role.ADMIN, "delete budgets")
        await self.provisioning.delete_budget(name)
        await self.audit.record(who, "budget.delete", name)
