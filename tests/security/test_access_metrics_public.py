"""`server.metrics_public = true`: a Prometheus on the LAN scrapes `/metrics` without a token,
while every other route still needs one. A real server, auth on.

Run: .venv/bin/python -m pytest tests/security/test_access_metrics_public.py
"""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import TIMEOUT
from tests.security.conftest import security_config

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return security_config(module_tmp, metrics_public=True)


def test_metrics_are_public_and_the_rest_is_not(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as anonymous:
        r = anonymous.get("/metrics")
        assert r.status_code == 200 and "homeai_model_loaded" in r.text
        assert anonymous.get("/v1/models").status_code == 401
