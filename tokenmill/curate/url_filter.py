"""The `url-filter` stage: reject web documents by their URL.

Two kinds of rule, checked in this order (the first that fires is the document's reason):

- Blocklists (`url.blocklist:<name>`): files with one domain or URL per line (comments, blank
  lines and hosts-file lines such as `0.0.0.0 ads.example` allowed; the name is the file's stem)
  and UT1-style category folders (`<root>/<category>/domains` and `<root>/<category>/urls`; the
  name is the category). A domain entry matches that host and every subdomain of it; a URL entry
  (`example.com/some/path`) matches URLs on that host (or a subdomain) whose path starts with
  that path at a `/` boundary, as squidGuard reads UT1's `urls` files. Hosts are compared
  normalised: lower case, userinfo, port, trailing dot and one leading `www.` removed,
  internationalised names in IDNA (punycode) form.
- Banned words, as C4's badwords rule and datatrove's URLFilter apply them to URLs: the URL,
  lower-cased and percent-decoded, is split into words at every non-alphanumeric character; a
  banned word (or phrase: consecutive words) that is a whole word of the URL rejects it
  (`url.banned_word`); `soft_word_threshold` distinct soft-banned words reject it
  (`url.soft_banned_words`); a banned subword anywhere in the URL with its non-alphanumeric
  characters removed rejects it (`url.banned_subword`, which catches `freeporn.example`).

A URL that cannot be parsed or has no valid host is rejected as `url.malformed`. A document
without a URL (null, empty, or no url column) is rejected as `url.missing`, or kept and counted
in `stats` (`url.missing`) with `missing_url: keep`.

Lists are read once per worker process (cached by path, size and modification time), never
pickled with the stage; the manifest records each list's size and a digest of its file.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlsplit

from tokenmill.curate.registry import Stage, option
from tokenmill.curate.stage import Batch, StageOptions, reject
from tokenmill.errors import ConfigError
from tokenmill.infra import storage

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

REASONS = {
    "url.blocklist:": "its host (or a parent domain), or its URL, is on that blocklist",
    "url.banned_word": "a banned word or phrase is a whole word of the URL",
    "url.soft_banned_words": "at least {soft_word_threshold} distinct soft-banned words are whole words of the URL",
    "url.banned_subword": "a banned subword occurs in the URL with its non-alphanumeric characters removed",
    "url.malformed": "the URL cannot be parsed or has no valid host name",
    "url.missing": "the document has no URL (null, empty or no `{url_field}` column)",
}

# Addresses that hosts-format blocklists point blocked names at.
_HOSTS_ADDRESSES = frozenset({"0.0.0.0", "127.0.0.1", "::", "::1", "0", "255.255.255.255"})
# A scheme (`https:`, `mailto:`), but not `host:8080`.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:(?!\d)")
# Letters, digits, `-` and `_`, up to 63: what resolvers and browsers take (RFC 1123 forbids a
# leading or trailing `-`, yet such hosts are real: `name-.blogspot.com`, in UT1 too).
_LABEL = r"[a-z0-9_\-]{1,63}"
_HOST = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}")
_WORD_SPLIT = re.compile(r"[\W_]+")
_INLINE_COMMENT = re.compile(r"\s+#.*$")


# --------------------------------------------------------------------------------------------
# URLs and hosts


def normalize_host(host: str) -> str | None:
    """The comparable form of a host name, or None when it is not a valid one: lower case, no
    trailing dot, no leading `www.`, IDNA (punycode) for internationalised names; IP addresses in
    their canonical form."""
    host = host.strip().rstrip(".").lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        return None
    if ":" in host:  # only an IPv6 address has a colon once the port is gone
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError:
            return None
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            return None
    if host.startswith("www.") and host.count(".") >= 2:
        host = host[4:]
    if len(host) > 253 or not _HOST.fullmatch(host):
        return None
    return host


@dataclass(frozen=True)
class ParsedUrl:
    host: str  # normalised (normalize_host)
    path: str  # lower case, without a trailing `/`

    def hosts(self) -> list[str]:
        """The host and each parent domain, most specific first (an IP address alone)."""
        if ":" in self.host or self.host.replace(".", "").isdigit():
            return [self.host]
        parents = [self.host[i + 1 :] for i, char in enumerate(self.host) if char == "."]
        return [self.host, *parents]


def parse_url(url: str) -> ParsedUrl | None:
    """Host and path of a URL (`https://u:p@WWW.Example.com:8080/A/` -> example.com, /a); None
    for a malformed one. A URL without a scheme (`example.com/page`) is read as a host and path."""
    url = url.strip()
    if not url:
        return None
    if "://" not in url and not url.startswith("//"):
        if _SCHEME.match(url):  # `mailto:...`, `javascript:...`: a scheme without a host
            return None
        url = "//" + url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
        hostname = parts.hostname
    except ValueError:
        return None
    if not hostname:
        return None
    host = normalize_host(hostname)
    if host is None:
        return None
    return ParsedUrl(host, parts.path.lower().rstrip("/"))


def url_words(url: str) -> list[str]:
    """The words of a URL: lower case, percent-decoded, split at every non-alphanumeric character."""
    return [w for w in _WORD_SPLIT.split(unquote(url).lower()) if w]


def _squeeze(text: str) -> str:
    """Lower case with every non-alphanumeric character removed (for subwords)."""
    return _WORD_SPLIT.sub("", text.lower())


# --------------------------------------------------------------------------------------------
# Lists


@dataclass
class Blocklists:
    """Every blocklist in one index: host -> list name, host -> [(path prefix, list name)]."""

    domains: dict[str, str] = field(default_factory=dict)
    urls: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    index: bool = True  # False: only count entries (the driver's tally for the manifest)

    def add_entry(self, name: str, entry: str) -> bool:
        """Add one domain or URL entry; False when it is not a valid one."""
        if "/" in entry:
            parsed = parse_url(entry)
            if parsed is None:
                return False
            if parsed.path:
                if self.index:
                    self.urls.setdefault(parsed.host, []).append((parsed.path, name))
                return True
            host = parsed.host
        else:
            host = normalize_host(entry)
            if host is None:
                return False
        if self.index:
            self.domains.setdefault(host, name)  # the first list that names a host gives the reason
        return True

    def add_file(self, name: str, path: Path) -> None:
        counts = self.sizes.setdefault(name, {"entries": 0, "skipped": 0})
        first_bad = None
        domains, index, simple = self.domains, self.index, _HOST.fullmatch
        with open(path, encoding="utf-8", errors="replace") as lines:
            for number, line in enumerate(lines, start=1):
                line = line.rstrip("\n")
                # Most lines of a big list are a host already in normal form: the fast path.
                if simple(line) and not line.startswith("www.") and len(line) <= 253:
                    if index:
                        domains.setdefault(line, name)
                    counts["entries"] += 1
                    continue
                if "#" in line:
                    line = _INLINE_COMMENT.sub("", line)
                line = line.strip()
                if not line or line.startswith(("#", "!", ";")):
                    continue
                fields = line.split()
                if len(fields) > 1 and fields[0] in _HOSTS_ADDRESSES:  # hosts-file format: `0.0.0.0 name ...`
                    entries = fields[1:]
                else:  # one domain or URL; several words on a line are no entry
                    entries = fields if len(fields) == 1 else []
                good = sum(self.add_entry(name, entry) for entry in entries)
                counts["entries"] += good
                if good < max(len(entries), 1):
                    counts["skipped"] += max(len(entries), 1) - good
                    first_bad = first_bad or f"{path}:{number}: {line[:80]!r}"
        if counts["skipped"]:
            log.warning(
                "blocklist %s: skipped %d entries that are no domain or URL (first: %s)",
                name,
                counts["skipped"],
                first_bad,
            )

    def match(self, url: ParsedUrl) -> str | None:
        """The name of the first list that blocks this URL, or None."""
        for host in url.hosts():
            name = self.domains.get(host)
            if name is not None:
                return name
            for prefix, name in self.urls.get(host, ()):
                if url.path == prefix or url.path.startswith(prefix + "/"):
                    return name
        return None


def read_word_list(path: str | Path) -> list[tuple[str, ...]]:
    """Words or phrases, one a line (`#` comments, blank lines skipped), each as its URL words."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"word list not found: {path}")
    entries = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and (words := tuple(url_words(line))):
            entries.append(words)
    return entries


