"""Web archives -> documents: WARC and WET files and saved HTML pages (read by `ingest`).

One document per HTML `response` record of a WARC (or `conversion` record of a WET file), with
id = its `WARC-Record-ID` and the columns `url`, `date` (WARC-Date), `warc_record_id`,
`content_type` (MIME type without parameters), `charset` (the codec the text was decoded with)
and `source`. `text` is the decoded HTML (the `extract` stage turns it into main text) or, for
WET, Common Crawl's plain text (`content_type` text/plain). A saved page (`.html`, `.htm`,
`.html.gz`) is one document named after its file.

Records that are not documents (warcinfo, request, metadata, resource, revisit) are counted in
the manifest's stats as `records.<type>`; responses that are not usable pages are rejected with
a reason (`REASONS`). Archives are streamed record by record with FastWARC (bench/warc_read.py:
several times faster than warcio on the same files).

The charset of a page: the HTTP header's, else a `<meta charset>` / `http-equiv` declaration in
its first bytes, else detected by uchardet (resiliparse's `detect_encoding`: a C library, fast
enough to run on every page, and it maps labels the way browsers do, e.g. gb2312 -> gbk).
"""

from __future__ import annotations

import codecs
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tokenmill.curate import limits
from tokenmill.curate.extract.html_text import HTML_TYPES
from tokenmill.curate.stage import Batch, DocumentBatcher
from tokenmill.curate.text import decode_replacing
from tokenmill.infra import storage

# Document columns beyond id, text and source.
WEB_COLUMNS = ("url", "date", "warc_record_id", "content_type", "charset")
# A declared charset is looked for in this many leading bytes (HTML's prescan reads 1024;
# real pages often put a long <head> before it).
META_PRESCAN_BYTES = 4096
# A page whose bytes do not decode in its charset is kept with U+FFFD in their place when they are
# at most this share of its bytes; beyond that it is rejected as `warc.undecodable`.
MAX_REPLACED_SHARE = 0.01
# Records per output batch: bounds a worker's memory on large archives.
BATCH_RECORDS = 2_000

REASONS = {
    "warc.not_html": "a WARC response whose payload is not HTML (its content type is in `raw`)",
    "warc.http_status": "a WARC response with an HTTP status other than 200 (redirects, errors; in `raw`)",
    "warc.empty": "a WARC response or WET record with an empty body",
    "warc.undecodable": "a page whose bytes do not decode (more than 1% undecodable, or a broken content encoding)",
    "truncated_archive": "a WARC/WET file cut off mid-record: the records before the cut were kept",
    "html.empty": "a saved HTML page with no content",
    "html.undecodable": "a saved HTML page whose bytes do not decode (more than 1% undecodable)",
}

