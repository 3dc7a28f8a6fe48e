"""The provider config: every bad input is a ``ConfigInvalid`` naming the file and the field,
with the next step; a price is never assumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpulayer_kernel.contracts import Offer, parse
from gpulayer_kernel.errors import ConfigInvalid, ValidationFailed
from gpulayer_kernel.providers import SSHFleetProvider, load, parse_config
from gpulayer_kernel.providers.config import SSHSettings, slurm_hours

FAKE = {"kind": "fake", "offers": [{"name": "x", "gpus": 1, "price_per_hour": 1.0}]}


def refused(data: dict[str, Any]) -> ConfigInvalid:
    with pytest.raises(ConfigInvalid) as info:
        parse_config(data)
    return info.value


def test_an_offer_without_a_price_is_refused_naming_it() -> None:
    err = refused({"providers": {"fake": {"kind": "fake", "offers": [{"name": "x", "gpus": 1}]}}})
    assert err.message == "providers.toml: providers.fake.offers.0.price_per_hour: Field required"
    assert "give every offer a price (0 for owned hardware)" in err.hint
    assert err.details["field"] == "providers.fake.offers.0.price_per_hour"
    with pytest.raises(ValidationFailed, match="price_per_hour"):
        parse(Offer, {"provider": "p", "name": "x", "gpus": 1})  # nor from a provider's code


def test_unknown_fields_kinds_and_names_are_refused_naming_them() -> None:
    assert (
        "providers.fake.bogus: unknown field"
        in refused({"providers": {"fake": {**FAKE, "bogus": 1}}}).message
    )
    assert "providers.cloud.kind: field required" in refused({"providers": {"cloud": {}}}).message
    assert "autoscale.idle_timeout" in refused({"autoscale": {"idle_timeout": -1}}).message
    bad_time = {"kind": "slurm", "time_limit": "4 hours", "partitions": {"gpu": {}}}
    assert "providers.s.time_limit" in refused({"providers": {"s": bad_time}}).message


def test_a_file_that_is_not_toml_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "providers.toml"
    assert load(path) is None  # no file: no providers, no autoscaling
    path.write_text("[providers.fake\nkind = 'fake'\n")
    with pytest.raises(ConfigInvalid, match=r"providers.toml: not valid TOML: .*line 1"):
        load(path)
    path.write_text('[providers.fake]\nkind = "fake"\n[[providers.fake.offers]]\nname = "x"\n')
    with pytest.raises(ConfigInvalid, match="price_per_hour"):
        load(path)


def test_slurm_times_read_as_sbatch_reads_them() -> None:
    assert [slurm_hours(t) for t in ("90", "30:00", "4:00:00", "1-12", "2-0:30")] == [
        1.5,
        0.5,
        4.0,
        36.0,
        48.5,
    ]
    assert slurm_hours("infinite") is None
    with pytest.raises(ValueError):
        slurm_hours("soon")


async def test_an_ssh_host_with_gpus_and_no_price_is_refused_naming_it() -> None:
    cfg = parse_config(
        {
            "providers": {
                "fleet": {
                    "kind": "ssh",
                    "known_hosts": "/dev/null",
                    "hosts": [{"name": "box", "address": "10.0.0.1", "gpus": 2}],
                }
            }
        }
    )
    s = cfg.providers["fleet"]
    assert isinstance(s, SSHSettings)
    with pytest.raises(ConfigInvalid) as info:
        await SSHFleetProvider(s, owner="x").offers()
    assert "providers.fleet.hosts[0].price_per_gpu_hour: field required" in info.value.message
