"""A stored manifest whose digest is valid but whose fields hold odd values is one `damaged_manifest`
warning for that manifest; ls, gc and report list the rest of the store and exit 0, in one line each."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from aotc.manifest import Manifest
from aotc.store.core import DIGEST_KEY
from aotc.testing.artifacts import random_files
from tests.conftest import run_aotc

QUIET = {"AOTC_NO_PROGRESS": "1"}
ODD_FP = "b" * 64
# (field, the JSON text it holds): numbers no filesystem has, text that is markup, times no reader can show
ODD = {
    "size_1e400": ("size", "1e400"),
    "size_10_to_the_400": ("size", str(10**400)),
    "created_rich_markup": ("created", '"[/x]"'),
    "created_year_0_in_utc": ("created", '"0001-01-01T00:00:00+01:00"'),
    "created_year_10000_in_utc": ("created", '"9999-12-31T23:59:59-01:00"'),
    "created_lone_surrogate": ("created", '"\\ud800"'),
    "created_newline": ("created", '"2026-01-01\\nsecond line"'),
}


def store_with_an_odd_manifest(url: str, good: Path, field: str, raw: str) -> Path:
    """``good`` published, plus a manifest for another entry that is ``good``'s with one odd field,
    written with the digest a publisher would have computed over what it holds."""
    assert run_aotc("publish", good, "--store", url).returncode == 0
    data = Manifest.load(good).to_dict() | {"entry": "odd--x", "fingerprint": ODD_FP, "created": "CREATED"}
    text = json.dumps(data, sort_keys=True)
    if field == "size":
        size = data["files"][0]["size"]
        text = text.replace(f'"size": {size}', f'"size": {raw}', 1)
    else:
        text = text.replace('"CREATED"', raw)
    parsed = json.loads(text)
    canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    path = Path(url) / "manifests" / "odd--x" / f"{ODD_FP}.json"
    path.parent.mkdir(parents=True)
    path.write_text(text[:-1] + f', "{DIGEST_KEY}": "{digest}"}}')
    return path


def only_warnings(stderr: str) -> list[str]:
    lines = stderr.strip().splitlines()
    assert all(line.startswith("aotc: warning: ") for line in lines), stderr
    return lines


@pytest.mark.parametrize("odd", ODD)
def test_an_odd_field_is_one_damaged_manifest_and_the_store_is_still_listed(local_url, artifacts, tmp_path, odd):
    good = artifacts(entry="good--x", files=random_files(2, seed=1))
    odd_path = store_with_an_odd_manifest(local_url, good, *ODD[odd])
    listed = run_aotc("ls", "--store", local_url, "--json", env=QUIET)
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    assert [e["name"] for e in doc["entries"]] == ["good--x"]
    [warning] = doc["warnings"]
    assert warning["kind"] == "damaged_manifest" and warning["url"].endswith(f"odd--x/{ODD_FP}.json"), warning
    assert len(only_warnings(listed.stderr)) == 1

    table = run_aotc("ls", "--store", local_url, env=QUIET)
    assert table.returncode == 0 and "good--x" in table.stdout, table.stderr
    assert len(only_warnings(table.stderr)) == 1

    report = run_aotc("report", "--store", local_url, "--out", tmp_path / "store.html", env=QUIET)
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "store.html").read_text(encoding="utf-8")
    assert "good--x" in page and f"odd--x/{ODD_FP}.json" in page  # the odd one is a warning on the page

    for gc in (["gc", "--dry-run"], ["gc", "--keep", "0", "--min-age", "0"]):
        proc = run_aotc(*gc, "--store", local_url, env=QUIET)
        assert proc.returncode == 0, proc.stderr
        assert any("gc deletes no objects" in line for line in only_warnings(proc.stderr))
    assert odd_path.exists()  # a reader deletes nothing
