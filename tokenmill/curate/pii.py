"""The `pii` stage: replace e-mail addresses, IP addresses and phone numbers by placeholders.

A transform, as BigScience's PII step and datatrove's PIIFormatter are: every document with a
text is kept; the manifest's `stats` count the documents touched (`pii.docs_touched`), the
replacements by kind (`pii.email`, `pii.ip_address`, `pii.phone`) and the candidates left in
place with why (`pii.skipped.private_ip`, `pii.skipped.version_number`, `pii.skipped.date`,
`pii.skipped.digit_count`). A document whose text is null is rejected (`pii.no_text`).

What is caught (docs/web-filters.md has examples of each):

- e-mail: `local@domain.tld` with an alphabetic top-level domain, any case (RFC 5322's unquoted
  local part); not `python@2.7`, `@handle`, `logo@2x.png`, quoted or obfuscated (`a [at] b`)
  forms, nor non-ASCII addresses.
- IP addresses: IPv4 in dotted-quad form and IPv6 (any compressed form, IPv4-mapped), checked
  with `ipaddress`. As datatrove does by default, only public (global) addresses are replaced;
  private, loopback, link-local, documentation and reserved ones stay (`keep_private_ips`).
  A dotted quad after a word like `version`, `v`, `release`, `build` or `section` is a version
  or section number, not an address; `999.1.1.1`, `1.2.3.4.5` and `01.02.03.04` are no address.
- phone numbers: international numbers written with `+` and a country code (8 to 16 digits with a `(0)`,
  with or without separators), North American numbers in a 3-3-4 grouping (`(202) 555-0143`,
  `202-555-0143`, `1-800-555-0199`, valid area and exchange codes), and national numbers with a
  trunk `0` and separators (`020 7946 0958`, `01 23 45 67 89`, 9 to 12 digits; `0049 30 1234567`
  with the `00` prefix, up to 16). Not numbers
  without any separator or `+` (they cannot be told from ids), dates (`2023-01-15`,
  `12.05.2021 1400`), times, prices, ISBNs.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenmill.curate.registry import Stage, option
from tokenmill.curate.stage import Batch, StageOptions, reject
from tokenmill.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

KINDS = ("email", "ip", "phone")
# The stats' name of each kind (as the placeholders name them).
STAT_NAMES = {"email": "email", "ip": "ip_address", "phone": "phone"}

REASONS = {"pii.no_text": "the text is missing (null)"}

_LOCAL = r"[a-z0-9!#$%&'*+/=?^_`{|}~\-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~\-]+)*"
_DOMAIN = r"(?:[a-z0-9](?:[a-z0-9\-]{0,61}[a-z0-9])?\.)+([a-z]{2,63})"
EMAIL = re.compile(rf"{_LOCAL}@{_DOMAIN}(?![\w\-])", re.IGNORECASE)
# `icon@2x.png`: image names of high-density assets, not addresses.
_FILE_SUFFIXES = frozenset({"png", "jpg", "jpeg", "gif", "svg", "webp", "bmp", "ico", "tif", "tiff", "avif"})

_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4 = re.compile(rf"(?<![\w.])(?:{_OCTET}\.){{3}}{_OCTET}(?!\w|\.\d)")
# Candidates only: `ipaddress` decides what is an IPv6 address (and `12:30:45` is none).
IPV6 = re.compile(r"(?<![\w:.])(?:[0-9a-f]{0,4}:){2,7}(?:(?:\d{1,3}\.){3}\d{1,3}|[0-9a-f]{1,4})?(?![\w:])", re.I)
# A dotted quad after one of these words is a version or section number.
_VERSION_WORD = re.compile(
    r"(?:^|[^\w])(?:versions?|ver|v|release|releases|build|rev|revision|firmware|patch|update|kernel|section"
    r"|sections|chapter|clause|article|figure|fig|table|step|§)\.?\s*$",
    re.IGNORECASE,
)

_END = r"(?!\w|[.\-/]\d)"  # not followed by more of a number
PHONE_INTERNATIONAL = re.compile(rf"(?<![\w+])\+[1-9]\d{{0,2}}(?:[ .\-]?\(?\d{{1,5}}\)?){{1,6}}{_END}")
PHONE_NANP = re.compile(rf"(?<![\w+\-.(/])(?:1[ .\-]?)?(?:\([2-9]\d\d\) ?|[2-9]\d\d[ .\-])[2-9]\d\d[ .\-]\d{{4}}{_END}")
PHONE_NATIONAL = re.compile(
    rf"(?<![\w+\-./])(?:\(0\d{{1,4}}\)|0\d{{1,4}})(?:[ \-/.]?\d{{2,8}})(?:[ \-.]\d{{2,8}}){{0,3}}{_END}"
)
# Cheap tests that a text may hold a match, each led by a literal character that `re` skips to
# quickly: most documents hold no PII, and the full patterns then never run. (A year after a
# space passes NANP's first test; its second, slower one runs only then.)
_NANP_HINTS = (re.compile(r"[ .\-]\d{4}(?!\d)"), re.compile(r"\d\d\d[ .\-]\d{4}(?!\d)"))
_NATIONAL_HINTS = (re.compile(r"0\d{0,4}\)?[ \-/.]\d\d"), re.compile(r"\(0\d{1,4}\)\d\d"))
HINTS: dict[re.Pattern, Callable[[str], object]] = {
    EMAIL: re.compile(r"@[A-Za-z0-9]").search,
    IPV4: re.compile(r"\.\d{1,3}\.\d{1,3}\.").search,
    IPV6: re.compile(r":[0-9A-Fa-f]{0,4}:").search,
    PHONE_INTERNATIONAL: re.compile(r"\+\d").search,
    PHONE_NANP: lambda text: _NANP_HINTS[0].search(text) and _NANP_HINTS[1].search(text),
    PHONE_NATIONAL: lambda text: _NATIONAL_HINTS[0].search(text) or _NATIONAL_HINTS[1].search(text),
}
_DATE_START = re.compile(r"\(?(?:\d{1,2}[./\-]\d{1,2}[./\-]\d{2,4}|\d{4}[./\-]\d{1,2}[./\-]\d{1,2})(?!\d)")
_NON_DIGIT = re.compile(r"\D")


def _digits(text: str) -> int:
    return len(_NON_DIGIT.sub("", text))


@dataclass
class PiiStage(StageOptions):
    """Replace e-mail addresses, IP addresses and phone numbers in `text` by placeholders."""

    kinds: list[str] = option(
        default_factory=lambda: list(KINDS),
        cli={"default": ",".join(KINDS), "metavar": "KIND,..."},
        parse=lambda value: [k.strip() for k in value.split(",") if k.strip()],
        help="what to replace, comma-separated: email, ip, phone (default: all three)",
    )
    email_placeholder: str = option("<EMAIL>", help="the text that replaces an e-mail address (default <EMAIL>)")
    ip_placeholder: str = option("<IP_ADDRESS>", help="the text that replaces an IP address (default <IP_ADDRESS>)")
    phone_placeholder: str = option("<PHONE>", help="the text that replaces a phone number (default <PHONE>)")
    keep_private_ips: bool = option(
        True,
        flag="--replace-private-ips",
        help="replace private, loopback, link-local and reserved IP addresses too (by default only public ones:"
        " the others identify nobody)",
    )

    name = "pii"

    def __post_init__(self) -> None:
        self.kinds = list(self.kinds)
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ConfigError(f"pii kinds must be some of {', '.join(KINDS)}, got {', '.join(self.kinds) or 'none'}")

    # ---- one kind each: (text, stats) -> text

    @staticmethod
    def _sub(pattern: re.Pattern, text: str, decide: Callable[[re.Match], str | None]) -> str:
        """Replace each match that `decide` maps to a text (a skipped one maps to None and stays)."""
        if not HINTS[pattern](text):
            return text

        def replace(match: re.Match) -> str:
            new = decide(match)
            return match.group(0) if new is None else new

        return pattern.sub(replace, text)

    def replace_emails(self, text: str, stats: Counter) -> str:
        def decide(match: re.Match) -> str | None:
            if match.group(1).lower() in _FILE_SUFFIXES:
                return None
            stats["pii.email"] += 1
            return self.email_placeholder

        return self._sub(EMAIL, text, decide)

    def _ip_decision(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address, stats: Counter) -> str | None:
        if self.keep_private_ips and not address.is_global:
            stats["pii.skipped.private_ip"] += 1
            return None
        stats["pii.ip_address"] += 1
        return self.ip_placeholder

    def replace_ips(self, text: str, stats: Counter) -> str:
        def decide_v6(match: re.Match) -> str | None:
            candidate = match.group(0)
            if not any(c.isdigit() for c in candidate):  # `::`, `a::b`: no address in prose
                return None
            try:
                address = ipaddress.IPv6Address(candidate)
            except ValueError:
                return None
            return self._ip_decision(address, stats)

        def decide_v4(match: re.Match) -> str | None:
            if _VERSION_WORD.search(match.string, max(0, match.start() - 24), match.start()):
                stats["pii.skipped.version_number"] += 1
                return None
            return self._ip_decision(ipaddress.IPv4Address(match.group(0)), stats)

        # IPv6 first: an IPv4-mapped address (`::ffff:8.8.4.4`) is one address, not an IPv4 in a tail.
        return self._sub(IPV4, self._sub(IPV6, text, decide_v6), decide_v4)

    def replace_phones(self, text: str, stats: Counter) -> str:
        def decide(match: re.Match, low: int, high: int, needs_separator: bool) -> str | None:
            candidate = match.group(0)
            if _DATE_START.match(candidate):
                stats["pii.skipped.date"] += 1
                return None
            if needs_separator and not any(c in candidate for c in " -./("):
                return None
            if not low <= _digits(candidate) <= high:
                stats["pii.skipped.digit_count"] += 1
                return None
            stats["pii.phone"] += 1
            return self.phone_placeholder

        text = self._sub(PHONE_INTERNATIONAL, text, lambda m: decide(m, 8, 16, False))
        text = self._sub(PHONE_NANP, text, lambda m: decide(m, 10, 11, False))
        # `0049 30 1234567`: the `00` international prefix in place of `+` allows a country code more.
        return self._sub(
            PHONE_NATIONAL, text, lambda m: decide(m, 9, 16 if m.group(0).lstrip("(").startswith("00") else 12, True)
        )

    def redact(self, text: str, stats: Counter) -> str:
        """The text with every kind asked for replaced; counts go to `stats`."""
        if "email" in self.kinds:
            text = self.replace_emails(text, stats)
        if "ip" in self.kinds:
            text = self.replace_ips(text, stats)
        if "phone" in self.kinds:
            text = self.replace_phones(text, stats)
        return text

    def process(self, docs: pd.DataFrame) -> Batch:
        import numpy as np

        stats: Counter = Counter()
        texts: list[object] = []
        missing = []
        for text in docs["text"].tolist():
            if not isinstance(text, str):
                texts.append(text)
                missing.append(True)
                continue
            counted = Counter()
            new = self.redact(text, counted)
            texts.append(new)
            missing.append(False)
            if new != text:
                stats["pii.docs_touched"] += 1
                for kind in KINDS:
                    if counted[f"pii.{STAT_NAMES[kind]}"]:
                        stats[f"pii.docs.{STAT_NAMES[kind]}"] += 1
            stats.update(counted)
        # bool even when empty: an empty object array would select columns, not rows.
        missing_mask = np.array(missing, dtype=bool)
        docs = docs.assign(text=texts)
        return Batch(
            n_in=len(docs),
            kept=docs[~missing_mask],
            rejected=reject(docs[missing_mask], "pii.no_text"),
            stats=dict(stats),
        )


def _report(manifest: dict, args) -> None:
    stats = manifest.get("stats", {})
    log.info(
        f"  replaced {stats.get('pii.email', 0)} e-mail addresses, {stats.get('pii.ip_address', 0)} IP addresses and"
        f" {stats.get('pii.phone', 0)} phone numbers in {stats.get('pii.docs_touched', 0)} documents"
    )


STAGES = (
    Stage(
        "pii",
        PiiStage,
        help="replace e-mail addresses, IP addresses and phone numbers by placeholders",
        description="Replace e-mail addresses, public IP addresses (IPv4 and IPv6) and phone numbers in the text by"
        " <EMAIL>, <IP_ADDRESS> and <PHONE>, as BigScience and datatrove do. Documents are kept; the stats count"
        " the documents touched, the replacements by kind and the look-alikes left in place (version numbers,"
        " dates, private addresses).",
        report=_report,
    ),
)
