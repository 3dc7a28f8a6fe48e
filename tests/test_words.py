"""The small words of messages (issue 23, item 6): counts that agree, sizes in KiB/MiB/GiB, no
`code` marks in plain text, and the right advice for values too large to move."""

from __future__ import annotations

import numpy as np
import pytest

from gpulayer_kernel import bundles, transfer
from gpulayer_kernel.display import human_bytes
from gpulayer_kernel.errors import BundleError, TooLarge
from gpulayer_kernel.jupyter.cellspec import cell_inputs
from gpulayer_kernel.jupyter.handle import CellError
from gpulayer_kernel.words import count, plain


def test_counts_agree_with_their_nouns() -> None:
    assert [count(n, "cell") for n in (0, 1, 2)] == ["0 cells", "1 cell", "2 cells"]
    assert count(1, "process", "processes") == "1 process"
    assert count(3, "process", "processes") == "3 processes"


def test_plain_drops_code_marks_and_keeps_lone_backticks() -> None:
    assert (
        plain("run `gpulayer workers` or `gpulayer jobs`")
        == "run gpulayer workers or gpulayer jobs"
    )
    assert plain("a name with a ` in it") == "a name with a ` in it"
    assert plain("no marks") == "no marks"


def test_sizes_read_in_binary_units_and_limits_are_not_raw_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert [human_bytes(n) for n in (0, 1023, 8388608, 1073741824, 1536)] == [
        "0 B",
        "1023 B",
        "8 MiB",
        "1 GiB",
        "1.5 KiB",
    ]
    with pytest.raises(TooLarge) as info:
        transfer.encode({"x": np.zeros(1000)}, limit=1 << 10)
    assert "more than the 1 KiB limit" in info.value.message
    monkeypatch.setattr(bundles, "MAX_BUNDLE_BYTES", 1 << 20)  # not 256 MiB of test data
    with pytest.raises(BundleError) as bad:
        bundles.check_archive(b"x" * ((1 << 20) + 1), "0" * 64)
    assert "the limit is 1 MiB" in bad.value.message and "bytes" not in bad.value.message


def test_too_large_in_values_of_a_one_shot_job_get_advice_for_a_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(transfer.MAX_ENV, str(1 << 10))
    with pytest.raises(CellError) as info:
        cell_inputs({"x": np.zeros(1000)}, ["x"])  # what %%gpulayer --fresh --in x does
    err = info.value
    assert err.code == "transfer_too_large"
    assert (
        "--in x: the values add up to more than the 1 KiB limit of a move to a job" in err.message
    )
    assert "--files" in err.hint and "$GPULAYER_OUTPUT" not in err.hint
    assert "session" not in err.hint, err.hint
    # Between the kernel and a session (--in there has no --files): storage, and the way back.
    with pytest.raises(TooLarge) as moved:
        transfer.encode({"x": np.zeros(1000)}, limit=1 << 10)
    assert "--files" not in moved.value.hint and "in the session" in moved.value.hint
    # A job's value coming back: the job writes a file.
    with pytest.raises(TooLarge) as back:
        transfer.encode({"x": np.zeros(1000)}, limit=1 << 10, across="from a job to the kernel")
    assert "$GPULAYER_OUTPUT in the job" in back.value.hint
