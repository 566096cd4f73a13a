"""The pii stage: real-looking positives are replaced, look-alikes are left, everything is counted."""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from tokenmill.curate.pii import PiiStage
from tokenmill.curate.stage import run_stage
from tokenmill.errors import ConfigError


def redact(text: str, **options) -> tuple[str, Counter]:
    stats: Counter = Counter()
    return PiiStage(**options).redact(text, stats), stats


def docs(texts) -> pd.DataFrame:
    return pd.DataFrame({"id": [f"d{i}" for i in range(len(texts))], "text": texts, "source": "web"})


EMAILS = [
    "jane.doe@example.com",
    "John.Smith+newsletter@Mail.Example.co.uk",
    "first_last-1990@sub.domain.example.org",
    "INFO@EXAMPLE.DE",
    "o'reilly@example.ie",
    "user%tag@example.travel",
]
PUBLIC_IPS = [
    "8.8.8.8",
    "203.0.114.7",
    "151.101.1.69",
    "2001:4860:4860::8888",
    "2606:4700:4700::1111",
    "::ffff:8.8.4.4",
]
PHONES = [
    "(202) 555-0143",
    "202-555-0143",
    "202.555.0143",
    "1-800-555-0199",
    "+1 202 555 0143",
    "+1 (202) 555-0143",
    "+44 20 7946 0958",
    "+49 (0)30 1234567",
    "+33 1 23 45 67 89",
    "+91 98765 43210",
    "+4915112345678",
    "020 7946 0958",
    "01 23 45 67 89",
    "030 12345678",
    "(030)12345678",
    "(020) 7946 0958",
    "0049 30 1234567",
    "02-751-1500",
]


@pytest.mark.parametrize(
    ("sample", "placeholder", "stat"),
    [(e, "<EMAIL>", "pii.email") for e in EMAILS]
    + [(ip, "<IP_ADDRESS>", "pii.ip_address") for ip in PUBLIC_IPS]
    + [(p, "<PHONE>", "pii.phone") for p in PHONES],
)
def test_real_looking_pii_is_replaced(sample, placeholder, stat):
    text, stats = redact(f"Reach {sample}, or reply here.")
    assert text == f"Reach {placeholder}, or reply here."
    assert stats[stat] == 1


def test_pii_in_links_brackets_and_at_a_sentence_end():
    text, stats = redact(
        "Contact: mailto:press@example.com. Questions to help@example.org. From: Jane <jane@example.com>"
        ' (<a href="tel:+1-202-555-0143">call</a>)'
    )
    assert text == (
        'Contact: mailto:<EMAIL>. Questions to <EMAIL>. From: Jane <<EMAIL>> (<a href="tel:<PHONE>">call</a>)'
    )
    assert (stats["pii.email"], stats["pii.phone"]) == (3, 1)


@pytest.mark.parametrize(
    "text",
    [
        "pip install python@2.7 is not an address",
        "follow @example_handle and @another.one on social media",
        'an <img src="logo@2x.png"> and icon@3x.webp for retina screens',
        "write to jane [at] example [dot] com",
        "the pair user@localhost has no top-level domain",
    ],
)
def test_email_look_alikes_are_left(text):
    assert redact(text)[0] == text


def test_private_and_reserved_addresses_are_kept_unless_asked():
    text = "LAN 192.168.1.20, VPN 10.0.0.1, loopback 127.0.0.1 and ::1, link-local fe80::1ff:fe23:4567:890a."
    kept, stats = redact(text)
    assert kept == text
    assert stats["pii.skipped.private_ip"] == 5 and stats["pii.ip_address"] == 0
    replaced, stats = redact(text, keep_private_ips=False)
    assert replaced == (
        "LAN <IP_ADDRESS>, VPN <IP_ADDRESS>, loopback <IP_ADDRESS> and <IP_ADDRESS>, link-local <IP_ADDRESS>."
    )
    assert stats["pii.ip_address"] == 5


@pytest.mark.parametrize(
    "text",
    [
        "Upgrade to version 1.2.3.4 today.",
        "Firmware v2.10.0.1 and release 4.1.2.3 fix it.",
        "See section 3.2.1.4 of the standard.",
        "the build number v1.2.3.4 is printed",
        "999.1.1.1 and 256.300.1.1 are not addresses",
        "nor 1.2.3.4.5 or 01.02.03.04",
        "at 12:30:45 on Monday, the score was 3:2",
        "C++ uses std::vector and a::b",
    ],
)
def test_ip_look_alikes_are_left(text):
    assert redact(text, keep_private_ips=False)[0] == text


@pytest.mark.parametrize(
    "text",
    [
        "Published on 2023-01-15 and updated 12/05/2021.",
        "On 12.05.2021 1400 people came.",
        "The meeting starts at 10:30 and ends at 12:45:30.",
        "ISBN 978-3-16-148410-0 and ISBN 0-306-40615-2.",
        "It costs $1,234,567.89 or 1 234 567 EUR.",
        "Order id 12345678901234 and account 2025550143.",
        "Card 4111 1111 1111 1111 expired; SSN 123-45-6789 is fake.",
        "Scores: 3-1, 2-2, 10-7; years 1990-2001.",
        "The sum 5 +10 20 is 35.",
        "Local numbers like 555-0143 have no area code.",
    ],
)
def test_phone_look_alikes_are_left(text):
    assert redact(text)[0] == text


