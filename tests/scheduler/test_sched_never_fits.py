"""Jobs that can never fit (issue 12, items 15 and 16), and held-back workers (items 1 and 9):
what exists is said once, the gang sentence no longer contradicts itself, and suspect or
set-aside workers take no work but are counted."""

from __future__ import annotations

from dataclasses import replace

from gpulayer_kernel.contracts import Reason, Resources, WorkerState
from gpulayer_kernel.scheduler import never_sentence, schedule
from gpulayer_kernel.scheduler.testing import cpu_worker, gpu_worker, job, snapshot

JOB = "3f2a9c1d-5b7e"


def test_too_few_gpus_everywhere_says_what_the_largest_worker_has() -> None:
    plan = schedule(snapshot([gpu_worker("w1", 2), cpu_worker("c1")], [job(JOB, 1, gpus=4)]))
    report = plan.pending[JOB]
    assert report.never_fits and report.largest_gpus == 2
    text = never_sentence(report, Resources(gpus=4))
    assert text == (
        "job 3f2a9c1d can never run on the workers here: it needs 4 GPUs on one worker, and "
        'the largest worker has 2. 1 has no GPUs (the job did not ask for fallback=["cpu"]), '
        "1 has too few suitable GPUs in all (need 4). Submit it with --wait to keep it queued "
        "until a worker that can run it joins."
    )
    assert "waiting won't help" not in text


def test_largest_counts_only_gpus_of_the_kind_and_memory_asked() -> None:
    workers = [gpu_worker("w1", 8, "l4", memory_gib=24), gpu_worker("w2", 2, "h100")]
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=4, kind="h100")]))
    report = plan.pending[JOB]
    assert report.never_fits and report.largest_gpus == 2
    text = never_sentence(report, Resources(gpus=4, gpu_kind=["h100"]))
    assert "it needs 4 GPUs on one worker of kind h100, and the largest worker has 2." in text
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=1, memory_gib=200)]))
    report = plan.pending[JOB]
    assert report.never_fits and report.largest_gpus == 0
    text = never_sentence(report, Resources(gpus=1, gpu_memory_min=200 << 30))
    assert "with 200 GiB or more, and no worker has any." in text


def test_cpus_and_nodes_say_what_exists() -> None:
    plan = schedule(snapshot([cpu_worker("c1", cpus=8)], [job(JOB, 1, cpus=16)]))
    report = plan.pending[JOB]
    assert report.never_fits and report.largest_cpus == 8
    assert "it needs 16 CPUs, and the largest worker has 8." in never_sentence(
        report, Resources(cpus=16)
    )
    workers = [gpu_worker("w1", 4), gpu_worker("w2", 4)]
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=2, nodes=3)]))
    report = plan.pending[JOB]
    assert report.never_fits
    text = never_sentence(report, Resources(gpus=2, nodes=3))
    assert "it needs 3 workers at once, and only 2 are suitable." in text


def test_the_too_few_nodes_sentence_does_not_contradict_itself() -> None:
    """It said "2/2 workers can run … 2 are suitable but too few"."""
    workers = [gpu_worker("w1", 4), gpu_worker("w2", 4)]
    plan = schedule(snapshot(workers, [job(JOB, 1, gpus=2, nodes=3)]))
    report = plan.pending[JOB]
    assert report.workers_feasible == 0
    assert report.sentence.startswith(
        "0/2 workers can run job 3f2a9c1d, which needs 3 at once: 2 are suitable but too few "
        "(need 3 workers; waiting won't help)"
    )


def test_busy_cordoned_or_suspect_workers_are_not_never() -> None:
    busy = gpu_worker("w1", 2, running=[])
    plan = schedule(snapshot([busy], [job("a", 1, gpus=2), job(JOB, 2, gpus=2)]))
    assert not plan.pending[JOB].never_fits  # busy: waiting helps
    cordoned = gpu_worker("w1", 4, state=WorkerState.CORDONED)
    plan = schedule(snapshot([cordoned, cpu_worker("c1")], [job(JOB, 1, gpus=4)]))
    assert not plan.pending[JOB].never_fits  # it may be made ready again
    suspect = replace(gpu_worker("w1", 4), hold=Reason.WORKER_SUSPECT)
    plan = schedule(snapshot([suspect], [job(JOB, 1, gpus=1)]))
    report = plan.pending[JOB]
    assert not report.never_fits and report.waiting_helps
    assert report.sentence.startswith(
        "0/1 workers can run job 3f2a9c1d: 1 is suspect (its connection closed; waiting helps)"
    )


def test_held_back_workers_take_no_work_and_are_counted() -> None:
    aside = replace(gpu_worker("w1", 4), hold=Reason.UNSCHEDULABLE)
    plan = schedule(snapshot([aside, gpu_worker("w2", 1)], [job("a", 1, gpus=1), job("b", 2, 1)]))
    assert [(a.job_id, a.placement.worker_ids) for a in plan.assignments] == [("a", ["w2"])]
    report = plan.pending["b"]
    codes = {rc.code: rc.workers for rc in [*report.filtered, *report.exhausted]}
    assert codes == {Reason.UNSCHEDULABLE: 1, Reason.GPUS_BUSY: 1}
    assert "1 is set aside as unschedulable (see `gpulayer workers`; waiting won't help)" in (
        report.sentence
    )