def list_sources(blocklist: list[str], ut1: str | None, categories: list[str]) -> list[tuple[str, Path]]:
    """(list name, file) for every blocklist file: stems of line files, UT1 categories."""
    sources: list[tuple[str, Path]] = []
    for file in blocklist:
        path = Path(file)
        if not path.is_file():
            raise ConfigError(f"blocklist not found: {path}")
        sources.append((path.name.split(".")[0] or path.name, path))
    if categories and not ut1:
        raise ConfigError("--categories picks UT1 categories: give the UT1 folder with --ut1 DIR")
    if ut1:
        root = Path(ut1)
        if not root.is_dir():
            raise ConfigError(f"UT1 folder not found: {root}")
        available = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not categories:
            raise ConfigError(f"--ut1 needs --categories (available in {root}: {', '.join(available) or 'none'})")
        for category in categories:
            files = [root / category / kind for kind in ("domains", "urls") if (root / category / kind).is_file()]
            if not files:
                raise ConfigError(
                    f"UT1 category `{category}` has no domains or urls file in {root}"
                    f" (available: {', '.join(available) or 'none'})"
                )
            sources.extend((category, file) for file in files)
    stems = [name for name, _ in sources[: len(blocklist)]]
    clash = next((n for n in stems if stems.count(n) > 1 or n in categories), None)
    if clash is not None:
        raise ConfigError(
            f"two blocklists are named `{clash}` (a file's stem or a UT1 category names a list); rename one"
        )
    return sources


