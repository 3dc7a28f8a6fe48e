"""The options that shape a job, declared once for every edge that takes them (issue 34).

``gpulayer run`` (edge ``cli``), the ``%%gpulayer`` magic (``cell``), ``%gpulayer session start``
(``session``) and ``gpulayer kernelspec install`` (``kernelspec``) all take ``--gpus``,
``--gpu-kind``... Each used to restate them with its own argparse calls, and they drifted
(``--gpu-kind`` a comma list in one, repeatable in another). :data:`OPTIONS` is the one table;
:func:`add_arguments` writes an edge's share into its parser (argparse or IPython's
``magic_arguments``), and :func:`job_fields` turns parsed values into the ``JobSpec`` fields they
set, so an option means the same wherever it is typed.

A list option is repeatable, and the ``split`` ones also take a comma list: ``--gpu-kind
h100,a100`` and ``--gpu-kind h100 --gpu-kind a100`` are the same. A bad value is
:class:`~gpulayer_kernel.errors.BadOption` (code ``bad_option``) naming the flag, raised while
parsing, before anything is built or sent; :func:`parse` also turns an option the edge does not
take into ``unknown_option`` instead of argparse's exit.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .contracts import parse_duration, parse_pairs
from .contracts.jobs import DEFAULT_IDLE_TIMEOUT
from .errors import BadOption, InvalidInput, UnknownOption
from .jobenv import env_option

Edge = Literal["cli", "cell", "session", "kernelspec"]
EDGES: tuple[Edge, ...] = ("cli", "cell", "session", "kernelspec")
_ALL: frozenset[Edge] = frozenset(EDGES)
_JOBS: frozenset[Edge] = frozenset({"cli", "cell"})
_PLACED: frozenset[Edge] = frozenset({"cli", "cell", "session"})


def whole(flag: str) -> Callable[[str], int]:
    """A whole-number option (its range is the contract's to check: it names the field)."""

    def parse(text: str) -> int:
        try:
            return int(text.strip())
        except ValueError:
            raise BadOption(
                f"{flag} {text!r} is not a whole number",
                hint=f"write a number: {flag} 2",
                details={"field": flag, "value": text},
            ) from None

    return parse


def duration(flag: str) -> Callable[[str], float]:
    """Seconds, or a number with s, m, h or d: ``600``, ``10m``, ``1.5h``."""

    def parse(text: str) -> float:
        try:
            return parse_duration(text, flag)
        except InvalidInput as exc:
            raise BadOption(exc.message, hint=exc.hint, details=exc.details) from None

    return parse


def words(flag: str, choices: Sequence[str] = ()) -> Callable[[str], list[str]]:
    """A comma list (``h100,a100``); an empty item, or one outside ``choices``, is refused."""

    def parse(text: str) -> list[str]:
        items = [w.strip() for w in text.split(",")]
        if not all(items):
            raise BadOption(
                f"{flag} {text!r} has an empty item",
                hint=f"write one or more names, comma-separated: {flag} "
                + (",".join(choices) if choices else "h100,a100"),
                details={"field": flag, "value": text},
            )
        for item in items:
            if choices and item not in choices:
                raise BadOption(
                    f"{flag} {item!r} is not one of {', '.join(choices)}",
                    details={"field": flag, "value": item},
                )
        return items

    return parse


def _text(text: str) -> str:
    return text


@dataclass(frozen=True)
class JobOption:
    """One option: its flag, how its text is parsed, its help, default, and the edges taking it."""

    flag: str
    help: str
    edges: frozenset[Edge]
    parse: Callable[[str], Any] | None = None  # None: a switch (present or not)
    default: Any = None
    many: bool = False  # repeatable; the values collect into one list
    split: bool = False  # each value is also a comma list (``parse`` returns a list)
    metavar: str | None = None
    # An edge whose default differs (a kernel spec holds 1 GPU; a session idles out in 30m).
    defaults: Mapping[Edge, Any] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def default_for(self, edge: Edge) -> Any:
        value = self.defaults.get(edge, self.default)
        return list(value) if isinstance(value, list) else value

    def trait(self, edge: Edge) -> Any:
        """This option as a traitlets config trait at ``edge``: the GPU kernel's provisioner
        reads its kernel spec's config (``kernelspec install``'s values) through these, so a
        kernelspec option is declared here once. None (no value given) lets the contract's
        default apply."""
        from traitlets import Bool, Float, Integer, List, Unicode

        default = self.default_for(edge)
        text = self.help.replace("%(default)s", str(default))
        trait: Any
        if self.parse is None:
            trait = Bool(bool(default), help=text)
        elif self.many:
            trait = List(Unicode(), default_value=default, help=text)
        elif isinstance(default, int):
            trait = Integer(default, help=text)
        else:
            trait = Float(default, allow_none=True, help=text)
        return trait.tag(config=True)

    def kwargs(self, edge: Edge) -> dict[str, Any]:
        """``add_argument``'s keywords for this option at ``edge``."""
        if self.parse is None:
            return {"action": "store_true", "help": self.help}
        out: dict[str, Any] = {
            "type": self.parse,
            "default": self.default_for(edge),
            "metavar": self.metavar,
            "help": self.help,
        }
        if self.many:
            # "extend" with a parser returning a list: a comma list and a repeated flag both
            # land in one flat list.
            out["action"] = "extend" if self.split else "append"
        return out


OPTIONS: tuple[JobOption, ...] = (
    JobOption(
        "--gpus",
        "GPUs per node (default %(default)s; 0: CPU)",
        _ALL,
        whole("--gpus"),
        0,
        metavar="N",
        defaults={"kernelspec": 1},
    ),
    JobOption(
        "--gpu-kind",
        "acceptable GPU kinds, preferred first: h100,a100 or repeated",
        _ALL,
        words("--gpu-kind"),
        [],
        many=True,
        split=True,
        metavar="KIND[,KIND...]",
    ),
    JobOption(
        "--fallback",
        "run on a CPU-only worker when no GPU can take the job",
        _PLACED,
        words("--fallback", ("cpu",)),
        [],
        many=True,
        split=True,
        metavar="cpu",
    ),
    JobOption(
        "--nodes", "workers for a multi-node gang", _PLACED, whole("--nodes"), 1, metavar="M"
    ),
    JobOption(
        "--timeout",
        "kill it after this: seconds, or 10m, 2h",
        _JOBS,
        duration("--timeout"),
        None,
        metavar="DURATION",
    ),
    JobOption(
        "--retries",
        "re-runs of a lost or preempted attempt (opt-in; see --retry-on, docs/costs.md)",
        _JOBS,
        whole("--retries"),
        0,
        metavar="N",
    ),
    JobOption(
        "--retry-on",
        'which failures retry (default: lost and preempted; "failed": any failing exit)',
        _JOBS,
        words("--retry-on", ("lost", "preempted", "failed")),
        [],
        many=True,
        split=True,
        metavar="{lost,preempted,failed}",
    ),
    JobOption(
        "--wait",
        "keep the job queued when no worker can ever run it (one may join); without it such a "
        "job fails at once, saying what exists",
        _PLACED,
        default=False,
    ),
    JobOption(
        "--env",
        "an environment variable of the job; NAME alone passes its value here (a job inherits "
        "none of this environment)",
        _PLACED,
        _text,
        [],
        many=True,
        metavar="NAME[=VALUE]",
    ),
    JobOption(
        "--secret",
        "a secret set on the control plane, as an environment variable of the job",
        _PLACED,
        _text,
        [],
        many=True,
        metavar="NAME",
    ),
    JobOption(
        "--label",
        "a label of the job; user=NAME and project=NAME are what budgets and costs group by",
        _JOBS,
        _text,
        [],
        many=True,
        metavar="K=V",
    ),
    JobOption(
        "--selector",
        "worker labels the job needs",
        frozenset({"cli"}),
        _text,
        [],
        many=True,
        metavar="K=V",
    ),
    JobOption("--worker", "run only on this worker", _PLACED, _text, None, metavar="NAME"),
    JobOption(
        "--priority", "higher runs first", frozenset({"cli"}), whole("--priority"), 0, metavar="N"
    ),
    JobOption(
        "--idle-timeout",
        "end the session (freeing its GPUs) after this long without a cell: 30m, 2h, 600",
        frozenset({"session", "kernelspec"}),
        duration("--idle-timeout"),
        None,
        metavar="DURATION",
        defaults={"session": DEFAULT_IDLE_TIMEOUT},
    ),
)

BY_FLAG: dict[str, JobOption] = {o.flag: o for o in OPTIONS}


def options(edge: Edge) -> tuple[JobOption, ...]:
    """The options ``edge`` takes, in the table's order."""
    return tuple(o for o in OPTIONS if edge in o.edges)


def trait(flag: str, edge: Edge) -> Any:
    """The config trait of ``flag`` at ``edge`` (``JobOption.trait``); KeyError if ``edge``
    does not take it."""
    option = BY_FLAG[flag]
    if edge not in option.edges:
        raise KeyError(f"{flag} is not a {edge} option")
    return option.trait(edge)


def add_arguments(parser: Any, edge: Edge) -> None:
    """Add ``edge``'s options to an argparse parser or group (a magic's parser is one)."""
    for option in options(edge):
        parser.add_argument(option.flag, **option.kwargs(edge))


def values(args: argparse.Namespace | Mapping[str, Any], edge: Edge) -> dict[str, Any]:
    """The parsed values of ``edge``'s options by dest (a missing one: its default there)."""
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    out: dict[str, Any] = {}
    for option in options(edge):
        out[option.dest] = given.get(option.dest, option.default_for(edge))
    return out


def job_fields(
    args: argparse.Namespace | Mapping[str, Any],
    edge: Edge,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``JobSpec`` fields ``edge``'s options set, in ``JobSpec``'s shape (``resources`` a
    dict); ``--env NAME`` reads ``environ`` (default: this process's)."""
    v = values(args, edge)
    resources: dict[str, Any] = {
        key: v[key] for key in ("gpus", "nodes", "gpu_kind", "fallback", "worker") if key in v
    }
    if "selector" in v:
        resources["selector"] = parse_pairs(v["selector"], "--selector")
    out: dict[str, Any] = {"resources": resources}
    if "env" in v:
        out["env"] = env_option(v["env"], "--env", environ)
    if "secret" in v:
        out["secrets"] = list(v["secret"])
    if "label" in v:
        out["labels"] = parse_pairs(v["label"], "--label")
    for dest, key in (
        ("timeout", "timeout"),
        ("retries", "retries"),
        ("priority", "priority"),
        ("idle_timeout", "idle_timeout"),
        ("wait", "wait_for_capacity"),
    ):
        if dest in v:
            out[key] = v[dest]
    if v.get("retry_on"):
        out["retry_on"] = v["retry_on"]  # absent: the contract's default causes
    return out


class _Parser(argparse.ArgumentParser):
    """An argparse parser that raises instead of printing usage and exiting."""

    takes = ""

    def error(self, message: str) -> Any:
        if message.startswith("unrecognized arguments: "):
            unknown = message.removeprefix("unrecognized arguments: ")
            raise UnknownOption(
                f"{self.prog}: unknown option {unknown}",
                hint=f"{self.prog} takes {self.takes}",
                details={"options": unknown.split()},
            )
        raise BadOption(f"{self.prog}: {message}")


def parse(edge: Edge, argv: Sequence[str], prog: str | None = None) -> dict[str, Any]:
    """Parse ``argv`` as ``edge``'s job options alone; the values by dest.

    Unknown options are ``unknown_option``, bad values ``bad_option`` (never ``SystemExit``)."""
    parser = _Parser(prog=prog or edge, add_help=False)
    parser.takes = ", ".join(o.flag for o in options(edge))
    add_arguments(parser, edge)
    return values(parser.parse_args(list(argv)), edge)