_META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]+)""", re.IGNORECASE)
_HTML_START = re.compile(rb"\s*(<!--.*?-->\s*)*<(!doctype\s+html|html|head|body)", re.IGNORECASE | re.DOTALL)


class _Undecodable(Exception):
    """A payload that cannot be turned into text; the message says why."""


def _codec(label: str | None) -> str | None:
    """Python codec for a charset label, mapped as browsers map it (WHATWG); None if unknown."""
    if not label:
        return None
    from resiliparse.parse.encoding import map_encoding_to_html5

    name = map_encoding_to_html5(label.strip().strip("\"'"), fallback_utf8=False)
    if name is None:
        return None
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def page_charset(body: bytes, declared: str | None) -> tuple[str, str]:
    """(codec, how it was found): byte-order mark, HTTP header, <meta> declaration, or detection."""
    if body.startswith(codecs.BOM_UTF8):
        return "utf-8", "bom"
    codec = _codec(declared)
    if codec:
        return codec, "header"
    match = _META_CHARSET.search(body, 0, META_PRESCAN_BYTES)
    codec = _codec(match.group(1).decode("ascii", "replace")) if match else None
    if codec:
        return codec, "meta"
    from resiliparse.parse.encoding import detect_encoding

    return codecs.lookup(detect_encoding(body)).name, "detected"


def decode_page(body: bytes, declared: str | None, stats: DocumentBatcher) -> tuple[str, str]:
    """(text, codec). Raises `_Undecodable` when too many bytes do not decode."""
    codec, how = page_charset(body, declared)
    stats.count(f"charset.{how}")
    try:
        return body.decode(codec), codec
    except UnicodeDecodeError:
        pass
    if how != "detected":
        # A declared charset that does not fit the bytes is common; the bytes themselves decide.
        from resiliparse.parse.encoding import detect_encoding

        detected = codecs.lookup(detect_encoding(body)).name
        if detected != codec:
            try:
                text = body.decode(detected)
            except UnicodeDecodeError:
                pass
            else:
                stats.count("charset.declared_wrong")
                return text, detected
    text, replaced = decode_replacing(body, codec)
    if replaced > MAX_REPLACED_SHARE * len(body):
        raise _Undecodable(f"{replaced} of {len(body)} bytes are not valid {codec}")
    stats.count("replaced_bytes", replaced)
    stats.count("docs_with_replaced_bytes")
    return text, codec


def _dechunk(body: bytes) -> bytes:
    """The payload of an HTTP `Transfer-Encoding: chunked` body; ValueError if it is not one."""
    out = bytearray()
    position = 0
    while True:
        line_end = body.index(b"\r\n", position)
        size = int(body[position:line_end].split(b";", 1)[0].strip(), 16)
        position = line_end + 2
        if size == 0:
            return bytes(out)
        if position + size > len(body):
            raise ValueError("chunk runs past the end of the body")
        out += body[position : position + size]
        position += size + 2


class _TooLarge(Exception):
    """A payload that decompresses to more than the record limit; the argument is its first bytes.
    The rest is never decompressed: a bomb costs the limit, not its size."""


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    """zlib-decompress `body`, never producing more than `limit` + 1 bytes at once (a bomb)."""
    inflater = zlib.decompressobj(wbits)
    data = inflater.decompress(body, limit + 1)
    if len(data) > limit:
        raise _TooLarge(data[: limits.HEAD_BYTES])
    return data + inflater.flush()


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding in ("gzip", "x-gzip"):
        return _inflate(body, 47, limit)  # gzip or zlib header, detected
    if encoding == "deflate":
        try:
            return _inflate(body, 15, limit)
        except zlib.error:
            return _inflate(body, -15, limit)  # raw deflate, as some servers send it
    if encoding == "br":
        # Imported here: the command line imports this module to build its parsers, and a
        # training-only install (the GPU wheel set) has no brotli.
        import brotli

        decompressor = brotli.Decompressor()
        data = decompressor.process(body, output_buffer_limit=limit + 1)
        if len(data) > limit:
            raise _TooLarge(data[: limits.HEAD_BYTES])
        return data
    raise ValueError(f"unsupported content encoding {encoding!r}")


def http_payload(
    body: bytes,
    transfer_encoding: str | None,
    content_encoding: str | None,
    stats: DocumentBatcher,
    limit: int = limits.DEFAULT_MAX_RECORD_BYTES,
) -> bytes:
    """The entity an HTTP response carried, with transfer and content encodings undone.

    Archives often store a payload already decoded under its original headers (ClueWeb09 does):
    a body that fails to decode and does not start like the encoding's output is taken as is and
    counted (`encoding_already_undone`); one that starts like it but fails is undecodable. A
    payload that decompresses to more than `limit` bytes raises `_TooLarge` once that is seen.
    """
    if transfer_encoding and "chunked" in transfer_encoding.lower():
        try:
            body = _dechunk(body)
        except ValueError:
            stats.count("encoding_already_undone")
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity", "none"):
        return body
    try:
        return _decompress(body, encoding, limit)
    except _TooLarge:
        raise
    except Exception as error:  # zlib.error, brotli.error, ValueError: all mean "not this encoding"
        looks_encoded = (
            body[:2] == b"\x1f\x8b" if encoding in ("gzip", "x-gzip") else not _HTML_START.match(body[:1024])
        )
        if looks_encoded:
            raise _Undecodable(f"Content-Encoding {encoding}: {error}") from None
        stats.count("encoding_already_undone")
        return body


def _target_uri(value: str | None) -> str | None:
    # wget writes the URI in angle brackets (as the WARC 1.0 text's grammar shows it).
    if value is None:
        return None
    value = value.strip()
    return value[1:-1] if value.startswith("<") and value.endswith(">") else value


def _is_html(content_type: str, body: bytes) -> bool:
    if content_type in HTML_TYPES:
        return True
    # No (or a generic) declared type: sniff the markup, as browsers do.
    return content_type in ("", "application/octet-stream", "text/plain", "unknown/unknown") and bool(
        _HTML_START.match(body[:1024])
    )


@dataclass
class WarcFile:
    """All records of one WARC or WET file, streamed in order."""

    path: str
    source: str
    kind: str = "warc"  # "warc": HTML responses; "wet": conversion records
    max_record_bytes: int = limits.DEFAULT_MAX_RECORD_BYTES

    def run(self) -> Iterator[Batch]:
        from fastwarc.warc import ArchiveIterator, WarcRecordType

        batch = DocumentBatcher(self.source, WEB_COLUMNS)
        number = 0
        # A local path is read by FastWARC's own file stream; an object-storage URL through a
        # storage file object, which fetches in blocks as records are read (never the whole
        # archive in memory). FastWARC undoes the gzip members itself either way.
        stream = None if storage.Location(self.path).is_local else storage.open_input(self.path)
        try:
            records = ArchiveIterator(
                stream if stream is not None else self.path,
                record_types=WarcRecordType.any_type,
                parse_http=False,  # parsed below, for responses only
                quirks_mode=True,  # ClueWeb and other older writers bend the format
                fsspec_args=False,
            )
            for record in records:
                number += 1
                if not self._record(record, number, batch):
                    break
                if len(batch) >= BATCH_RECORDS:
                    yield batch.flush()
        except OSError as error:
            # Damaged bytes (a gzip data error): the records before them were kept; nothing after
            # them is guessed at.
            batch.reject(
                f"{self.source}:{storage.public_name(self.path)}:corrupt",
                "corrupt_file",
                f"{storage.redact(self.path)}: unreadable after record {number}: {error}",
                {},
            )
        else:
            if number == 0 and storage.size(self.path) > 0:
                # Bytes but not one record: not an archive (a misnamed file), said rather than skipped.
                batch.reject(
                    f"{self.source}:{storage.public_name(self.path)}",
                    "corrupt_file",
                    f"{storage.redact(self.path)}: no {self.kind.upper()} record in its {storage.size(self.path)} bytes",
                    {},
                )
        finally:
            if stream is not None:
                stream.close()
        yield batch.flush()

    def _record(self, record: Any, number: int, batch: DocumentBatcher) -> bool:
        """Handle one record; False when the archive ends in a damaged record."""
        from fastwarc.warc import WarcRecordType

        record_type = record.record_type
        headers = record.headers
        record_id = record.record_id
        declared = headers.get("Content-Length")
        if declared is None or record_id is None:
            return self._truncated(record_id, number, "the record's header is incomplete", batch)
        declared_length = record.content_length
        is_document = (self.kind == "warc" and record_type == WarcRecordType.response) or (
            self.kind == "wet" and record_type == WarcRecordType.conversion
        )
        if not is_document:
            consumed = record.reader.consume()
            if consumed != declared_length:
                return self._truncated(record_id, number, f"{consumed} of {declared_length} bytes", batch)
            batch.count(f"records.{record_type}")
            return True
        batch.count(f"records.{'response' if self.kind == 'warc' else 'conversion'}")
        meta = {
            "url": _target_uri(headers.get("WARC-Target-URI")),
            "date": headers.get("WARC-Date"),
            "warc_record_id": record_id,
            "content_type": None,
            "charset": None,
        }
        limit = self.max_record_bytes
        if declared_length > limit:
            # Skipped in FastWARC's bounded reads: a decompression bomb is never held.
            head = record.reader.read(limits.HEAD_BYTES)
            consumed = len(head) + record.reader.consume()
            if consumed != declared_length:
                return self._truncated(record_id, number, f"{consumed} of {declared_length} bytes", batch)
            limits.reject_too_large(batch, record_id, declared_length, limit, head, meta)
            return True
        if self.kind == "wet":
            body = record.reader.read()
            if len(body) != declared_length:
                return self._truncated(record_id, number, f"{len(body)} of {declared_length} bytes", batch)
            meta["content_type"] = "text/plain"
            meta["charset"] = "utf-8"
            try:
                text = body.decode("utf-8")  # Common Crawl writes WET text as UTF-8
            except UnicodeDecodeError as error:
                batch.reject(record_id, "warc.undecodable", str(error), meta)
                return True
            return self._keep(record_id, text, meta, batch)
        if record.is_http:
            record.parse_http(quirks_mode=True)
        body = record.reader.read()
        if len(body) != record.content_length:
            return self._truncated(record_id, number, f"{len(body)} of {record.content_length} body bytes", batch)
        http = record.http_headers
        if http is None or not record.is_http:
            batch.reject(record_id, "warc.not_html", f"not an HTTP response: {headers.get('Content-Type')}", meta)
            return True
        content_type = (record.http_content_type or "").strip().lower()
        meta["content_type"] = content_type or None
        status = http.status_code
        if status != 200:
            batch.reject(record_id, "warc.http_status", f"HTTP {status}: {http.status_line}", meta)
            return True
        try:
            payload = http_payload(body, http.get("Transfer-Encoding"), http.get("Content-Encoding"), batch, limit)
        except _Undecodable as error:
            batch.reject(record_id, "warc.undecodable", str(error), meta)
            return True
        except _TooLarge as error:
            limits.reject_too_large(batch, record_id, f"more than {limit} decompressed", limit, error.args[0], meta)
            return True
        if not payload.strip():
            batch.reject(record_id, "warc.empty", f"{len(payload)} bytes of payload", meta)
            return True
        if not _is_html(content_type, payload):
            batch.reject(record_id, "warc.not_html", f"Content-Type: {http.get('Content-Type')}", meta)
            return True
        if content_type not in HTML_TYPES:
            meta["content_type"] = "text/html"  # sniffed
        try:
            text, codec = decode_page(payload, record.http_charset, batch)
        except _Undecodable as error:
            batch.reject(record_id, "warc.undecodable", str(error), meta)
            return True
        meta["charset"] = codec
        return self._keep(record_id, text, meta, batch)

    def _keep(self, record_id: str, text: str, meta: dict[str, Any], batch: DocumentBatcher) -> bool:
        if not text.strip():
            batch.reject(record_id, "warc.empty", "no text", meta)
        else:
            batch.keep(record_id, text, meta)
        return True

    def _truncated(self, record_id: str | None, number: int, detail: str, batch: DocumentBatcher) -> bool:
        batch.reject(
            record_id or f"{self.source}:{storage.public_name(self.path)}:truncated",
            "truncated_archive",
            f"{storage.redact(self.path)}: record {number} is cut off ({detail}); it and anything after it were not read",
            {"warc_record_id": record_id},
        )
        return False


@dataclass
class HtmlFiles:
    """Saved pages, one document per file, named by the file."""

    files: list[tuple[str, str]]  # (path, id)
    source: str
    max_record_bytes: int = limits.DEFAULT_MAX_RECORD_BYTES

    def run(self) -> Iterator[Batch]:
        batch = DocumentBatcher(self.source, WEB_COLUMNS)
        for path, doc_id in self.files:
            meta = {"url": None, "date": None, "warc_record_id": None, "content_type": "text/html", "charset": None}
            try:
                with storage.open_decompressed(path) as handle:
                    body, size = limits.read_limited(handle, self.max_record_bytes)
            except (OSError, EOFError) as error:
                batch.reject(doc_id, "corrupt_file", f"{type(error).__name__}: {error}", meta)
                continue
            if size > self.max_record_bytes:
                limits.reject_too_large(batch, doc_id, size, self.max_record_bytes, body, meta)
                continue
            if not body.strip():
                batch.reject(doc_id, "html.empty", f"{len(body)} bytes", meta)
                continue
            try:
                text, codec = decode_page(body, None, batch)
            except _Undecodable as error:
                batch.reject(doc_id, "html.undecodable", str(error), meta)
                continue
            meta["charset"] = codec
            batch.keep(doc_id, text, meta)
            if len(batch) >= BATCH_RECORDS:
                yield batch.flush()
        yield batch.flush()
