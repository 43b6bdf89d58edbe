"""`aotc break-lease` removes a lease only when it can tell the holder is gone, says what it checked, and
removes a live one only with --force."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from aotc.store import ENV_STORE_ENDPOINT, Store
from tests.conftest import REPO, run_aotc
from tests.store.conftest import new_bucket, wait_for

QUIET = {"AOTC_NO_PROGRESS": "1"}


def test_a_running_gcs_lease_is_refused_unless_forced(gcs_server, proxy, artifacts):
    url = f"gs://{new_bucket(gcs_server)}/store"
    env = {ENV_STORE_ENDPOINT: proxy.url, "AOTC_GC_MIN_AGE_SECONDS": "0", **QUIET}
    assert run_aotc("publish", artifacts(), "--store", url, env=env).returncode == 0
    proxy.add("stall", match="manifests", method="DELETE", times=1000)  # gc holds its lease while a delete hangs
    gc = subprocess.Popen([sys.executable, "-m", "aotc.cli", "gc", "--keep", "0", "--store", url], cwd=REPO,
                          env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        store = Store.from_url(url, endpoint_url=gcs_server.url)
        wait_for(lambda: store.find("locks"), "the gc lease")
        refused = run_aotc("break-lease", "--store", url, "--json", env=env)
        assert refused.returncode == 1, refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith("aotc: refused to remove gc lease") and f"pid {gc.pid} on this host, is running" in line
        assert "--force" in line
        assert [d["holder"]["pid"] for d in json.loads(refused.stdout)["refused"]] == [gc.pid]
        assert store.find("locks")  # still there
        forced = run_aotc("break-lease", "--store", url, "--force", env=env)
        assert forced.returncode == 0 and "removed gc lease" in forced.stderr, forced.stderr
        assert not store.find("locks")
    finally:
        gc.kill()
        gc.wait()


def write_lease(store: Path, name: str, holder: dict, age: float = 0.0) -> Path:
    path = store / "locks" / f"gc-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": "gc", **holder}))
    if age:
        os.utime(path, (time.time() - age,) * 2)
    return path


def test_a_lease_whose_holder_cannot_be_checked_is_removed_only_past_its_ttl(local_url, artifacts):
    assert run_aotc("publish", artifacts(), "--store", local_url).returncode == 0
    elsewhere = {"pid": 1, "host": "another-node"}
    young = write_lease(Path(local_url), "young", elsewhere, age=60)
    old = write_lease(Path(local_url), "old", elsewhere, age=3600)
    proc = run_aotc("break-lease", "--store", local_url, env=QUIET)
    assert proc.returncode == 1, proc.stderr
    lines = sorted(proc.stderr.strip().splitlines())
    assert len(lines) == 2 and lines[0].startswith("aotc: refused") and lines[1].startswith("aotc: removed"), lines
    assert "younger than the gc lease TTL (900 s)" in lines[0] and "cannot be checked from here" in lines[0]
    assert "past the gc lease TTL" in lines[1]
    assert young.exists() and not old.exists()


def test_a_lease_whose_holder_on_this_host_has_exited_is_removed(local_url, artifacts):
    assert run_aotc("publish", artifacts(), "--store", local_url).returncode == 0
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lease = write_lease(Path(local_url), "dead", {"pid": int(gone.stdout), "host": os.uname().nodename})
    proc = run_aotc("break-lease", "--store", local_url, env=QUIET)
    assert proc.returncode == 0, proc.stderr
    assert f"pid {int(gone.stdout)} on this host, is not running" in proc.stderr
    assert not lease.exists()
