"""A real S3-compatible server for the storage tests: moto's standalone server on a free
localhost port (the way s3fs tests itself), with the environment s3fs and boto read."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from local_ports import free_port


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[str]:
    """The endpoint URL of a moto server, with AWS_* set for this process and the Dask
    workers started after it (they inherit the environment)."""
    pytest.importorskip("s3fs")
    server_module = pytest.importorskip("moto.server")
    port = free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.setenv("AWS_ENDPOINT_URL", endpoint)
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        patch.delenv("AWS_PROFILE", raising=False)
        patch.setenv("TOKENMILL_CACHE", str(tmp_path_factory.mktemp("tokenmill-cache")))
        yield endpoint
    server.stop()


@pytest.fixture
def bucket(s3_server: str) -> str:
    """A fresh, empty bucket: ``s3://<name>``."""
    import s3fs

    name = f"test-{uuid.uuid4().hex[:12]}"
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(name)
    return f"s3://{name}"


@pytest.fixture(scope="session")
def s3_dask_client(s3_server: str):
    """A 2-worker LocalCluster started with the S3 environment in place."""
    from tokenmill.infra.cluster import dask_client as make_client

    with make_client(workers=2) as client:
        yield client


@pytest.fixture
def tiny_train_config():
    """``make(data, out, **sections)``: a validated config for a few CPU steps of the tiny model;
    each keyword is a section (its keys merged over these) or a top-level key."""
    from tokenmill.train.config import TrainConfig
    from tokenmill.train.model_config import preset

    def make(data: str, out: str, **sections) -> TrainConfig:
        base = {
            "model": preset("tiny", max_seq_len=32),
            "out": out,
            "dataset": {"path": data, "seq_len": 32},
            "schedule": {"global_batch_size": 4, "micro_batch_size": 4, "warmup_steps": 1},
            "optimizer": {"lr": 3e-3},
            "parallel": {"device": "cpu"},
            "logging": {"tensorboard": False, "progress": False, "interval": 1, "eval_interval": 0},
        }
        for key, value in sections.items():
            below = base.get(key)
            base[key] = {**below, **value} if isinstance(below, dict) and isinstance(value, dict) else value
        return TrainConfig(**base).validate()

    return make
