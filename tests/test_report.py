"""``aotc report`` rendered by a real headless Chromium: checks read the DOM the browser produced.

Builds here are real manifests from ``aotc.build.make_manifest`` over the real plan of demo entries,
with made-up cache files instead of compiles (tests/helpers/builds.py); the store is a real one,
filled by ``publish_artifacts``. The report of a real compiled demo build is in tests/vllm_tpu/test_e2e.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from aotc.fingerprint import diff_inputs, fingerprint_inputs
from aotc.plan import plan_entry
from aotc.publish import publish_artifacts
from aotc.store import human_size

from .conftest import run_aotc
from aotc.testing.artifacts import make_artifact, random_files
from .helpers.browser import Dom, dump_dom, screenshot
from .helpers.builds import demo_entries, write_demo_build


def report(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "report.html"
    proc = run_aotc("report", *args, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["report"] == str(out)
    return out


def render(chromium: str, page: Path, name: str, announce) -> Dom:
    """The browser's DOM of ``page``, and a screenshot kept beside it as the test's artifact."""
    announce(f"screenshot: {screenshot(chromium, page, page.with_name(f'{name}.png'))}")
    return Dom(dump_dom(chromium, page).dom)


def test_build_report_shows_every_entry_and_family_and_the_missing_graph(chromium, announce, tmp_path):
    artifacts = write_demo_build(tmp_path / "artifacts")
    dom = render(chromium, report(tmp_path, *map(str, artifacts)), "build-report", announce)
    complete, with_missing = demo_entries()
    first_family = plan_entry(with_missing).graphs[0].family
    for entry in (complete, with_missing):
        assert dom.one("th", data_entry=entry.name).text.startswith(entry.name)
        for family, planned in plan_entry(entry).families().items():
            assert dom.one("th", data_family=family).text == family
            cell = dom.one("td", data_entry=entry.name, data_family=family)
            assert cell.attrs["data-planned"] == str(planned)
            if entry is with_missing and family == first_family:
                assert cell.attrs["data-state"] == "missing" and cell.attrs["data-missing"] == "1"
                assert f"{planned - 1}/{planned} compiled" in cell.text and "1 missing" in cell.text
            else:
                assert cell.attrs["data-state"] == "compiled" and cell.attrs["data-missing"] == "0", cell.text
        assert dom.one("td", data_entry=entry.name, data_family="startup").attrs["data-state"] == "extra"
        assert dom.one("td", data_entry=entry.name, data_family="runtime").attrs["data-state"] == "runtime"
    assert [n.text for n in dom.find(data_verdict=True)] == ["NOT COVERED: 1 miss(es)"]
    canary = dom.one("table", id="canary-figures").text
    assert "12.5" in canary and "no canary run" in canary
    expected_diff = diff_inputs(fingerprint_inputs(complete), fingerprint_inputs(with_missing))
    assert [n.attrs["data-input"] for n in dom.find("tr", data_differs=True)] == expected_diff
    assert not dom.find("script")


def test_a_build_of_two_runners_is_one_grid_per_runner_with_only_its_own_families(tmp_path):
    """The page as written (no browser needed for its structure): a vllm-tpu build beside a toy-runner one."""
    from .test_toy_runner import MATRIX as TOY_MATRIX, toy

    vllm_tpu = write_demo_build(tmp_path / "artifacts")
    (tmp_path / "toy.yaml").write_text(TOY_MATRIX)
    built = json.loads(toy("build", tmp_path / "toy.yaml", "--out", tmp_path / "toy-out", "--json").stdout)
    [toy_plan] = json.loads(toy("plan", tmp_path / "toy.yaml", "--json").stdout)["entries"]
    out = tmp_path / "report.html"
    proc = toy("report", *vllm_tpu, tmp_path / "toy-out" / toy_plan["entry"], "--out", out)
    assert proc.returncode == 0 and built["entries"][0]["ok"], proc.stderr[-3000:]
    dom = Dom(out.read_text())
    expected = {"vllm-tpu": ([e.name for e in demo_entries()], {f for e in demo_entries()
                                                                for f in plan_entry(e).families()}),
                "toy": ([toy_plan["entry"]], {g["family"] for g in toy_plan["graphs"]})}
    assert [t.attrs["data-backend"] for t in dom.find("table", class_="matrix-grid")] == list(expected)
    for runner, (entries, planned) in expected.items():
        assert [n.attrs["data-entry"] for n in dom.find("th", data_entry=True, data_backend=runner)] == entries
        columns = {n.text for n in dom.find("th", data_family=True, data_backend=runner)}
        assert planned <= columns <= planned | {"startup", "runtime"}, (runner, columns - planned)


def test_user_data_is_text_never_markup(chromium, announce, tmp_path):
    hostile = '<img src=x onerror="document.title=1"></td></table><script>document.title=2</script>'
    artifact = make_artifact(tmp_path / "art", entry="model-a--len2048-tp1",
                             inputs={"model": hostile, "env": {"X": "<b>bold</b>"}})
    dom = render(chromium, report(tmp_path, str(artifact)), "escaped", announce)
    assert not dom.find("img") and not dom.find("script") and not dom.find("b")
    assert hostile in dom.one("tr", data_input="model").text
    assert "plan unavailable" in dom.one("th", data_entry="model-a--len2048-tp1").text


def synthetic_store(root: Path, entries: int = 1000) -> tuple[Path, dict]:
    """``entries`` entries sharing 40 file sets; every 10th has an older fingerprint with a file of its own."""
    base = datetime(2026, 11, 1, tzinfo=timezone.utc)
    dirs, objects, logical, old_only = [], {}, 0, 0
    for i in range(entries):
        name = f"model-{i:04d}--len2048-tp1"
        versions = [("new", random_files(3, seed=i % 40, low=64, high=512), base + timedelta(days=7, minutes=i))]
        if i % 10 == 0:
            versions.append(("old", random_files(1, seed=10_000 + i, prefix="old"), base + timedelta(hours=i % 24)))
        for revision, files, created in versions:
            dirs.append(make_artifact(root / "art", entry=name, files=files, created=created.isoformat(),
                                      inputs={"model": name, "revision": revision}))
            logical += sum(len(d) for d in files.values())
            objects.update({bytes(d): len(d) for d in files.values()})
            old_only += sum(len(d) for d in files.values()) if revision == "old" else 0
    store = root / "store"
    publish_artifacts([str(d) for d in dirs], str(store))
    return store, {"logical": logical, "distinct": sum(objects.values()), "old_only": old_only}


def test_store_report_of_1000_entries_renders_with_sizes_dedup_and_gc(chromium, announce, tmp_path):
    store, sizes = synthetic_store(tmp_path)
    page = report(tmp_path, "--store", str(store), "--keep", "1", "--min-age", "0")
    rendered = dump_dom(chromium, page)
    announce(f"1,000-entry store report: {page.stat().st_size} bytes, browser run {rendered.seconds:.2f} s "
             f"(start-up included); screenshot: {screenshot(chromium, page, tmp_path / 'store-report.png')}")
    dom = Dom(rendered.dom)
    rows = dom.find("tr", data_entry=True)
    assert len(rows) == 1000 and rows[0].attrs["data-entry"] == "model-0000--len2048-tp1"
    assert dom.one(id="dedup-ratio").text == f"{sizes['logical'] / sizes['distinct']:.2f}×"
    assert dom.one(id="gc-freed").text == human_size(sizes["old_only"])
    old_versions = 1000 // 10  # keep 1: every older fingerprint goes, and the one object only it named
    gc = dom.one("table", id="gc-summary").text
    assert f"manifests to delete {old_versions}" in gc and f"objects to delete {old_versions}" in gc
    assert len(dom.one("tr", data_entry="model-0010--len2048-tp1").text.split("(ref)")) == 2


@pytest.mark.parametrize("args, code, words", [
    (["--store", "{tmp}/store", "{tmp}"], 2, "not both"),
    (["{tmp}"], 2, "not an artifact directory"),
    (["--store", "{tmp}/nothing-here"], 3, "does not exist"),
    (["--store", "{tmp}", "--keep", "-1"], 2, "--keep >= 0"),
])
def test_bad_input_is_one_line_and_a_documented_exit_code(tmp_path, args, code, words):
    proc = run_aotc("report", *(a.format(tmp=tmp_path) for a in args), "--out", tmp_path / "r.html")
    assert proc.returncode == code, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("aotc: error:") and words in line
    assert not (tmp_path / "r.html").exists()


def test_ci_uploads_the_reports_beside_the_publish_outputs():
    import yaml

    from .conftest import CONFIGS

    [job] = yaml.safe_load((CONFIGS / "ci" / "github-actions.yaml").read_text())["jobs"].values()
    runs = [s.get("run", "") for s in job["steps"]]
    publish = next(i for i, s in enumerate(job["steps"]) if s.get("id") == "publish")
    report = next(i for i, run in enumerate(runs) if "aotc report --store" in run)
    assert publish < report and 'aotc report "$ARTIFACTS"/*/' in runs[report]
    upload = job["steps"][report + 1]
    assert upload["uses"].startswith("actions/upload-artifact") and "report" in upload["with"]["path"]
    assert "publish.json" in runs[report]


def test_a_canary_saved_beside_the_artifact_is_its_canary_and_another_fingerprints_is_not(tmp_path):
    """What `make build-cache` leaves: ``aotc canary --json > <artifact dir>.canary.json``."""
    from aotc.canary_verdict import CanaryResult
    from aotc.manifest import Manifest
    from aotc.report import build_report

    artifact = make_artifact(tmp_path / "art", entry="model-a--len2048-tp1")
    manifest = Manifest.load(artifact)
    beside = artifact.parent / f"{artifact.name}.canary.json"
    result = CanaryResult(entry=manifest.entry, runner="vllm-tpu", fingerprint=manifest.fingerprint, loadable=True,
                          requests=510, ready_seconds=33.0)
    beside.write_text(json.dumps(result.to_dict()))
    canary = build_report([artifact]).entries[0].canary
    assert canary == {"requests": 510, "compiles_at_startup": 0, "compiles_after_ready": 0, "ready_seconds": 33.0,
                      "verdict": result.verdict}
    beside.write_text(json.dumps({**result.to_dict(), "fingerprint": "0" * 64}))
    assert build_report([artifact]).entries[0].canary is None
    beside.write_text("{not json")
    assert build_report([artifact]).entries[0].canary is None