def test_kinds_and_placeholders_are_options():
    text = "Mail a@example.com from 8.8.8.8 or call +44 20 7946 0958."
    assert redact(text, kinds=["email"])[0] == "Mail <EMAIL> from 8.8.8.8 or call +44 20 7946 0958."
    assert redact(text, kinds=["ip", "phone"], ip_placeholder="[IP]", phone_placeholder="[TEL]")[0] == (
        "Mail a@example.com from [IP] or call [TEL]."
    )
    with pytest.raises(ConfigError, match="email, ip, phone"):
        PiiStage(kinds=["ssn"])


def test_process_keeps_documents_and_counts_what_it_replaced():
    frame = docs(
        [
            "Reach me at jo@example.net or +44 20 7946 0958.",
            "Nothing personal here, version 1.2.3.4.",
            None,
            "Servers 8.8.8.8 and 1.1.1.1, mail ops@example.org.",
        ]
    )
    out = PiiStage().process(frame)
    assert out.n_in == 4 and len(out.kept) == 3 and out.rejected["reason"].tolist() == ["pii.no_text"]
    assert out.kept["text"].tolist() == [
        "Reach me at <EMAIL> or <PHONE>.",
        "Nothing personal here, version 1.2.3.4.",
        "Servers <IP_ADDRESS> and <IP_ADDRESS>, mail <EMAIL>.",
    ]
    assert out.stats == {
        "pii.docs_touched": 2,
        "pii.docs.email": 2,
        "pii.docs.phone": 1,
        "pii.docs.ip_address": 1,
        "pii.email": 2,
        "pii.phone": 1,
        "pii.ip_address": 2,
        "pii.skipped.version_number": 1,
    }


def test_an_empty_partition_keeps_its_columns():
    # Upstream stages leave empty partitions (langid dropped every page of an archive); the
    # next stage must still find the document columns there.
    frame = docs(["mail ops@example.org"]).assign(url="https://example.org/").iloc[:0]
    out = PiiStage().process(frame)
    assert out.n_in == 0 and list(out.kept.columns) == list(frame.columns) and out.kept.empty


def test_real_web_articles(shared_data):
    """The 181 article bodies of the extraction benchmark hold 4 real e-mail addresses and 4 phone
    numbers (and Twitter handles, prices, dates and years that must stay)."""
    truth = json.loads((shared_data / "web" / "extraction" / "ground-truth.json").read_text())
    texts = [page["articleBody"] for page in truth.values()]
    out = PiiStage().process(docs(texts))
    stats = out.stats
    assert (stats["pii.email"], stats["pii.phone"], stats.get("pii.ip_address", 0)) == (4, 4, 0)
    redacted = "\n".join(out.kept["text"])
    for gone in (
        "info@givewell.org",
        "louise_matsakis@wired.com",
        "347-966-3806",
        "+49 (0)40 890 85-433",
        "02-751-1500",
    ):
        assert gone not in redacted
    for kept in ("(@NGRSenate)", "(@SpursOfficial)", "60,000₩", "01.01.2019"):
        assert kept in redacted


def test_real_prose_has_nothing_to_replace(shared_data):
    corpus = shared_data / "corpus"
    texts = [(corpus / name).read_text() for name in ("wikitext2_valid.txt", "tinyshakespeare.txt")]
    out = PiiStage(keep_private_ips=False).process(docs(texts))
    assert out.kept["text"].tolist() == texts
    assert not any(key in out.stats for key in ("pii.email", "pii.ip_address", "pii.phone"))


def test_stage_run_writes_counts_to_the_manifest(tmp_path, dask_client):
    frame = docs(["Reach me at jo@example.net.", "plain text", "call 202-555-0143"])
    (tmp_path / "in").mkdir()
    frame.to_parquet(tmp_path / "in" / "part-0.parquet", index=False)
    manifest = run_stage(PiiStage(), tmp_path / "in", tmp_path / "out", client=dask_client, progress=False)
    assert manifest["counts"] == {"in": 3, "kept": 3, "rejected": {}}
    assert manifest["stats"]["pii.docs_touched"] == 2
    kept = pd.read_parquet(tmp_path / "out" / "kept").sort_values("id")
    assert kept["text"].tolist() == ["Reach me at <EMAIL>.", "plain text", "call <PHONE>"]


def test_command_line(tmp_path, dask_client, capsys):
    from tokenmill.cli import main

    (tmp_path / "in").mkdir()
    docs(["LAN host 192.168.1.20, mail a@example.com", "call +44 20 7946 0958"]).to_parquet(
        tmp_path / "in" / "part-0.parquet", index=False
    )
    argv = ["curate", "pii", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--no-progress"]
    argv += ["--kinds", "ip,phone", "--replace-private-ips", "--scheduler", dask_client.scheduler.address]
    assert main(argv) == 0
    printed = capsys.readouterr().err
    assert "replaced 0 e-mail addresses, 1 IP addresses and 1 phone numbers in 2 documents" in printed
    kept = pd.read_parquet(tmp_path / "out" / "kept").sort_values("id")
    assert kept["text"].tolist() == ["LAN host <IP_ADDRESS>, mail a@example.com", "call <PHONE>"]
