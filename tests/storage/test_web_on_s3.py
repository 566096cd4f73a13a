"""Web archives on a bucket: WARC, WET and saved pages ingested from s3:// and extracted to it
give what the same files give on local disk."""

from __future__ import annotations

import gzip
from pathlib import Path

import pandas as pd
import pytest

from tokenmill.curate.documents import read_documents
from tokenmill.curate.extract.stage import ExtractStage
from tokenmill.curate.ingest import ingest
from tokenmill.curate.stage import run_stage
from tokenmill.infra import storage
from tokenmill.infra.document_dirs import read_manifest, resolve_input_files

# Every kind of web input ingest reads, the damaged archives included.
WARCS = [
    "cc-main-2020-34-sample.warc.gz",
    "truncated.warc.gz",
    "clueweb-quirk.warc.gz",
    "wget-sample-0000.warc.gz",
    "whirlwind.warc.gz",
    "whirlwind.warc.wet.gz",
]


def _frame(stage_dir: str | Path, part: str) -> pd.DataFrame:
    files = (
        resolve_input_files(stage_dir)
        if part == "kept"
        else [f for f, _ in storage.list_files(f"{stage_dir}/rejected")]
    )
    frame = pd.concat([read_documents(f) for f in files], ignore_index=True)
    return frame.sort_values("id", ignore_index=True)


@pytest.mark.slow
def test_web_archives_ingest_and_extract_on_a_bucket_as_locally(bucket, shared_data, s3_dask_client, tmp_path) -> None:
    local_in = tmp_path / "web"
    local_in.mkdir()
    for name in WARCS:
        data = (shared_data / "web" / "warc" / name).read_bytes()
        (local_in / name).write_bytes(data)
        storage.write_bytes(f"{bucket}/web/{name}", data)
    page = gzip.open(next((shared_data / "web" / "extraction" / "html").glob("*.html.gz"))).read()
    (local_in / "saved.html.gz").write_bytes(gzip.compress(page))
    storage.write_bytes(f"{bucket}/web/saved.html.gz", gzip.compress(page))

    run = {"client": s3_dask_client, "progress": False}
    remote = ingest(f"{bucket}/web", f"{bucket}/ingest", source="web", **run)
    local = ingest(local_in, tmp_path / "ingest", source="web", **run)
    assert remote["counts"] == local["counts"]
    counts = remote["counts"]
    assert counts["in"] == counts["kept"] + sum(counts["rejected"].values())
    # 16 Common Crawl responses, 29 ClueWeb, 22 wget, the whirlwind page as HTML and as WET text,
    # the saved page; the truncated archive's complete records, then its cut reported.
    assert counts["kept"] > 16 + 29 + 22 + 2 and counts["rejected"]["truncated_archive"] == 1
    assert remote["stats"] == local["stats"]
    pd.testing.assert_frame_equal(_frame(f"{bucket}/ingest", "kept"), _frame(tmp_path / "ingest", "kept"))
    rejected, local_rejected = _frame(f"{bucket}/ingest", "rejected"), _frame(tmp_path / "ingest", "rejected")
    # A rejection's `raw` names the file it came from: the bucket's, or the local one.
    raw = rejected.pop("raw").str.replace(f"{bucket}/web/", "", regex=False)
    pd.testing.assert_series_equal(raw, local_rejected.pop("raw").str.replace(f"{local_in}/", "", regex=False))
    pd.testing.assert_frame_equal(rejected, local_rejected)
    kept = _frame(f"{bucket}/ingest", "kept")
    assert {"text/html", "text/plain"} <= set(kept["content_type"])

    remote = run_stage(ExtractStage(), f"{bucket}/ingest", f"{bucket}/extract", **run)
    local = run_stage(ExtractStage(), tmp_path / "ingest", tmp_path / "extract", **run)
    assert remote["counts"] == local["counts"] and remote["counts"]["kept"] > 50
    extracted = _frame(f"{bucket}/extract", "kept")
    pd.testing.assert_frame_equal(extracted, _frame(tmp_path / "extract", "kept"))
    assert not extracted["text"].str.contains("<div", regex=False).any()
    assert read_manifest(f"{bucket}/extract")["upstream"]["counts"]["kept"] == counts["kept"]