_CACHE: dict[tuple, Blocklists] = {}


def load_blocklists(sources: list[tuple[str, Path]]) -> Blocklists:
    """All blocklists, read once per process for the same files."""
    key = tuple((name, *storage.fingerprint(path)) for name, path in sources)
    if key not in _CACHE:
        lists = Blocklists()
        for name, path in sources:
            lists.add_file(name, path)
        _CACHE.clear()  # one set of lists per worker at a time; a UT1 list holds millions of hosts
        _CACHE[key] = lists
    return _CACHE[key]


def _digest(path: Path) -> str:
    sha = hashlib.sha1()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# The stage


@dataclass
class UrlFilterStage(StageOptions):
    """Reject documents by their `url`: blocklists first, then banned words."""

    blocklist: list[str] = option(
        default_factory=list,
        path=True,
        cli={"nargs": "+", "default": [], "metavar": "FILE"},
        help="files with one domain or URL per line (# comments, hosts-file lines allowed); reason"
        " url.blocklist:<file stem>",
    )
    ut1: str | None = option(
        None,
        path=True,
        cli={"metavar": "DIR"},
        help="a UT1-style folder of categories (<DIR>/<category>/domains, urls)",
    )
    categories: list[str] = option(
        default_factory=list,
        cli={"nargs": "+", "default": [], "metavar": "CATEGORY"},
        help="the UT1 categories to block, e.g. adult gambling phishing; reason url.blocklist:<category>",
    )
    banned_words: str | None = option(
        None,
        path=True,
        cli={"metavar": "FILE"},
        help="file of words or phrases (one a line) that reject a URL containing them as whole words",
    )
    soft_banned_words: str | None = option(
        None,
        path=True,
        cli={"metavar": "FILE"},
        help="file of words of which --soft-word-threshold distinct ones reject a URL",
    )
    soft_word_threshold: int = option(2, help="distinct soft-banned words that reject a URL (default 2, as datatrove)")
    banned_subwords: str | None = option(
        None,
        path=True,
        cli={"metavar": "FILE"},
        help="file of strings that reject a URL containing them once punctuation is removed",
    )
    missing_url: Literal["reject", "keep"] = option(
        "reject",
        help="a document without a URL: reject it (url.missing) or keep it, counted in stats (default: reject)",
    )
    url_field: str = option("url", cli={"metavar": "COLUMN"}, help="the column that holds the URL (default: url)")

    name = "url-filter"

    def __post_init__(self) -> None:
        self.blocklist = [str(p) for p in self.blocklist]
        self.ut1 = str(self.ut1) if self.ut1 else None
        self.categories = list(self.categories)
        if self.missing_url not in ("reject", "keep"):
            raise ConfigError(f"missing_url must be reject or keep, got {self.missing_url!r}")
        if self.soft_word_threshold < 1:
            raise ConfigError(f"--soft-word-threshold must be at least 1, got {self.soft_word_threshold}")
        self._sources = list_sources(self.blocklist, self.ut1, self.categories)
        self._banned = read_word_list(self.banned_words) if self.banned_words else []
        self._soft = read_word_list(self.soft_banned_words) if self.soft_banned_words else []
        subwords = read_word_list(self.banned_subwords) if self.banned_subwords else []
        self._subwords = sorted({"".join(words) for words in subwords})
        if not (self._sources or self._banned or self._soft or self._subwords):
            raise ConfigError(
                "url-filter has nothing to filter by: give --blocklist, --ut1 with --categories, --banned-words,"
                " --soft-banned-words or --banned-subwords"
            )
        self._banned_single = frozenset(w[0] for w in self._banned if len(w) == 1)
        self._banned_phrases = [" ".join(w) for w in self._banned if len(w) > 1]
        self._soft_terms = frozenset(" ".join(w) for w in self._soft)  # distinct words (or phrases)
        self._subword_regex = re.compile("|".join(map(re.escape, self._subwords))) if self._subwords else None

    def finalize(self, manifest: dict[str, Any]) -> None:
        """The manifest's `blocklists`: entries read and skipped per list."""
        tally = Blocklists(index=False)
        for name, path in self._sources:
            tally.add_file(name, path)
        manifest["blocklists"] = tally.sizes

    def versions(self) -> dict[str, str]:
        files = [(f"blocklist:{name}:{path.name}", path) for name, path in self._sources]
        for kind in ("banned_words", "soft_banned_words", "banned_subwords"):
            if getattr(self, kind):
                files.append((kind, Path(getattr(self, kind))))
        return {label: _digest(path) for label, path in files}

    def banned_reason(self, url: str) -> str | None:
        """The banned-word reason for a URL, or None."""
        words = url_words(url)
        if self._banned_single and not self._banned_single.isdisjoint(words):
            return "url.banned_word"
        if self._banned_phrases:
            joined = f" {' '.join(words)} "
            if any(f" {phrase} " in joined for phrase in self._banned_phrases):
                return "url.banned_word"
        if self._soft_terms:
            joined, present = f" {' '.join(words)} ", set(words)
            found = sum(1 for term in self._soft_terms if (f" {term} " in joined if " " in term else term in present))
            if found >= self.soft_word_threshold:
                return "url.soft_banned_words"
        if self._subword_regex is not None and self._subword_regex.search(_squeeze(unquote(url))):
            return "url.banned_subword"
        return None

    def reason(self, url: object, lists: Blocklists | None) -> str | None:
        """Why a URL is rejected (`url.missing` for none), or None to keep it."""
        import pandas as pd

        if not isinstance(url, str):
            return "url.missing" if url is None or pd.isna(url) else "url.malformed"
        if not url.strip():
            return "url.missing"
        parsed = parse_url(url)
        if parsed is None:
            return "url.malformed"
        if lists is not None and (name := lists.match(parsed)) is not None:
            return f"url.blocklist:{name}"
        return self.banned_reason(url)

    def process(self, docs: pd.DataFrame) -> Batch:
        import pandas as pd

        lists = load_blocklists(self._sources) if self._sources else None
        if self.url_field in docs.columns:
            urls = docs[self.url_field].tolist()
        else:
            log.warning("url-filter: no `%s` column in a partition of %d documents", self.url_field, len(docs))
            urls = [None] * len(docs)
        stats: Counter = Counter()
        reasons: list[str | None] = []
        for url in urls:
            reason = self.reason(url, lists)
            if reason == "url.missing" and self.missing_url == "keep":
                stats["url.missing"] += 1
                reason = None
            reasons.append(reason)
        reason_series = pd.Series(reasons, index=docs.index, dtype=object)
        keep = reason_series.isna().to_numpy()
        return Batch(
            n_in=len(docs), kept=docs[keep], rejected=reject(docs[~keep], reason_series[~keep]), stats=dict(stats)
        )


STAGES = (
    Stage(
        "url-filter",
        UrlFilterStage,
        help="reject web documents by URL: domain/URL blocklists (line files, UT1 categories) and banned words",
        description="Reject documents whose url is on a blocklist (one domain or URL per line, or UT1 category"
        " folders; a domain entry blocks its subdomains too) with the reason url.blocklist:<list>, or whose URL"
        " contains banned words (url.banned_word), enough soft-banned words (url.soft_banned_words) or a banned"
        " subword (url.banned_subword), as C4 and datatrove do. Unparseable URLs are url.malformed; documents"
        " without a URL are url.missing (or kept and counted with --missing-url keep).",
    ),
)
