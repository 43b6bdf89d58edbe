"""The whole path through the real CLI, as `make build-cache` and a pod run it: build the demo on the CPU
twin of vLLM 0.13's TPU runner, verify it in a fresh process, publish, fetch; and a damaged artifact fails."""

import json
import shutil

import pytest

from aotc.matrix import load_matrix
from aotc.plan import plan_entry

from ..conftest import run_aotc
from ..helpers.browser import Dom, dump_dom, screenshot
from .conftest import DEMO, DEMO_NAME, VERIFY_TRAFFIC

pytestmark = pytest.mark.slow

ENTRY = DEMO_NAME


@pytest.fixture(scope="module")
def built(demo_build):
    """The run's one demo build (tests/vllm_tpu/conftest.py: demo_build), already verified."""
    report = demo_build.report
    assert report["ok"] and report["planned"] == report["graphs_with_keys"]
    return demo_build.artifact


def test_build_writes_a_manifest_that_accounts_for_every_file(built):
    manifest = json.loads((built / "manifest.json").read_text())
    files = {f["path"] for f in manifest["files"]}
    on_disk = {p.relative_to(built / "cache").as_posix() for p in (built / "cache").rglob("*") if p.is_file()}
    assert files == on_disk and all(p.startswith("tp1_rank0/") for p in files)
    keys = {k for g in manifest["graphs"] for k in g["keys"]}
    assert keys == files  # every cache file is tied to a graph, every graph key is a file
    families = {g["family"] for g in manifest["graphs"]}
    assert {"backbone", "select_hidden_states", "compute_logits", "structured_decoding", "sample_from_logits",
            "gather_logprobs"} <= families
    assert manifest["fingerprint"] == json.loads(
        run_aotc("fingerprint", DEMO, "--entry", ENTRY, "--json").stdout)["fingerprint"]


def test_verify_covers_everything_and_says_it_did_not_load(built, demo_build):
    result = demo_build.verify  # `aotc verify --json` of the built artifact
    assert result["misses"] == 0 and result["traffic_requests"] >= VERIFY_TRAFFIC
    assert result["loadable"] is False and "not loadable" in result["verdict"]
    recorded = json.loads((built / "manifest.json").read_text())["verify"]
    assert recorded == {"misses": 0, "replayed_graphs": result["replayed_graphs"],
                        "traffic_requests": result["traffic_requests"], "loadable": False}


def test_publish_then_fetch_gives_the_same_bytes(built, tmp_path):
    store = tmp_path / "store"
    assert run_aotc("publish", built, "--store", store).returncode == 0
    dest = tmp_path / "xla-cache"
    proc = run_aotc("fetch", "--config", DEMO, "--entry", ENTRY, "--dest", dest, "--store", store)
    assert proc.returncode == 0, proc.stderr
    for f in json.loads((built / "manifest.json").read_text())["files"]:
        assert (dest / f["path"]).read_bytes() == (built / "cache" / f["path"]).read_bytes()


def test_verify_fails_naming_the_family_when_a_cache_file_is_missing(built, tmp_path):
    """One file gone of a capture graph (backbone) and one of a graph only the traffic sweep reached
    (runtime): verify names each with its family."""
    damaged = tmp_path / ENTRY
    shutil.copytree(built, damaged)
    manifest = json.loads((damaged / "manifest.json").read_text())
    victims = {family: next(g["keys"][0] for g in manifest["graphs"] if g["family"] == family and g["keys"])
               for family in ("backbone", "runtime")}
    for key in victims.values():
        (damaged / "cache" / key).unlink()
    proc = run_aotc("verify", damaged, "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["misses"] >= len(victims)
    missed = {(m["family"], m["key"]) for m in result["missed"]}
    assert set(victims.items()) <= missed, result["missed"]
    assert result["verdict"].startswith("NOT COVERED") and all(f in result["verdict"] for f in victims)


def test_an_artifact_that_failed_verify_is_not_published(built, tmp_path):
    damaged = tmp_path / ENTRY
    shutil.copytree(built, damaged)
    manifest = json.loads((damaged / "manifest.json").read_text())
    manifest["verify"] = {"misses": 2, "replayed_graphs": 17, "traffic_requests": 24, "loadable": False}
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    store = tmp_path / "store"
    proc = run_aotc("publish", damaged, "--store", store)
    assert proc.returncode == 1 and "2 cache miss(es)" in proc.stderr
    assert not (store / "manifests").exists() or not any((store / "manifests").rglob("*.json"))


def test_canary_names_a_deleted_graph_and_counts_recompiles_under_loadability(built, tmp_path, announce):
    """The stock `vllm serve` of vLLM 0.13 from a fetched artifact with one backbone file deleted: exit 1
    naming that graph; the graphs torch_xla 2.9.0 compiles again although cached are counted, never a pass."""
    import os

    from tests.helpers.canary import assert_kinds_served, canary, publish_copy, summary

    store, dropped = publish_copy(built, tmp_path, dict(os.environ), drop_family="backbone")
    code, doc, err = canary(DEMO, ENTRY, store, dict(os.environ), requests=8)
    announce(summary(doc))
    assert code == 1, err[-2000:]
    assert [name for name in doc["graphs_missing"] if name.startswith("backbone ")], doc["graphs_missing"]
    assert dropped in doc["startup"]["new_files"]
    assert doc["startup"]["rewritten_files"] and doc["loadable"] is not True
    assert [lim for lim in doc["limitations"] if lim.startswith("logprobs")]
    # under every request kind, nothing compiled after ready that the artifact lacks
    assert doc["serving"]["new_files"] == [] and doc["serving"]["misses"] == []
    assert_kinds_served(doc, lacking={"lora", "speculative", "images"})

def test_report_of_the_demo_build_shows_every_planned_family_compiled(built, chromium, announce, tmp_path):
    page = tmp_path / "report.html"
    proc = run_aotc("report", built, "--out", page)
    assert proc.returncode == 0, proc.stderr
    announce(f"screenshot: {screenshot(chromium, page, tmp_path / 'demo-report.png')}")
    dom = Dom(dump_dom(chromium, page).dom)
    assert dom.one("th", data_entry=ENTRY).text == ENTRY
    for family, planned in plan_entry(load_matrix(DEMO).entry(ENTRY)).families().items():
        cell = dom.one("td", data_entry=ENTRY, data_family=family)
        assert (cell.attrs["data-state"], cell.attrs["data-planned"], cell.attrs["data-missing"]) == \
            ("compiled", str(planned), "0"), cell.text
