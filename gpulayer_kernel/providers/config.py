"""The provider config: one TOML file, ``$GPULAYER_HOME/providers.toml`` (docs/providers.md).

    [autoscale]                      # how the control plane scales (all optional)
    idle_timeout = 300               # seconds an instance's worker may sit idle
    max_price_per_hour = 20.0        # every instance together

    [costs]                          # what hand-started (owned) workers cost
    gpu_hour = 0.0
    [costs.workers]
    "box-*" = 1.20                   # worker-name globs, dollars per GPU-hour

    [providers.NAME]
    kind = "slurm" | "ssh" | "fake"  # then the kind's own settings (slurm.py, sshfleet.py, fake.py)

Every problem is a ``ConfigInvalid`` that names the file and the field ("providers.toml:
providers.slurm.partitions.gpu.price_per_gpu_hour: field required") with the next step; nothing
is half-read. A price is never assumed: an offer without one is refused here, so every launch
has an estimate.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..contracts.providers import NAME_PATTERN
from ..errors import ConfigInvalid

FILE_NAME = "providers.toml"
DOCS = "see docs/providers.md"


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AutoscaleSettings(Settings):
    enabled: bool = True
    idle_timeout: float = Field(300.0, gt=0, description="seconds idle before scale-down")
    boot_timeout: float = Field(600.0, gt=0, description="seconds to join, else failed")
    launch_timeout: float = Field(60.0, gt=0, description="seconds a provider call may take")
    reconcile_every: float = Field(5.0, gt=0, description="seconds between reconciler rounds")
    max_price_per_hour: float | None = Field(None, ge=0)
    scale_up_after: float = Field(0.0, ge=0, description="seconds a job waits before a launch")
    backoff_base: float = Field(10.0, ge=0, description="seconds after a first failed launch")
    backoff_max: float = Field(600.0, ge=0)
    server_url: str | None = Field(None, description="what workers dial (default: this server)")
    ca_cert: str | None = None


class CostSettings(Settings):
    gpu_hour: float = Field(0.0, ge=0, description="owned hardware, dollars per GPU-hour")
    machine_hour: float = Field(0.0, ge=0, description="an owned worker without GPUs, per hour")
    workers: dict[str, float] = Field(default_factory=dict, description="name glob -> $/GPU-h")
    typical_hours: float = Field(1.0, gt=0, description="estimate when nothing better is known")


class Common(Settings):
    name: str = Field("", pattern=r"^$|" + NAME_PATTERN)
    max_instances: int = Field(4, ge=0, le=10_000)
    boot_timeout: float | None = Field(None, gt=0)
    region: str = ""


class FakeOffer(Settings):
    name: str = Field(pattern=NAME_PATTERN)
    gpus: int = Field(0, ge=0, le=64)
    gpu_kind: str = "a100"
    gpu_memory_gb: float = Field(80, ge=0)
    cpus: int = Field(2, ge=1)
    price_per_hour: float = Field(ge=0, description="required: every offer has a price")
    region: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class FakeSettings(Common):
    kind: Literal["fake"]
    offers: list[FakeOffer] = Field(min_length=1)
    boot_seconds: float = Field(1.0, ge=0)
    boot_failure_rate: float = Field(0.0, ge=0, le=1)
    launch_failure_rate: float = Field(0.0, ge=0, le=1)
    launch_hangs: bool = Field(False, description="launch never answers (tests timeouts)")
    launch_delay: float = Field(0.0, ge=0, description="seconds before a launch is recorded")
    answer_delay: float = Field(0.0, ge=0, description="seconds after, before launch answers")
    terminate_delay: float = Field(
        0.0, ge=0, description="seconds terminate takes to answer once the machine stopped"
    )
    preempt_after: float | None = Field(None, gt=0, description="seconds after boot")
    seed: int | None = None
    state_dir: str | None = Field(
        None,
        description="where the simulated cloud keeps its machines (a standby pair shares "
        "one, as it shares a real cloud); default: the home's providers folder",
    )


class SlurmPartition(Settings):
    price_per_gpu_hour: float | None = Field(None, ge=0)
    price_per_hour: float | None = Field(None, ge=0, description="a partition without GPUs")
    gpu_kind: str | None = Field(None, description="default: the GRES type, else 'gpu'")
    gpu_memory_gb: float = Field(0, ge=0)
    simulate: bool = Field(False, description="start workers with --simulate-gpus")
    labels: dict[str, str] = Field(default_factory=dict)


class SlurmSettings(Common):
    kind: Literal["slurm"]
    slurm_conf: str | None = Field(None, description="SLURM_CONF for sbatch/squeue/sinfo")
    gpulayer: list[str] = Field(
        default_factory=lambda: ["gpulayer"], description="argv that runs gpulayer on a node"
    )
    time_limit: str = Field("4:00:00", description="sbatch --time")
    extra_args: list[str] = Field(default_factory=list, description="more sbatch options")
    boot_seconds: float = Field(40.0, ge=0)
    work_dir: str | None = Field(None, description="the workers' --work-dir on the nodes")
    output: str | None = Field(
        None,
        min_length=1,
        description="sbatch --output: where a batch job's own output goes (%j: the job id); "
        "default WORK_DIR/slurm-%j.out with work_dir, else /tmp/gpulayer-slurm-%j.out",
    )
    partitions: dict[str, SlurmPartition] = Field(min_length=1)

    @property
    def output_path(self) -> str:
        """Where sbatch writes a batch job's output (``output``, or the default it names)."""
        if self.output:
            return self.output
        if self.work_dir:
            return f"{self.work_dir.rstrip('/')}/slurm-%j.out"
        return "/tmp/gpulayer-slurm-%j.out"

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, v: str) -> str:
        slurm_hours(v)
        return v


