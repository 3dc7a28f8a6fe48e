"""``GET /api/v1/metrics``: a viewer token, Prometheus' text format, series read from the control
plane at scrape time plus the hot paths' histograms (request, scheduling pass, store commit)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpulayer_kernel.contracts import CommandWorkload, JobSpec, Resources
from gpulayer_kernel.controlplane.metrics import wait_class

from .conftest import Api


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def scrape(api: Api, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await api.call("GET", "/metrics", token)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(r.text)


async def test_a_scrape_without_a_token_is_refused(gl_api: Api) -> None:
    r = await gl_api.call("GET", "/metrics", None)
    assert r.status_code == 401
    assert r.json()["code"] == "token_missing"
    assert "Bearer" in r.headers["www-authenticate"]


async def test_a_viewer_token_reads_jobs_queue_waits_and_hot_path_histograms(gl_api: Api) -> None:
    await gl_api.cp.users.add("prom", "viewer")
    viewer = await gl_api.new_token("client", owner="prom")
    # No worker: the job waits; a second one asks for a worker that does not exist.
    job = await gl_api.cp.submit(JobSpec(workload=CommandWorkload(argv=["true"])))
    await gl_api.cp.submit(
        JobSpec(workload=CommandWorkload(argv=["true"]), resources=Resources(worker="nope"))
    )
    await gl_api.cp.scheduling.run_pass()
    m = await scrape(gl_api, viewer)
    assert m[("gpulayer_jobs", (("state", "queued"),))] == 2
    assert m[("gpulayer_queue_depth", ())] == 2
    waiting = {k[1][0][1]: v for k, v in m.items() if k[0] == "gpulayer_queue_waiting"}
    assert sum(waiting.values()) == 2 and set(waiting) >= {"capacity", "unschedulable"}
    assert m[("gpulayer_workers", (("state", "ready"),))] == 0
    assert m[("gpulayer_scheduling_pass_seconds_count", ())] >= 1
    assert m[("gpulayer_store_commit_seconds_count", ())] >= 1
    assert m[("gpulayer_jobs_finished_total", (("state", "cancelled"),))] == 0

    await gl_api.call("POST", f"/jobs/{job.id}/cancel")
    m = await scrape(gl_api, viewer)
    assert m[("gpulayer_jobs_finished_total", (("state", "cancelled"),))] == 1
    assert m[("gpulayer_jobs", (("state", "queued"),))] == 1
    # The earlier scrape and the cancel were timed, labelled by route template, not by job id.
    seen = {dict(k[1]).get("route") for k in m if k[0].startswith("gpulayer_http_request")}
    assert {"/metrics", "/jobs/{job_id}/cancel"} <= seen
    assert not any(job.id in str(k) for k in m)


async def test_each_control_plane_has_its_own_registry(gl_api: Api) -> None:
    # The test process holds other control planes too (one per test): none of their series
    # are here, and ours count only our own requests.
    m = await scrape(gl_api, gl_api.client_token)
    assert m[("gpulayer_jobs", (("state", "queued"),))] == 0
    assert gl_api.cp.metrics.registry is not None
    key = (
        "gpulayer_http_request_duration_seconds_count",
        (("method", "GET"), ("route", "/metrics"), ("status", "200")),
    )
    m = await scrape(gl_api, gl_api.client_token)
    assert m[key] == 1


def test_wait_classes_follow_the_placement_report() -> None:
    from gpulayer_kernel.contracts import Job, PlacementReport, Reason, ReasonCount

    spec = JobSpec(workload=CommandWorkload(argv=["true"]))
    job = Job(id="a", seq=1, spec=spec, submitted_at=0.0)
    assert wait_class(job, 10.0) == "unplanned"
    assert wait_class(job.model_copy(update={"retry_at": 20.0}), 10.0) == "retry_backoff"

    def with_report(**kw: object) -> Job:
        return job.model_copy(update={"pending": PlacementReport(job_id="a", **kw)})

    assert wait_class(with_report(quota="user a: 4 of 4 GPUs"), 10.0) == "quota"
    assert wait_class(with_report(reserved_by="b"), 10.0) == "reservation"
    busy = [ReasonCount(code=Reason.GPU_KIND, workers=1, detail="", waiting_helps=False)]
    assert wait_class(with_report(exhausted=busy), 10.0) == "capacity"
    assert wait_class(with_report(filtered=busy), 10.0) == "unschedulable"


async def test_every_series_the_grafana_dashboard_plots_exists(gl_api: Api) -> None:
    import json
    import re
    from pathlib import Path

    dashboard = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"
    exprs = [t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p["targets"]]
    wanted = {n for e in exprs for n in re.findall(r"\bgpulayer_[a-z_]+", e)}
    await gl_api.call("GET", "/status")  # a request, so the latency histogram has a series
    await gl_api.cp.scheduling.run_pass()
    r = await gl_api.call("GET", "/metrics")
    families = {f.name for f in text_string_to_metric_families(r.text)}
    suffix = re.compile(r"_(bucket|count|sum|total)$")
    missing = {n for n in wanted if n not in families and suffix.sub("", n) not in families}
    assert wanted and not missing, missing


def test_the_dashboard_s_latency_panels_leave_out_exactly_the_long_polls() -> None:
    """Issue 32, item 7: the panels excluded ``/workers/.*/work``, but the route is
    ``/worker/work``: every worker's long-poll made p99 the poll's wait. The long-polls are the
    routes with a ``wait`` (or ``timeout``) parameter, read from the route table."""
    import json
    import re
    from pathlib import Path

    from gpulayer_kernel.api.routes import operations

    dashboard = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"
    exprs = [t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p["targets"]]
    latency = [e for e in exprs if "http_request_duration_seconds_bucket" in e]
    assert latency
    polls = {
        o.template
        for o in operations()
        if o.method == "get" and any(p.name in ("wait", "timeout") for p in o.op.query)
    }
    assert "/worker/work" in polls and len(polls) >= 8
    for expr in latency:
        (pattern,) = re.findall(r'route!~"([^"]+)"', expr)
        skipped = re.compile(f"^(?:{pattern})$")  # Prometheus anchors its regexes
        assert all(skipped.match(r) for r in polls), [r for r in polls if not skipped.match(r)]
        for fast in ("/status", "/jobs", "/jobs/{job_id}", "/worker/heartbeat", "/workers"):
            assert not skipped.match(fast), fast


def test_the_budget_panel_says_why_it_is_empty() -> None:
    import json
    from pathlib import Path

    dashboard = Path(__file__).parents[2] / "docs" / "grafana-dashboard.json"
    (panel,) = [
        p for p in json.loads(dashboard.read_text())["panels"] if "budget" in p["title"].lower()
    ]
    assert "gpulayer budgets set" in panel["fieldConfig"]["defaults"]["noValue"]
