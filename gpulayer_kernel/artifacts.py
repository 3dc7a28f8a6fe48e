"""A job's artifacts as a caller reads them: found by name, downloaded with their digest checked.

The command line (``gpulayer artifacts --get``), a notebook's job handle and the Trainer's
``fit(ckpt_path="JOB:ARTIFACT")`` all read artifacts this one way, through whichever session they
hold (a served control plane's client, or the embedded one).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, BinaryIO

from .contracts import Artifact, Job
from .errors import BundleError, NotFound

if TYPE_CHECKING:
    from .client.connect import Connection


def find_artifact(job: Job, name: str) -> Artifact:
    """The artifact called ``name`` (or, when unique, the one whose path ends in ``/name``).

    A gang's files are named ``rank<R>/...``: ``step-00000300.pt`` finds ``rank0/step-…``
    when only one rank wrote it. Missing or ambiguous: ``NotFound`` naming the artifact.
    """
    exact = [a for a in job.artifacts if a.name == name]
    found = exact or [a for a in job.artifacts if a.name.endswith("/" + name)]
    if len(found) == 1:
        return found[0]
    names = ", ".join(a.name for a in (found or job.artifacts)) or "none"
    what = "several artifacts match" if found else "it has"
    raise NotFound(
        f"job {job.id} has no artifact {name!r} ({what}: {names})",
        hint=f"list them with: gpulayer artifacts {job.id}; a job's artifacts are the files "
        "it writes to $GPULAYER_OUTPUT",
        details={"job": job.id, "artifact": name},
        code="artifact_not_found",
    )


async def download(s: Connection, artifact: Artifact, out: BinaryIO) -> None:
    """Write ``artifact`` to ``out``, checking its digest; streamed from a served control plane."""
    from .client.clients import AsyncClient  # here: httpx loads only for callers that need it

    sha = hashlib.sha256()

    def write(chunk: bytes) -> None:
        sha.update(chunk)
        out.write(chunk)

    if isinstance(s, AsyncClient):
        await s.download_blob(artifact.digest, write)
    else:  # the embedded control plane: the blob is a local file already
        write(await s.get_blob(artifact.digest))
    if sha.hexdigest() != artifact.digest:
        raise BundleError(
            f"artifact {artifact.name} arrived corrupt (its content does not match its digest)",
            hint="download it again",
            details={"artifact": artifact.name, "digest": artifact.digest},
        )
