"""Documents' URLs (``transforms/curation/urls.py``): domains read off URLs, UT1-style blocklists
that block a domain and its subdomains, and one run over real web text that filters the
blocklisted documents before deduplication and ranks the domains in the manifest."""

import json

import pytest

from beam_pipeline.running import run
from tests.conftest import SHARED_DATA, require_shared_data
from transforms.classify import classify
from transforms.core.records import InputSpec, Record, RecordChunk
from transforms.core.vocabulary import URL_BLOCKLISTED, WRONG_TYPE
from transforms.curation.urls import (
    UrlConfig,
    blocked_by,
    load_blocklist,
    parse_blocklist,
    url_domain,
)
from transforms.io.manifest import summary_lines
from transforms.knowledge.documents import FilterBlockedUrls


@pytest.mark.parametrize(("url", "domain"), [
    ("https://WWW.Example.org:8080/a?b#c", "example.org"),
    ("http://news.bbc.co.uk/story", "news.bbc.co.uk"),
    ("example.org/page", "example.org"),
    ("https://www.com/", "www.com"),  # a host that is only "www." and a suffix keeps it
    ("http://[2001:db8::1]/x", "2001:db8::1"),
    ("http://[2001:db8::1/x", None),  # malformed
    ("", None),
    (None, None),
])
def test_a_url_names_its_host_without_port_case_or_www(url, domain):
    assert url_domain(url) == domain


def test_a_blocklist_blocks_a_domain_and_its_subdomains_only():
    blocklist = parse_blocklist(["# UT1 adult/domains", "", "blocked.org", "*.ads.net  # note",
                                 "www.Tracker.COM"])
    assert blocklist == {"blocked.org", "ads.net", "tracker.com"}
    assert blocked_by("shop.eu.blocked.org", blocklist) == "blocked.org"
    assert blocked_by("ads.net", blocklist) == "ads.net"
    assert blocked_by("tracker.com", blocklist) == "tracker.com"
    assert blocked_by("notblocked.org", blocklist) is None
    assert blocked_by("blocked.org.evil.com", blocklist) is None


def test_a_url_list_is_refused_with_its_line():
    with pytest.raises(ValueError, match=r"list.txt:2: 'blocked.org/path' is not a domain"):
        parse_blocklist(["ok.org", "blocked.org/path"], "list.txt")


def test_classification_keeps_the_url_or_a_mapped_field_and_rejects_a_wrong_type():
    spec = InputSpec(0, "x")
    routed = classify(Record("s", 0, 0, {"text": "a b c", "url": "http://a.org"}), spec)
    assert routed[1].url == "http://a.org"
    mapped = InputSpec(0, "x", fields=(("url", "link"),))
    assert classify(Record("s", 0, 0, {"text": "a", "link": "b.org"}), mapped)[1].url == "b.org"
    assert classify(Record("s", 0, 0, {"text": "a"}), mapped)[1].url is None  # url is optional
    assert classify(Record("s", 0, 0, {"text": "a b c"}), spec)[1].url is None
    assert classify(Record("s", 0, 0, {"text": "a", "url": 3}), spec).reason == WRONG_TYPE


def test_the_step_filters_blocklisted_documents_with_their_reason(tmp_path):
    listed = tmp_path / "block.txt"
    listed.write_text("blocked.org\n")
    step = FilterBlockedUrls(UrlConfig((str(listed),)))
    step.setup()
    records = (Record("s", 0, 0, "kept", url="https://ok.org/"),
               Record("s", 1, 0, "gone", url="http://shop.blocked.org/x"),
               Record("s", 2, 0, "no url"))
    outputs = list(step.process(RecordChunk("c", records)))
    assert [r.position for r in outputs[0].records] == [0, 2]
    filtered = outputs[1].value.table.to_pylist()
    assert [(r["position"], r["reason"]) for r in filtered] == [(1, URL_BLOCKLISTED)]
    assert "shop.blocked.org is blocked by the listed domain blocked.org" in filtered[0]["message"]
    load_blocklist.cache_clear()


# --------------------------------------------------------------------------- one real run

DOCUMENTS = 24


@pytest.fixture(scope="module")
def url_run(tmp_path_factory):
    """C4 pages with planted URLs: every third on a subdomain of a blocklisted domain, the rest
    on four clean sites or none, and a copy of a clean page under a blocklisted URL read before
    it (if the first pass of deduplication did not filter the blocklist, that copy would survive
    its cluster and the clean page would be dropped)."""
    require_shared_data()
    folder = tmp_path_factory.mktemp("urls")
    pages = [json.loads(line)["text"] for line in
             (SHARED_DATA / "pretrain" / "llamafactory_c4_demo.jsonl").open()][:DOCUMENTS]
    records = [{"text": pages[1], "link": "http://cdn.blocked.org/copy"}]
    for i, text in enumerate(pages):
        url = (f"https://shop.blocked.org/{i}" if i % 3 == 0
               else f"https://www.site{i % 4}.com/{i}" if i % 3 == 1 else None)
        records.append({"text": text, **({"link": url} if url else {})})
    (folder / "pages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "block.txt").write_text("# planted\nblocked.org\nunused.net\n")
    output = folder / "out"
    run([f"--input={folder / 'pages.jsonl'}#url=link", f"--output={output}",
         f"--url_blocklist={folder / 'block.txt'}", "--quality_filter=false",
         "--write_filtered=true"])
    return json.loads((output / "manifest.json").read_text()), records


def test_blocklisted_subdomains_are_filtered_before_deduplication(url_run):
    manifest, records = url_run
    blocked = [r for r in records if "blocked.org" in r.get("link", "")]
    assert manifest["records"]["balanced"]
    assert manifest["records"]["read"] == len(records)
    assert manifest["records"]["filtered"] == {URL_BLOCKLISTED: len(blocked)}
    # the clean page whose blocklisted copy came first is kept: nothing was a duplicate
    assert manifest["records"]["knowledge"] == len(records) - len(blocked)


def test_the_manifest_ranks_domains_by_tokens_kept_and_documents_dropped(url_run):
    manifest, records = url_run
    domains = manifest["domains"]
    with_url = [r["link"] for r in records if "link" in r]
    assert domains["documents"] == len(with_url)
    assert domains["blocklisted"] == domains["documents"] - domains["kept"]
    assert domains["distinct"] == len({url_domain(url) for url in with_url})
    assert [(e["domain"], e["dropped"]) for e in domains["top_dropped"]] == [
        ("shop.blocked.org", DOCUMENTS // 3), ("cdn.blocked.org", 1)]
    kept = domains["top_kept"]
    assert {e["domain"] for e in kept} == {"site1.com", "site2.com", "site3.com", "site0.com"}
    assert [e["tokens"] for e in kept] == sorted((e["tokens"] for e in kept), reverse=True)
    assert sum(e["tokens"] for e in kept) == domains["tokens"]
    assert sum(e["kept"] for e in kept) == domains["kept"] == sum(
        1 for r in records if "site" in r.get("link", ""))
    assert any(line.startswith(f"urls: {len(with_url)} documents from {domains['distinct']} "
                               "domains") for line in summary_lines(manifest))
