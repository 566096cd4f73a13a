"""The url-filter stage: blocklists in the common formats, banned words as C4 and datatrove use them."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from tokenmill.curate.stage import run_stage
from tokenmill.curate.url_filter import UrlFilterStage, normalize_host, parse_url, url_words
from tokenmill.errors import ConfigError


def docs(urls, column: str = "url") -> pd.DataFrame:
    frame = pd.DataFrame({"id": [f"d{i}" for i in range(len(urls))], "text": "page text", "source": "web"})
    frame[column] = urls
    return frame


def reasons(stage: UrlFilterStage, urls: list) -> list[str | None]:
    """The reason for each URL, None when kept."""
    out = stage.process(docs(urls))
    by_id = dict(zip(out.rejected["id"], out.rejected["reason"]))
    return [by_id.get(f"d{i}") for i in range(len(urls))]


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("url", "host", "path"),
    [
        ("https://user:secret@WWW.Example.COM.:8443/A/Page.html?q=1#top", "example.com", "/a/page.html"),
        ("http://news.example.co.uk/", "news.example.co.uk", ""),
        ("https://bücher.example/katalog", "xn--bcher-kva.example", "/katalog"),
        ("HTTPS://XN--BCHER-KVA.EXAMPLE/Katalog/", "xn--bcher-kva.example", "/katalog"),
        ("http://[2001:DB8::1]:8080/x", "2001:db8::1", "/x"),
        ("http://203.0.113.9/admin", "203.0.113.9", "/admin"),
        ("example.org/no-scheme", "example.org", "/no-scheme"),
        ("//cdn.example.net/lib.js", "cdn.example.net", "/lib.js"),
        ("http://www.com/", "www.com", ""),
    ],
)
def test_urls_are_normalised(url, host, path):
    parsed = parse_url(url)
    assert (parsed.host, parsed.path) == (host, path)


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "mailto:someone@example.com",
        "javascript:void(0)",
        "http://",
        "http://:80/x",
        "http://example.com:99999/",
        "http://exa mple.com/",
        "http://[::zz]/",
        "http://a..b.example/",
        "http://bad!host.example/",
    ],
)
def test_malformed_urls(url):
    assert parse_url(url) is None


def test_hosts_normalise_like_urls():
    assert normalize_host("WWW.Bücher.Example.") == "xn--bcher-kva.example"
    assert normalize_host("www.example.com") == normalize_host("EXAMPLE.com") == "example.com"
    assert normalize_host("bad host") is None


def test_line_blocklist_matches_domains_subdomains_and_urls(tmp_path):
    blocklist = write(
        tmp_path / "spam.txt",
        "# spam domains, one per line\n"
        "\n"
        "spam-example.com\n"
        "WWW.Casino-Example.NET.   # inline comment\n"
        "0.0.0.0 tracker.example.org ads.example.org\n"
        "https://www.example.net/free-stuff/\n"
        "bücher-spam.example\n"
        "this line has words\n"
        "bad_host!\n",
    )
    stage = UrlFilterStage(blocklist=[blocklist])
    urls = [
        "https://spam-example.com/",
        "http://deep.sub.spam-example.com:8080/x",
        "https://notspam-example.com/",  # a suffix, not a subdomain
        "https://casino-example.net/play",
        "http://tracker.example.org/pixel.gif",
        "http://example.org/",  # only the listed subdomains
        "https://example.net/free-stuff/today.html",
        "https://example.net/free-stuff",
        "https://example.net/free-stuffing",  # a path prefix only at a `/`
        "https://example.net/",
        "http://xn--bcher-spam-9db.example/",  # the same host in punycode
    ]
    assert reasons(stage, urls) == [
        "url.blocklist:spam",
        "url.blocklist:spam",
        None,
        "url.blocklist:spam",
        "url.blocklist:spam",
        None,
        "url.blocklist:spam",
        "url.blocklist:spam",
        None,
        None,
        "url.blocklist:spam",
    ]


def test_ut1_categories_are_chosen_by_name(tmp_path):
    root = tmp_path / "ut1"
    write(root / "adult" / "domains", "adult-example.com\nxxx-example.org\n")
    write(root / "adult" / "urls", "example.com/users/explicit\n")
    write(root / "gambling" / "domains", "casino-example.com\n")
    write(root / "phishing" / "domains", "paypal-login-example.com\n")
    stage = UrlFilterStage(ut1=str(root), categories=["adult", "gambling"])
    urls = [
        "https://www.adult-example.com/",
        "https://example.com/users/explicit/123",
        "https://example.com/users/other",
        "https://casino-example.com/slots",
        "https://paypal-login-example.com/",  # a category not picked
    ]
    assert reasons(stage, urls) == ["url.blocklist:adult", "url.blocklist:adult", None, "url.blocklist:gambling", None]
    with pytest.raises(ConfigError, match="available: adult, gambling, phishing"):
        UrlFilterStage(ut1=str(root), categories=["malware"])
    with pytest.raises(ConfigError, match="--categories"):
        UrlFilterStage(ut1=str(root))


def test_banned_words_are_whole_url_words(tmp_path):
    stage = UrlFilterStage(banned_words=write(tmp_path / "banned.txt", "# C4-style\nporn\nbad phrase\n"))
    urls = [
        "https://example.com/porn/videos",
        "https://example.com/Free-PORN_videos",  # any case; `_` and `-` separate words
        "https://example.com/pornography",  # a whole word only
        "https://example.com/a-bad-phrase-here",
        "https://example.com/bad/other/phrase",
        "https://example.com/%20porn%20",  # percent-decoded
    ]
    assert reasons(stage, urls) == [
        "url.banned_word",
        "url.banned_word",
        None,
        "url.banned_word",
        None,
        "url.banned_word",
    ]


def test_soft_banned_words_need_the_threshold(tmp_path):
    soft = write(tmp_path / "soft.txt", "hot\nsexy\ncams\n")
    stage = UrlFilterStage(soft_banned_words=soft)
    urls = ["https://example.com/hot-deals", "https://example.com/hot-sexy", "https://example.com/hot/hot/hot"]
    assert reasons(stage, urls) == [None, "url.soft_banned_words", None]  # distinct words count
    assert reasons(
        UrlFilterStage(soft_banned_words=soft, soft_word_threshold=3), ["https://hot.example/sexy-cams"]
    ) == ["url.soft_banned_words"]


def test_banned_subwords_match_inside_words(tmp_path):
    stage = UrlFilterStage(banned_subwords=write(tmp_path / "sub.txt", "xxx\nfree porn\n"))
    urls = [
        "https://superxxxvideos.example/",
        "https://free-porn.example/",
        "https://free.porn-example.com/",
        "https://example.com/",
    ]
    assert reasons(stage, urls) == ["url.banned_subword", "url.banned_subword", "url.banned_subword", None]


def test_blocklists_come_before_banned_words(tmp_path):
    stage = UrlFilterStage(
        blocklist=[write(tmp_path / "adult.txt", "porn-example.com\n")],
        banned_words=write(tmp_path / "words.txt", "porn\n"),
    )
    assert reasons(stage, ["https://porn-example.com/porn", "https://other.example/porn"]) == [
        "url.blocklist:adult",
        "url.banned_word",
    ]


def test_missing_and_malformed_urls_are_counted(tmp_path):
    blocklist = [write(tmp_path / "b.txt", "blocked.example\n")]
    urls = [None, "", "   ", "http://[broken/", "https://fine.example/"]
    rejecting = UrlFilterStage(blocklist=blocklist)
    assert reasons(rejecting, urls) == ["url.missing"] * 3 + ["url.malformed", None]
    keeping = UrlFilterStage(blocklist=blocklist, missing_url="keep")
    out = keeping.process(docs(urls))
    assert len(out.kept) == 4 and out.rejected["reason"].tolist() == ["url.malformed"]
    assert out.stats == {"url.missing": 3}
    no_column = keeping.process(docs(urls, column="link"))
    assert len(no_column.kept) == 5 and no_column.stats == {"url.missing": 5}
    other_column = UrlFilterStage(blocklist=blocklist, url_field="link")
    assert reasons_in(other_column, docs(["https://blocked.example/", "https://fine.example/"], column="link")) == [
        "url.blocklist:b",
        None,
    ]


def reasons_in(stage: UrlFilterStage, frame: pd.DataFrame) -> list[str | None]:
    out = stage.process(frame)
    by_id = dict(zip(out.rejected["id"], out.rejected["reason"]))
    return [by_id.get(i) for i in frame["id"]]


def test_configuration_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="nothing to filter"):
        UrlFilterStage()
    with pytest.raises(ConfigError, match="blocklist not found"):
        UrlFilterStage(blocklist=[str(tmp_path / "missing.txt")])
    write(tmp_path / "a" / "spam.txt", "x.example\n")
    write(tmp_path / "b" / "spam.txt", "y.example\n")
    with pytest.raises(ConfigError, match="two blocklists are named `spam`"):
        UrlFilterStage(blocklist=[str(tmp_path / "a" / "spam.txt"), str(tmp_path / "b" / "spam.txt")])
    with pytest.raises(ConfigError, match="at least 1"):
        UrlFilterStage(banned_words=write(tmp_path / "w.txt", "x\n"), soft_word_threshold=0)


def test_url_words_split_like_c4_and_datatrove():
    assert url_words("https://www.Free-Porn_site.com/Hot%20Girls/index.html") == [
        "https",
        "www",
        "free",
        "porn",
        "site",
        "com",
        "hot",
        "girls",
        "index",
        "html",
    ]


def warc_target_uris(path: Path) -> list[str]:
    with gzip.open(path, "rb") as file:
        data = file.read()
    return [m.decode() for m in re.findall(rb"^WARC-Target-URI: <?([^\r\n>]+)>?\r?$", data, re.M)]


def test_real_crawl_urls(shared_data, tmp_path, dask_client):
    """The target URLs of real Common Crawl and wget WARCs: all parse, and a blocklist of two of
    their domains rejects exactly the pages on those domains and their subdomains."""
    urls = sorted(
        {
            u
            for name in ("cc-main-2020-34-sample.warc.gz", "wget-sample-0000.warc.gz", "wget-sample-0001.warc.gz")
            for u in warc_target_uris(shared_data / "web" / "warc" / name)
        }
    )
    assert len(urls) > 40
    assert all(parse_url(u) is not None for u in urls)
    hosts = sorted({parse_url(u).host for u in urls})
    blocked = hosts[:2]
    (tmp_path / "in").mkdir()
    docs(urls).to_parquet(tmp_path / "in" / "part-0.parquet", index=False)
    lines = "\n".join(blocked) + "\nnot a domain\n"
    stage = UrlFilterStage(blocklist=[write(tmp_path / "picked.txt", lines)])
    manifest = run_stage(stage, tmp_path / "in", tmp_path / "out", client=dask_client, progress=False)
    expected = [u for u in urls if any(parse_url(u).host == h or parse_url(u).host.endswith("." + h) for h in blocked)]
    counts = manifest["counts"]
    assert counts["in"] == len(urls) == counts["kept"] + sum(counts["rejected"].values())
    assert counts["rejected"] == {"url.blocklist:picked": len(expected)}
    rejected = pd.read_parquet(tmp_path / "out" / "rejected")
    assert sorted(rejected["url"]) == sorted(expected)
    assert manifest["versions"]["blocklist:picked:picked.txt"]
    assert manifest["blocklists"] == {"picked": {"entries": 2, "skipped": 1}}


def test_an_edited_list_reruns_the_recipe_step(tmp_path):
    from tokenmill.pipelines.recipe import load_recipe
    from tokenmill.pipelines.step_graph import build_plan

    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    blocklist = tmp_path / "lists" / "spam.txt"
    write(blocklist, "spam.example\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "sources:\n  - {name: a, path: a.jsonl}\ncurate:\n"
        "  - stage: url-filter\n    options: {blocklist: [lists/spam.txt], missing_url: keep}\n  - stage: pii\n"
    )

    def fingerprints():
        return {s.name: s.fingerprint for s in build_plan(load_recipe(recipe), tmp_path / "w")}

    before = fingerprints()
    assert fingerprints() == before
    write(blocklist, "spam.example\nmore-spam.example\n")
    after = fingerprints()
    assert after["curate.a.url-filter"] != before["curate.a.url-filter"]
    assert after["curate.a.pii"] != before["curate.a.pii"]  # what depends on it
    assert after["ingest.a"] == before["ingest.a"]


def test_command_line(tmp_path, dask_client, capsys):
    from tokenmill.cli import main

    (tmp_path / "in").mkdir()
    urls = ["https://www.casino-example.com/", "https://fine.example/a", None, "https://tracker.example.org/p"]
    docs(urls).to_parquet(tmp_path / "in" / "part-0.parquet", index=False)
    write(tmp_path / "ut1" / "gambling" / "domains", "casino-example.com\n")
    blocklist = write(tmp_path / "ads.txt", "0.0.0.0 tracker.example.org\n")
    argv = ["curate", "url-filter", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")]
    argv += ["--blocklist", blocklist, "--ut1", str(tmp_path / "ut1"), "--categories", "gambling"]
    argv += ["--missing-url", "keep", "--scheduler", dask_client.scheduler.address, "--no-progress"]
    assert main(argv) == 0
    assert "url-filter: in 4, kept 2, rejected 2" in capsys.readouterr().err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["rejected"] == {"url.blocklist:ads": 1, "url.blocklist:gambling": 1}
    assert manifest["stats"] == {"url.missing": 1}
    assert manifest["config"]["categories"] == ["gambling"] and manifest["config"]["missing_url"] == "keep"


def test_hosts_with_edge_hyphens_are_hosts():
    """RFC 1123 forbids them, browsers and UT1 lists have them (`name-.blogspot.com`)."""
    assert parse_url("https://milfhunter-.blogspot.hk/").host == "milfhunter-.blogspot.hk"
