"""One table of job options (issue 34): every edge parses the same line the same way."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any

import pytest

from gpulayer_kernel import jobopts
from gpulayer_kernel.cli.main import build_parser, main
from gpulayer_kernel.codes import ErrorCode
from gpulayer_kernel.errors import BadOption, GPUlayerError, UnknownOption


def _cli(words: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["run", *words, "--", "true"])


def _kernelspec(words: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["kernelspec", "install", *words])


def _cell(words: list[str]) -> Any:
    from IPython.core.magic_arguments import parse_argstring

    from gpulayer_kernel.jupyter.magics import GPUlayerMagics

    return parse_argstring(GPUlayerMagics.gpulayer_cell, shlex.join(words))


def _session(words: list[str]) -> Any:
    from gpulayer_kernel.jupyter.sessions.current import _session_start_parser

    return _session_start_parser().parse_args(words)


EDGES: dict[jobopts.Edge, Callable[[list[str]], Any]] = {
    "cli": _cli,
    "cell": _cell,
    "session": _session,
    "kernelspec": _kernelspec,
}


@pytest.mark.parametrize("edge", jobopts.EDGES)
def test_each_edge_takes_its_options_from_the_table(edge: jobopts.Edge) -> None:
    args = EDGES[edge]([])
    for option in jobopts.options(edge):
        assert getattr(args, option.dest) == option.default_for(edge), option.flag


def test_a_kernel_spec_s_config_is_read_through_the_table_s_kernelspec_options() -> None:
    """What ``kernelspec install`` writes, the GPU kernel's provisioner reads back: one trait per
    kernelspec option, with the table's default and help, filled from a spec's config."""
    from traitlets.config import Config

    from gpulayer_kernel.kernels.provisioner import GPUlayerProvisioner

    traits = GPUlayerProvisioner.class_traits(config=True)
    for option in jobopts.options("kernelspec"):
        trait = traits[option.dest]
        assert trait.default() == option.default_for("kernelspec"), option.flag
        assert trait.help.split(" (default")[0] in option.help, option.flag
    config = Config({"GPUlayerProvisioner": {"gpus": 2, "gpu_kind": ["h100"], "idle_timeout": 60}})
    made = GPUlayerProvisioner(config=config)
    assert (made.gpus, made.gpu_kind, made.idle_timeout) == (2, ["h100"], 60.0)
    assert GPUlayerProvisioner().idle_timeout is None  # the contract's default applies
    with pytest.raises(KeyError):
        jobopts.trait("--retries", "kernelspec")


@pytest.mark.parametrize("edge", jobopts.EDGES)
def test_a_comma_list_and_a_repeated_flag_are_the_same(edge: jobopts.Edge) -> None:
    parse = EDGES[edge]
    comma = parse(["--gpus", "2", "--gpu-kind", "h100,a100", "--gpu-kind", "l4"])
    repeated = parse(["--gpus", "2", "--gpu-kind", "h100", "--gpu-kind", "a100,l4"])
    assert comma.gpu_kind == repeated.gpu_kind == ["h100", "a100", "l4"]
    assert comma.gpus == 2
    assert jobopts.parse(edge, ["--gpus", "2", "--gpu-kind", "h100,a100,l4"])["gpu_kind"] == [
        "h100",
        "a100",
        "l4",
    ]


def test_the_same_line_builds_the_same_fields_at_every_edge_that_takes_it() -> None:
    line = ["--gpus", "1", "--gpu-kind", "a100", "--fallback", "cpu", "--nodes", "2", "--wait"]
    line += ["--env", "A=1", "--secret", "TOKEN", "--worker", "w1"]
    built = {edge: jobopts.job_fields(EDGES[edge](line), edge) for edge in ("cli", "cell")}
    built["session"] = jobopts.job_fields(_session(line), "session")
    expected = {
        "gpus": 1,
        "nodes": 2,
        "gpu_kind": ["a100"],
        "fallback": ["cpu"],
        "worker": "w1",
    }
    for edge, fields in built.items():
        assert {k: fields["resources"][k] for k in expected} == expected, edge
        assert fields["env"] == {"A": "1"} and fields["secrets"] == ["TOKEN"], edge
        assert fields["wait_for_capacity"] is True, edge


def test_durations_read_units_and_the_session_default_is_thirty_minutes() -> None:
    assert _cli(["--timeout", "10m"]).timeout == 600.0
    assert _cell(["--timeout", "90"]).timeout == 90.0
    assert _session([]).idle_timeout == 1800.0
    assert _kernelspec(["--idle-timeout", "1h"]).idle_timeout == 3600.0
    assert _kernelspec([]).gpus == 1  # a kernel spec holds a GPU unless told otherwise


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--gpus", "two"], "--gpus 'two' is not a whole number"),
        (["--gpus", "1.5"], "--gpus '1.5' is not a whole number"),
        (["--gpu-kind", ","], "--gpu-kind ',' has an empty item"),
        (["--gpu-kind", "h100,"], "--gpu-kind 'h100,' has an empty item"),
        (["--fallback", "gpu"], "--fallback 'gpu' is not one of cpu"),
    ],
)
@pytest.mark.parametrize("edge", ["cli", "cell", "session"])
def test_bad_values_are_bad_option_at_every_edge(
    edge: jobopts.Edge, words: list[str], message: str
) -> None:
    with pytest.raises(BadOption) as err:
        EDGES[edge](words)
    assert err.value.code == ErrorCode.BAD_OPTION and message in err.value.message
    with pytest.raises(BadOption):
        jobopts.parse(edge, words)


@pytest.mark.parametrize("edge", ["cli", "cell"])
def test_a_bad_duration_is_bad_option(edge: jobopts.Edge) -> None:
    with pytest.raises(BadOption, match="--timeout 'soon' is not a duration"):
        EDGES[edge](["--timeout", "soon"])
    with pytest.raises(BadOption, match="must be more than 0"):
        EDGES[edge](["--timeout", "0"])
    with pytest.raises(BadOption, match="--idle-timeout '-5m' must be more than 0"):
        jobopts.parse("session", ["--idle-timeout=-5m"])


def test_an_option_the_edge_does_not_take_is_unknown_option() -> None:
    with pytest.raises(UnknownOption) as err:
        jobopts.parse("session", ["--selector", "a=b"])
    assert err.value.code == ErrorCode.UNKNOWN_OPTION
    assert "--selector" in err.value.message and "--gpu-kind" in err.value.hint
    assert jobopts.parse("cli", ["--selector", "a=b"])["selector"] == ["a=b"]


def test_an_empty_kind_is_bad_option() -> None:
    # A magic's line keeps quotes as typed (IPython's arg_split), so '' is tried here only.
    for edge in ("cli", "session", "kernelspec"):
        with pytest.raises(BadOption, match="--gpu-kind '' has an empty item"):
            EDGES[edge](["--gpu-kind", ""])


def test_the_cli_says_a_bad_option_as_an_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", "--gpus", "two", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "gpulayer: error: --gpus 'two' is not a whole number" in err
    assert "Traceback" not in err


def test_the_cell_shows_a_bad_option_with_its_code() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    from gpulayer_kernel.jupyter.handle import CellError
    from gpulayer_kernel.jupyter.magics import GPUlayerMagics

    # The shell the magics tests use too (one per process); refused while parsing, so no bridge.
    magics = GPUlayerMagics(shell=InteractiveShell.instance())
    with pytest.raises(CellError) as err:
        magics.gpulayer_cell("--gpu-kind ,", "1")
    assert err.value.code == ErrorCode.BAD_OPTION
    assert isinstance(err.value, GPUlayerError)
