"""What tokenmill's Dask clusters listen on: a LocalCluster on loopback only, a Slurm job's
cluster over TLS with the job's own certificates."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_ports import free_port, listening

psutil = pytest.importorskip("psutil")


def test_a_local_cluster_listens_on_loopback_only():
    import multiprocessing

    from tokenmill.infra.cluster import dask_client

    this = psutil.Process()
    before = listening(this)
    children_before = set(multiprocessing.active_children())
    with dask_client(workers=1) as client:
        # The scheduler, its dashboard and the nanny run in this process, the worker in a child.
        in_process = listening(this) - before
        workers = [psutil.Process(c.pid) for c in multiprocessing.active_children() if c not in children_before]
        in_workers = set().union(*(listening(worker) for worker in workers))
        dashboard_port = client.cluster.scheduler.http_server.port
        worker_ports = {int(address.rsplit(":", 1)[1]) for address in client.scheduler_info()["workers"]}
    assert len(workers) == 1
    assert dashboard_port in {port for _, port in in_process}
    assert worker_ports <= {port for _, port in in_workers}
    assert {address for address, _ in in_process | in_workers} == {"127.0.0.1"}, in_process | in_workers


def test_job_certificates_are_private(tmp_path):
    from tokenmill.infra.tls import write_job_certificates

    files = write_job_certificates(tmp_path / "tls")
    assert stat.S_IMODE((tmp_path / "tls").stat().st_mode) == 0o700
    for path in (files.ca_file, files.cert_file, files.key_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    again = write_job_certificates(tmp_path / "tls")  # a requeued job makes new ones in place
    assert again.key_file.read_bytes() != b"" and stat.S_IMODE(again.key_file.stat().st_mode) == 0o600


LOCAL_HTTP = ("--dashboard-address", "127.0.0.1:0")


def _dask(module: str, *args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", f"distributed.cli.{module}", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _job_tls_env(tls: Path) -> dict[str, str]:
    """What the job script gives the command's client (recipe_job.dask_tls_lines)."""
    return {
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(tls / "ca.pem"),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": str(tls / "cert.pem"),
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": str(tls / "key.pem"),
    }


def test_a_tls_cluster_runs_tasks_for_the_jobs_client_and_refuses_any_other(tmp_path, monkeypatch):
    """The job script's cluster, on loopback: `dask scheduler` and `dask worker` with the job's
    certificates; the command's client, configured as the script configures it, runs a task;
    a client without the certificates, or with another job's, is refused."""
    import dask
    from distributed import Client
    from distributed.security import Security

    from tokenmill.errors import TokenmillError
    from tokenmill.infra.cluster import dask_client
    from tokenmill.infra.tls import write_job_certificates

    tls = tmp_path / "tls"
    write_job_certificates(tls)
    other = write_job_certificates(tmp_path / "other-job")
    flags = [
        "--tls-ca-file",
        str(tls / "ca.pem"),
        "--tls-cert",
        str(tls / "cert.pem"),
        "--tls-key",
        str(tls / "key.pem"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    port = free_port()
    address = f"tls://127.0.0.1:{port}"
    # As the job script starts them (recipe_job.run_script), on loopback.
    scheduler = _dask("dask_scheduler", "--host", "tls://127.0.0.1", "--port", str(port), *LOCAL_HTTP, *flags, env=env)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while ("127.0.0.1", port) not in listening(psutil.Process(scheduler.pid)):
            assert scheduler.poll() is None and time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        worker = _dask(
            "dask_worker", address, "--host", "tls://127.0.0.1", "--nthreads", "1", *LOCAL_HTTP, *flags, env=env
        )

        for key, value in _job_tls_env(tls).items():
            monkeypatch.setenv(key, value)
        dask.config.refresh()
        try:
            with dask_client(address) as client:
                client.wait_for_workers(1, timeout=60)
                assert client.submit(sum, [1, 2, 3]).result(timeout=60) == 6
        finally:
            monkeypatch.undo()
            dask.config.refresh()

        cluster = [psutil.Process(scheduler.pid), psutil.Process(worker.pid), *psutil.Process(worker.pid).children()]
        listeners = {p.pid: listening(p) for p in cluster}
        assert ("127.0.0.1", port) in listeners[scheduler.pid]
        assert {address for found in listeners.values() for address, _ in found} == {"127.0.0.1"}, listeners
        with pytest.raises(TokenmillError, match="cannot reach the Dask scheduler"):
            with dask_client(address.replace("tls://", "tcp://")):  # no certificate at all
                pass
        stranger = Security(
            tls_ca_file=str(other.ca_file), tls_client_cert=str(other.cert_file), tls_client_key=str(other.key_file)
        )
        with pytest.raises(OSError):  # another job's certificate
            Client(address, security=stranger, timeout="5s")
    finally:
        for process in (worker, scheduler):
            if process is not None:
                process.kill()
                process.wait()
