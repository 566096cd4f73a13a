"""The storage layer on a real S3-compatible server: reading, listing, ordered publication,
the local cache of remote inputs and the one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokenmill.curate.resume import partial_dir
from tokenmill.errors import TokenmillError
from tokenmill.infra import storage


def test_read_write_list_on_a_bucket(bucket: str) -> None:
    storage.write_text(f"{bucket}/dir/a.txt", "alpha")
    storage.write_bytes(f"{bucket}/dir/sub/b.bin", b"\x00\x01")
    storage.write_text(f"{bucket}/dir/.hidden/c.txt", "skipped")
    assert storage.read_text(f"{bucket}/dir/a.txt") == "alpha"
    assert storage.isdir(f"{bucket}/dir") and not storage.isfile(f"{bucket}/dir")
    assert storage.isfile(f"{bucket}/dir/sub/b.bin") and storage.size(f"{bucket}/dir/sub/b.bin") == 2
    assert storage.list_files(f"{bucket}/dir") == [
        (f"{bucket}/dir/a.txt", "a.txt"),
        (f"{bucket}/dir/sub/b.bin", "sub/b.bin"),
    ]
    assert storage.list_files(f"{bucket}/dir", ".bin") == [(f"{bucket}/dir/sub/b.bin", "sub/b.bin")]
    with storage.open_input(f"{bucket}/dir/a.txt") as handle:
        assert handle.read() == b"alpha"
    storage.remove(f"{bucket}/dir")
    assert not storage.exists(f"{bucket}/dir/a.txt")


def test_failed_upload_leaves_nothing(bucket: str) -> None:
    with pytest.raises(RuntimeError), storage.open_output(f"{bucket}/out.parquet") as handle:
        handle.write(b"x" * 1000)
        raise RuntimeError("writer died")
    assert not storage.exists(f"{bucket}/out.parquet")


def test_publication_writes_the_marker_last_and_cleans_stale_prefixes(bucket: str) -> None:
    target = f"{bucket}/stage"
    # An older finished output and a temporary prefix a killed writer left behind.
    storage.write_text(f"{target}/kept/old.parquet", "old")
    storage.write_text(f"{target}/manifest.json", "{}")
    stale = [f"{bucket}/.stage.tmp-1-deadbeef", f"{bucket}/.stage.partial-oldkey"]
    for prefix in stale:
        storage.write_text(f"{prefix}/kept/part.parquet", "half")

    tmp = partial_dir(target, "key")  # where a curate stage writes before publishing
    assert not any(storage.exists(prefix) for prefix in stale)
    storage.write_text(f"{tmp}/kept/new.parquet", "new")
    storage.write_text(f"{tmp}/rejected/new.parquet", "rej")
    storage.publish_prefix(tmp, target, "manifest.json", '{"done": true}')
    assert [rel for _, rel in storage.list_files(target)] == [
        "kept/new.parquet",
        "manifest.json",
        "rejected/new.parquet",
    ]
    assert storage.read_text(f"{target}/manifest.json") == '{"done": true}'
    assert not storage.exists(tmp)


def test_cached_file_is_reused_and_refreshed(bucket: str) -> None:
    url = f"{bucket}/shards/a.bin"
    storage.write_bytes(url, b"first version")
    local = storage.cached_file(url)
    assert local.read_bytes() == b"first version"
    mtime = local.stat().st_mtime_ns
    assert storage.cached_file(url) == local and local.stat().st_mtime_ns == mtime  # reused, not downloaded
    storage.write_bytes(url, b"second, longer version")  # a new etag and size
    assert storage.cached_file(url).read_bytes() == b"second, longer version"
    assert str(local).startswith(os.environ["TOKENMILL_CACHE"])


def test_local_paths_stay_plain(tmp_path: Path) -> None:
    storage.write_text(tmp_path / "a" / "b.txt", "local")
    assert storage.read_text(tmp_path / "a" / "b.txt") == "local"
    assert storage.local_input(tmp_path / "a" / "b.txt") == tmp_path / "a" / "b.txt"
    assert storage.join(tmp_path, "x") == str(tmp_path / "x")
    assert storage.join("s3://b/p/", "x", "y") == "s3://b/p/x/y"
    assert storage.absolute("file://" + str(tmp_path)) == str(tmp_path.resolve())


def test_a_location_leaves_the_file_operations_to_the_module_functions() -> None:
    """One way to do each thing: a Location names a place (and gives further ones); reading,
    writing, listing and removing are `storage.exists(location)` and its siblings."""
    members = {name for name in vars(storage.Location) if not name.startswith("_")}
    assert members == {"local_path", "name", "absolute", "native", "join", "parent"}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_location_works_the_same_on_disk_and_in_a_bucket(where: str, request: pytest.FixtureRequest) -> None:
    root = str(request.getfixturevalue("tmp_path")) if where == "local" else request.getfixturevalue("bucket")
    place = storage.Location(root + "/").join("stage")
    assert place.is_local == (where == "local") and place.name == "stage" and place.parent.path == root
    storage.write_text(place.join("manifest.json"), "{}")
    with storage.open_output(place.join("kept/a.txt")) as handle:
        handle.write(b"alpha")
    assert storage.isdir(place) and storage.isfile(place.join("manifest.json"))
    assert not storage.exists(place.join("missing"))
    assert [rel for _, rel in storage.list_files(place)] == ["kept/a.txt", "manifest.json"]
    assert storage.local_input(place.join("kept/a.txt")).read_bytes() == b"alpha"  # the file itself, or a cached copy
    storage.write_text(place.join(".stage.tmp-1-x").path + "/part", "half")
    assert [storage.basename(p) for p in storage.glob(place, ".stage.tmp-*")] == [".stage.tmp-1-x"]
    storage.remove(place)
    assert not storage.exists(place)
    if where == "local":
        assert place.local_path == Path(root) / "stage"
    else:
        with pytest.raises(TokenmillError, match="not on local disk"):
            _ = place.local_path


def test_clear_errors(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TokenmillError, match="cannot read s3://no-such-bucket-xyz/a.txt: not found"):
        storage.read_text("s3://no-such-bucket-xyz/a.txt")
    with pytest.raises(TokenmillError, match=r"needs an fsspec implementation for nosuch://"):
        storage.exists("nosuch://x/y")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(TokenmillError, match="no credentials"):
            storage.read_text(f"{bucket}/a.txt")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_a_run_directory_url_is_written_through_the_cache(s3_server) -> None:
    from tokenmill.train.config import TrainConfig

    cfg = TrainConfig(dataset={"path": "s3://b/shard"}, out="s3://b/run").validate()
    assert cfg.run_dir == storage.cache_dir_for("s3://b/run", "runs")
    assert TrainConfig(out="runs/x").run_dir == Path("runs/x")


def test_missing_s3fs_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    registry = importlib.import_module("fsspec.registry")  # the module; `fsspec.registry` is a mapping
    monkeypatch.setitem(sys.modules, "s3fs", None)  # what `import s3fs` finds without the package
    monkeypatch.delitem(registry._registry, "s3", raising=False)
    with pytest.raises(
        TokenmillError, match=r"^reading or writing s3://b/x needs s3fs \(pip install 'tokenmill\[s3\]'\)$"
    ):
        storage.exists("s3://b/x")


def test_a_mirror_moves_only_what_changed(bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"{bucket}/dir"
    storage.write_text(f"{url}/a.txt", "a")
    storage.write_text(f"{url}/b/c.txt", "c")
    mirror = storage.Mirror(url, "test")
    assert mirror.pull(mirror.files()) == ["a.txt", "b/c.txt"]
    assert (mirror.local / "b" / "c.txt").read_text() == "c"
    stamp = (mirror.local / "a.txt").stat().st_mtime_ns
    # Another process with the same URL: nothing downloaded again, also for an object whose
    # etag is not an MD5 (a multipart upload), which the record of versions covers.
    monkeypatch.setattr(storage, "_md5_matches", lambda local, info: False)
    again = storage.Mirror(url, "test")
    again.pull(again.files())
    assert (mirror.local / "a.txt").stat().st_mtime_ns == stamp
    storage.write_text(f"{url}/a.txt", "a, changed")
    storage.Mirror(url, "test").pull(["a.txt", "missing.txt"])
    assert (mirror.local / "a.txt").read_text() == "a, changed"

    (mirror.local / "b" / "c.txt").write_text("c, changed here")
    (mirror.local / "d.txt").write_text("d")
    mirror.push(["b/c.txt", "a.txt"], last=["d.txt"])
    assert storage.read_text(f"{url}/b/c.txt") == "c, changed here" and storage.read_text(f"{url}/d.txt") == "d"

    assert storage.create_exclusive(f"{url}/lock", b"1") and not storage.create_exclusive(f"{url}/lock", b"2")
    assert mirror.read("lock") == b"1" and mirror.read("nothing") is None


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        # S3 signature version 2, GCS and Azure signed URLs, a token, a user and password.
        (
            "https://b.s3.amazonaws.com/k.jsonl?AWSAccessKeyId=AKID&Expires=99&Signature=s%2Fig",
            "https://b.s3.amazonaws.com/k.jsonl",
        ),
        (
            "https://storage.googleapis.com/b/k?X-Goog-Algorithm=A&X-Goog-Credential=c&X-Goog-Signature=s",
            "https://storage.googleapis.com/b/k",
        ),
        (
            "https://a.blob.core.windows.net/c/k.gz?sv=2022-11-02&sig=S1G&sp=r",
            "https://a.blob.core.windows.net/c/k.gz?sv=2022-11-02&sp=r",
        ),
        ("https://h/k?versionId=3&token=T0K&page=2", "https://h/k?versionId=3&page=2"),
        ("https://user:pass@h:8080/k", "https://h:8080/k"),
        ("/local/path?sig=1", "/local/path?sig=1"),
    ],
)
def test_redact_removes_the_credentials_of_a_url(url: str, redacted: str) -> None:
    assert storage.redact(url) == redacted
    assert storage.redact(f"cannot read {url}: denied") == f"cannot read {redacted}: denied"  # inside a message


def test_join_inside_refuses_paths_that_leave_the_root(tmp_path: Path) -> None:
    assert storage.join_inside(tmp_path, "a/b.txt") == str(tmp_path / "a" / "b.txt")
    assert storage.join_inside("s3://bucket/index", "rows/part-0.parquet") == "s3://bucket/index/rows/part-0.parquet"
    for bad in ("../x", "a/../../x", "/etc/passwd", "~/x", "s3://other/x", ""):
        with pytest.raises(TokenmillError, match="is not a relative path inside"):
            storage.join_inside(tmp_path, bad)


def test_records_are_written_without_the_credentials_of_the_urls_they_name(tmp_path: Path) -> None:
    from tokenmill.infra import records

    url = "https://h/k.jsonl?X-Amz-Credential=AKIDEXAMPLE&X-Amz-Signature=5ig"
    records.write_record(tmp_path / "r.json", {"key": "k", "inputs": [url]})
    assert records.read_record(tmp_path / "r.json", key="k") == {"key": "k", "inputs": ["https://h/k.jsonl"]}


def test_a_mirror_refuses_keys_outside_its_url(bucket: str) -> None:
    """What a work directory, a training run and a dedup index pull, push and remove by name."""
    mirror = storage.Mirror(f"{bucket}/work", "workdirs")
    storage.write_text(f"{bucket}/outside.txt", "not the mirror's")
    (mirror.local.parent / "outside.txt").write_text("not the mirror's either")
    for act in (mirror.pull, mirror.push):
        with pytest.raises(TokenmillError, match=r"file '\.\./outside\.txt' is not a relative path inside"):
            act(["../outside.txt"])
    with pytest.raises(TokenmillError, match="is not a relative path inside"):
        mirror.remove("../outside.txt")
    assert storage.read_text(f"{bucket}/outside.txt") == "not the mirror's"
    assert (mirror.local.parent / "outside.txt").read_text() == "not the mirror's either"
