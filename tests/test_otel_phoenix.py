"""End to end: a real trace backend (Arize Phoenix, ``phoenix serve`` on 127.0.0.1) stores the
example's sampled profiles under their requests' spans; read back through its REST API.

Phoenix is heavy, so it is not in the dev extra: ``.ci/run`` installs it into
``.venv-phoenix`` and names its ``phoenix`` command in ``TORCH_PROFILED_TEST_PHOENIX``. Phoenix has
no OTLP metrics endpoint, so the example runs with ``OTEL_METRICS_EXPORTER=none``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from tests._proc import REPO
from tests.test_otel import check_sampled_requests

PHOENIX = os.environ.get("TORCH_PROFILED_TEST_PHOENIX") or os.path.join(
    REPO, ".venv-phoenix", "bin", "phoenix"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return (
            json.load(response)
            if response.headers.get_content_type() == "application/json"
            else response.read()
        )


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    if not os.access(PHOENIX, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"Phoenix is not installed at {PHOENIX}; .ci/run installs it")
        pytest.skip(
            f"Phoenix is not installed at {PHOENIX} (.ci/run installs it: python3 -m "
            "venv .venv-phoenix && .venv-phoenix/bin/pip install arize-phoenix)"
        )
    work = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))}
    env.update(
        PHOENIX_WORKING_DIR=str(work),
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(_free_port()),
        PHOENIX_TELEMETRY_ENABLED="false",
    )
    log = open(work / "phoenix.log", "wb")
    proc = subprocess.Popen(
        [PHOENIX, "serve"], env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                _get(base + "/healthz")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        "phoenix serve did not come up: "
                        + (work / "phoenix.log").read_text()[-2000:]
                    )
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _phoenix_spans(base: str) -> list[dict]:
    """Every span of the default project, in the shape tests/otlp_receiver.py gives."""
    out, cursor = [], None
    while True:
        url = (
            base + "/v1/projects/default/spans?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        )
        page = _get(url)
        for s in page["data"]:
            out.append(
                {
                    "name": s["name"],
                    "trace_id": s["context"]["trace_id"],
                    "span_id": s["context"]["span_id"],
                    "parent_id": s["parent_id"],
                    "start": _ns(s["start_time"]),
                    "end": _ns(s["end_time"]),
                    "attributes": s["attributes"],
                }
            )
        cursor = page.get("next_cursor")
        if not cursor:
            return out


def _ns(iso: str) -> int:
    from datetime import datetime

    t = datetime.fromisoformat(iso)
    return (int(t.timestamp()) * 1_000_000 + t.microsecond) * 1000


def test_phoenix_stores_each_sampled_profile_under_its_request_span(phoenix, run_python):
    example = os.path.join(REPO, "examples", "05_inference_otel.py")
    out = run_python(
        open(example).read(),
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix,
            "OTEL_SERVICE_NAME": "inference",
            "OTEL_METRICS_EXPORTER": "none",
            "REQUESTS": "8",
        },
    )
    assert out.returncode == 0, out.stderr
    assert "ExporterWarning" not in out.stderr, out.stderr
    deadline = time.monotonic() + 60  # Phoenix stores what it received asynchronously
    while True:
        spans = _phoenix_spans(phoenix)
        if sum(s["name"] == "profiled.window" for s in spans) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    check_sampled_requests(spans, 8)  # µs times: flooring keeps every "inside" comparison
    window = next(s for s in spans if s["name"] == "profiled.window")
    assert window["attributes"]["profiled.kind"] == "window"
    assert window["attributes"]["profiled.device"] == "cpu"
