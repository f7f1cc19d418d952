"""Jobs and search: `GET /api/jobs`, `POST /api/jobs/{name}/run`, `GET /api/search?q=...&k=5`.

Routes only ask the program's `JobService` (`app.state.program.jobs`); they never schedule.
Starting a run is for admins (it spends the box's time for everyone); any member may
look at runs and search.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from homeai.api.auth import CurrentMember
from homeai.api.errors import ApiError
from homeai.jobs.service import EngineNotReady, JobBusy, JobService, UnknownJob

router = APIRouter(tags=["jobs"])


def get_jobs(request: Request) -> JobService:
    service = request.app.state.program.jobs
    if service is None:
        raise ApiError(503, "background jobs are not running", code="jobs_unavailable")
    return service


JobsDep = Annotated[JobService, Depends(get_jobs)]


@router.get("/api/jobs")
def list_jobs(jobs: JobsDep, _member: CurrentMember) -> dict:
    return jobs.jobs()


@router.post("/api/jobs/{name}/run", status_code=202)
def run_job(name: str, jobs: JobsDep, member: CurrentMember) -> dict:
    if not member.is_admin:
        raise ApiError(403, "only an admin may start a job", code="admin_only")
    try:
        return {"run": jobs.run_now(name)}
    except UnknownJob as e:
        raise ApiError(404, e.args[0], code="unknown_job", param="name") from None
    except JobBusy as e:
        raise ApiError(409, f"job {name} is {e}", code="job_running") from None
    except EngineNotReady as e:
        raise ApiError(503, str(e), code="model_loading", headers={"Retry-After": "5"}) from None


@router.get("/api/search")
async def search(jobs: JobsDep, _member: CurrentMember, q: Annotated[str, Query(min_length=1, max_length=2000)],
                 k: Annotated[int, Query(ge=1, le=50)] = 5) -> dict:
    hits = await jobs.search(q, k)
    return {"query": q, "results": [hit.as_dict() for hit in hits]}