class SSHHost(Settings):
    name: str = Field(pattern=NAME_PATTERN)
    address: str = Field(min_length=1)
    port: int = Field(22, ge=1, le=65535)
    user: str = "root"
    key: str | None = Field(None, description="private key file (default: ssh-agent/~/.ssh)")
    gpus: int = Field(0, ge=0, le=64)
    gpu_kind: str = "gpu"
    gpu_memory_gb: float = Field(0, ge=0)
    cpus: int = Field(1, ge=1)
    simulate: bool = False
    price_per_gpu_hour: float | None = Field(None, ge=0, description="owned: its rate")
    price_per_hour: float | None = Field(None, ge=0, description="a host without GPUs")
    venv: str = Field("~/.gpulayer/venv", description="where GPUlayer lives on the host")
    python: str = "python3"
    install: str | None = Field(
        None,
        description="command that installs GPUlayer {version} into {venv} (default: pip "
        "install {wheel}, the control plane's own wheel copied to the host)",
    )
    work_dir: str = "~/.gpulayer/work"
    server_url: str | None = Field(None, description="what this host dials (default: global)")
    ca_cert: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class SSHSettings(Common):
    kind: Literal["ssh"]
    known_hosts: str = Field(description="host keys to trust (no blind trust): a known_hosts file")
    hosts: list[SSHHost] = Field(min_length=1)
    connect_timeout: float = Field(10.0, gt=0)
    boot_seconds: float = Field(10.0, ge=0)


ProviderSettings = Annotated[
    FakeSettings | SlurmSettings | SSHSettings, Field(discriminator="kind")
]


class ProvidersConfig(Settings):
    autoscale: AutoscaleSettings = Field(default_factory=AutoscaleSettings)
    costs: CostSettings = Field(default_factory=CostSettings)
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    path: str = ""  # where it was read from (set by ``load``)


def slurm_hours(limit: str) -> float | None:
    """sbatch's --time (``MM``, ``MM:SS``, ``H:MM:SS``, ``D-H``, ``D-H:MM``, ``D-H:MM:SS``) in
    hours; None when unlimited. A bad value raises ValueError (the config says which field)."""
    text = limit.strip()
    if text.lower() in ("", "infinite", "unlimited"):
        return None
    days, _, clock = text.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        d = int(days) if days else 0
    except ValueError:
        raise ValueError(f"{limit!r} is not a Slurm time (e.g. 90, 4:00:00, 1-12:00)") from None
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts) or d < 0:
        raise ValueError(f"{limit!r} is not a Slurm time (e.g. 90, 4:00:00, 1-12:00)")
    if days:  # D-H, D-H:M, D-H:M:S
        parts += [0] * (3 - len(parts))
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 3:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 2:
        seconds = parts[0] * 60 + parts[1]
    else:
        seconds = parts[0] * 60
    return (d * 86400 + seconds) / 3600.0


def no_price(field: str, why: str) -> ConfigInvalid:
    """A price the config must give and does not: every offer has one (ADR 0011)."""
    return ConfigInvalid(
        f"{FILE_NAME}: {field}: field required ({why}; every offer needs a price)",
        hint=f"set it (0 for hardware that costs nothing to run); {DOCS}",
        details={"file": FILE_NAME, "field": field},
    )


def config_path(home: Path) -> Path:
    return home / FILE_NAME


def parse_config(data: dict[str, Any], path: str = FILE_NAME) -> ProvidersConfig:
    """Validate a config's data; a problem is a ``ConfigInvalid`` naming the file and field."""
    providers = data.get("providers")
    if isinstance(providers, dict):
        for key, value in providers.items():
            if not isinstance(value, dict) or "kind" not in value:
                raise ConfigInvalid(
                    f"{path}: providers.{key}.kind: field required",
                    hint=f'set kind = "slurm", "ssh" or "fake" ({DOCS})',
                    details={"file": path, "field": f"providers.{key}.kind"},
                )
            value.setdefault("name", key)
    try:
        cfg = ProvidersConfig.model_validate({**data, "path": path})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = [str(p) for p in err["loc"]]
        if len(loc) >= 3 and loc[0] == "providers":
            del loc[2]  # the discriminator's tag ("slurm") is not a field of the file
        field = ".".join(loc) or "(root)"
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        hint = f"fix that field ({DOCS})"
        if field.endswith("price_per_hour") or "price" in field:
            hint = f"give every offer a price (0 for owned hardware) ({DOCS})"
        raise ConfigInvalid(
            f"{path}: {field}: {msg}{more}",
            hint=hint,
            details={"file": path, "field": field, "problem": msg},
        ) from None
    for name, p in cfg.providers.items():
        if p.name != name:
            raise ConfigInvalid(
                f"{path}: providers.{name}.name: must be {name!r} (the table's name)",
                hint="leave name out: the table's name is the provider's",
                details={"file": path, "field": f"providers.{name}.name"},
            )
    return cfg


def load(path: Path) -> ProvidersConfig | None:
    """The config at ``path``; None when there is no such file (no providers: no autoscaling)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigInvalid(
            f"cannot read {path}: {exc}",
            hint="check the file's permissions",
            details={"file": str(path)},
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInvalid(
            f"{path}: not valid TOML: {exc}",
            hint=f"fix the syntax at that line ({DOCS})",
            details={"file": str(path)},
        ) from None
    return parse_config(data, str(path))
