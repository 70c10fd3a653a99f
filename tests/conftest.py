from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from perfetto_checker import check_perfetto_files
from simulated_runs import write_run
from trace_checker import check_chrome_files

from multicore_profiler.kernels.synthetic import GMM1, SWIGLU, SimulatedMoeKernel
from multicore_profiler.storage.store import Store, open_store

LONGEST_FIRST = ("test_remote_compact.py", "test_remote_store.py", "test_spark.py")
"""The files that take longest (an S3 server, Spark): collected first, so that the test
processes (``make test``'s ``--dist loadfile``) start them at once instead of ending on
them while the others idle."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the ``LONGEST_FIRST`` files ahead of the others, each file's tests in order."""
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A fresh, empty store in a temporary directory."""
    with open_store(tmp_path / "store") as opened:
        yield opened


@pytest.fixture
def runs(store: Store) -> Store:
    """Base: two runs of the default kernel. Same: another run of it. Slow: SwiGLU 25%
    slower. Fast: GMM1 20% faster."""
    write_run(store, SimulatedMoeKernel(), seed=1, commit="base0001")
    write_run(store, SimulatedMoeKernel(), seed=2, commit="base0001")
    write_run(store, SimulatedMoeKernel(), seed=3, commit="same0002")
    write_run(store, SimulatedMoeKernel(stage_us={SWIGLU: 5.0}), seed=4, commit="slow0003")
    write_run(store, SimulatedMoeKernel(stage_us={GMM1: 20.0}), seed=5, commit="fast0004")
    return store


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3-compatible server (moto) on loopback, for the tests' session.

    Moto's S3 app alone: moto's ``ThreadedMotoServer`` serves every service through a
    dispatcher that, for each request, lists moto's package directory and matches the host
    against every AWS service's URL patterns. That was a fifth to a quarter of a small
    request's time (a HEAD 2.4 ms against 1.7 ms, a GET 4.9 against 3.7) and about 12 % of
    the CPU the S3 tests take."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = make_server(
        "127.0.0.1", 0, create_backend_app("s3"), threaded=True, request_handler=MotoRequestHandler
    )
    serving = threading.Thread(target=server.serve_forever, name="moto-s3", daemon=True)
    serving.start()
    host, port = server.server_address[:2]
    yield f"http://{host}:{port}"
    server.shutdown()
    serving.join()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment that points S3 clients (pyarrow, boto3) at the test server."""
    env = {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


S3Request = tuple[str, str, tuple[str, ...]]
"""A request the S3 server received: its method, the key (the bucket's name and what
follows, unquoted) and the names of its query's parameters, sorted."""


@pytest.fixture
def s3_requests(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> list[S3Request]:
    """The requests the test's S3 server receives from now on, in order. Each is recorded
    before the server answers it, so the list is complete once the client has its answers."""
    from urllib.parse import parse_qs, unquote

    from werkzeug.serving import WSGIRequestHandler

    received: list[S3Request] = []
    answer = WSGIRequestHandler.run_wsgi

    def recorded(handler: WSGIRequestHandler) -> None:
        path, _, query = handler.path.partition("?")
        names = tuple(sorted(parse_qs(query, keep_blank_values=True)))
        received.append((handler.command, unquote(path.lstrip("/")), names))
        answer(handler)

    monkeypatch.setattr(WSGIRequestHandler, "run_wsgi", recorded)
    return received


@pytest.fixture
def s3_uri(s3_env: dict[str, str], request: pytest.FixtureRequest) -> str:
    """``s3://<a new bucket>/store``: where a test's remote store goes."""
    import boto3

    bucket = "mcprof-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    bucket = f"{bucket}-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/store"


@pytest.fixture(autouse=True)
def _exported_traces_pass_the_importer_rules(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used tmp_path, every ``*.pftrace`` / ``*.pftrace.gz`` it wrote there
    (recursively) must pass perfetto_checker's rules of Perfetto's TrackEvent importer, and
    every Chrome JSON trace the exporter wrote there (``*.json`` / ``*.json.gz``) must pass
    trace_checker's rules of Perfetto's and chrome://tracing's JSON importers."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp_path = request.getfixturevalue("tmp_path")  # set up here, so it is torn down after us
    yield
    check_perfetto_files(tmp_path)
    check_chrome_files(tmp_path)
