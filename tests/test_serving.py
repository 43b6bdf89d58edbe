"""Serving recipes keep their contract: Kubernetes and CI files, fetch --optional, the completeness check."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aotc.fingerprint import fingerprint_entry
from aotc.fingerprint import entry_kv_blocks
from aotc.kv import KvNotSized
from aotc.matrix import load_matrix
from aotc.server import serve_command

from .conftest import CONFIGS, REPO, run_aotc
from aotc.testing.artifacts import make_artifact

RECIPES = sorted((CONFIGS / "k8s").glob("*.yaml")) + sorted((CONFIGS / "ci").glob("*.yaml"))
DEMO = CONFIGS / "demo.yaml"
DEMO_ENTRY = "tiny-llama--len128-seqs8-tok64-tp1"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((CONFIGS / name).read_text()) if d]


def kind(name: str, kind_: str) -> list[dict]:
    return [d for d in docs(name) if d["kind"] == kind_]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


@pytest.fixture(scope="module")
def pod() -> dict:
    [deployment] = kind("k8s/serving.yaml", "Deployment")
    return deployment["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def settings() -> dict:
    [config] = [c for c in kind("k8s/serving.yaml", "ConfigMap") if c["metadata"]["name"] == "aotc-settings"]
    return config["data"]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipes_parse(path: Path):
    assert [d for d in yaml.safe_load_all(path.read_text()) if d]


# --- the serving Deployment -----------------------------------------------------------------------


def test_init_container_fetches_into_the_cache_vllm_reads(pod):
    [init], [vllm] = pod["initContainers"], pod["containers"]
    command = init["command"]
    assert command[:2] == ["aotc", "fetch"] and "--optional" in command
    dest = option(command, "--dest")
    assert env_of(vllm)["VLLM_XLA_CACHE_PATH"]["value"] == dest
    shared = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}.items() & \
             {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}.items()
    [(volume, mount)] = [(n, p) for n, p in shared if dest.startswith(p.rstrip("/") + "/")]
    # fetch swaps dest by rename, which a mount point refuses: dest must be below the mount
    assert dest != mount
    assert "emptyDir" in named(pod["volumes"], volume)  # the pod's own, bounded by its sizeLimit


def named(items: list[dict], name: str) -> dict:
    [item] = [i for i in items if i["name"] == name]
    return item


def test_init_container_has_a_deadline_and_a_node_cache(pod):
    [init], [vllm] = pod["initContainers"], pod["containers"]
    assert float(option(init["command"], "--deadline")) > 0  # a stalled store cannot hold the pod
    cache_dir = env_of(init)["AOTC_CACHE_DIR"]["value"]
    [mount] = [m for m in init["volumeMounts"] if m["mountPath"] == cache_dir]
    volume = named(pod["volumes"], mount["name"])["hostPath"]
    # shared by every pod on the node: fetch, the one container that fills it, mounts it; vLLM does not
    assert not mount.get("readOnly") and mount["name"] not in {m["name"] for m in vllm["volumeMounts"]}
    # the node is prepared for it (type Directory): the same path, given to the user fetch runs as
    assert volume["type"] == "Directory"
    [prepare] = kind("k8s/node-cache.yaml", "DaemonSet")
    spec = prepare["spec"]["template"]["spec"]
    [chown] = spec["initContainers"]
    assert named(spec["volumes"], chown["volumeMounts"][0]["name"])["hostPath"]["path"] == volume["path"]
    user = pod["securityContext"]
    assert chown["command"] == ["chown", f"{user['runAsUser']}:{user['runAsGroup']}", chown["volumeMounts"][0]["mountPath"]]


def test_store_matrix_and_policy_come_from_kubernetes(pod):
    [init], [vllm] = pod["initContainers"], pod["containers"]
    env = env_of(init)
    assert env["AOTC_STORE"]["valueFrom"]["configMapKeyRef"]["name"] == "aotc-settings"
    assert env["AOTC_REQUIRE"]["value"] in ("0", "1")
    assert env_of(vllm)["AOTC_GUARD"]["value"] in ("1", "strict")
    matrix = option(init["command"], "--config")
    [mount] = [m for m in init["volumeMounts"] if matrix.startswith(m["mountPath"] + "/")]
    assert {"name": mount["name"], "configMap": {"name": "aotc-matrix"}} in pod["volumes"]
    [account] = kind("k8s/serving.yaml", "ServiceAccount")
    assert account["metadata"]["name"] == pod["serviceAccountName"]
    assert "iam.gke.io/gcp-service-account" in account["metadata"]["annotations"]
    # Workload Identity only: no key file, no secret mounted or referenced
    spec = json.dumps(pod)
    assert not any(word in spec for word in ("GOOGLE_APPLICATION_CREDENTIALS", "secretKeyRef", '"secret"'))


def test_vllm_runs_the_engine_the_entry_was_built_for(pod, settings):
    entry = load_matrix(CONFIGS / "example-tpu.yaml").entry(settings["entry"])
    [init], [vllm] = pod["initContainers"], pod["containers"]
    command = vllm["command"]
    assert command[:3] == ["vllm", "serve", entry.model]
    expected = {"--max-model-len": entry.max_model_len, "--max-num-seqs": entry.max_num_seqs,
                "--max-num-batched-tokens": entry.max_num_batched_tokens,
                "--tensor-parallel-size": entry.tensor_parallel_size, "--dtype": entry.dtype,
                "--revision": entry.revision, "--block-size": entry.engine["block_size"]}
    assert {flag: option(command, flag) for flag in expected} == {k: str(v) for k, v in expected.items()}
    runner_env = {k: str(v) for k, v in entry.env.items()}
    for container in (init, vllm):  # fetch fingerprints with the engine's runner environment
        assert {k: env_of(container)[k]["value"] for k in runner_env if k in env_of(container)} == runner_env
    assert env_of(vllm)["AOTC_ACCELERATOR"]["value"] == entry.accelerator
    chips = entry.accelerator.split("-")[1]
    assert vllm["resources"]["limits"]["google.com/tpu"] == chips
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    assert "cloud.google.com/gke-tpu-topology" in pod["nodeSelector"]


# --- every serving Deployment runs the canary's server (aotc/server.py), both backends ----------------

SERVING = {"k8s/serving.yaml": ("example-tpu.yaml", "aotc-settings"),
           "k8s/serving-tpu-inference.yaml": ("example-tpu-jax.yaml", "aotc-settings-jax")}
# the tpu-inference pod's entry is checked against, and fingerprinted with, the JAX venv's stack
SERVED = [pytest.param(m, marks=pytest.mark.needs_jax) if "tpu-inference" in m else m for m in sorted(SERVING)]


def served(manifest: str):
    matrix, settings_name = SERVING[manifest]
    [deployment] = kind(manifest, "Deployment")
    [config] = [c for c in kind(manifest, "ConfigMap") if c["metadata"]["name"] == settings_name]
    entry = load_matrix(CONFIGS / matrix).entry(config["data"]["entry"])
    return entry, deployment["spec"]["template"]["spec"]


def built_kv_blocks(entry, server_command: list[str]) -> int:
    """The KV block count a build of the entry pins: the matrix's or vllm-tpu's rule; one the stack sizes on the
    TPU (tpu-inference) cannot be sized here, and the manifest carries the count such a build recorded."""
    try:
        return entry_kv_blocks(entry, size=False)
    except KvNotSized:
        return int(option(server_command, "--num-gpu-blocks-override"))


def plain_env(container: dict) -> dict[str, str]:
    return {name: e["value"] for name, e in env_of(container).items() if "value" in e}


@pytest.mark.parametrize("manifest", SERVED)
def test_pod_runs_the_stock_server_the_canary_runs(manifest):
    entry, pod = served(manifest)
    [init], [vllm] = pod["initContainers"], pod["containers"]
    command = vllm["command"]
    expected = serve_command(entry, option(init["command"], "--dest"), int(option(command, "--port")),
                             host=option(command, "--host"), guard=None, kv_blocks=built_kv_blocks(entry, command))
    assert command == ["vllm", *expected.argv[1:]]  # same flags, KV block count included
    env = plain_env(vllm)
    assert {k: env.get(k) for k in expected.env} == expected.env  # None: must be unset
    assert env["AOTC_GUARD"] in ("1", "strict")


@pytest.mark.parametrize("manifest", SERVED)
def test_init_container_fingerprints_what_the_server_runs(manifest):
    """fetch in the init container (no runner venv there) computes the engine container's fingerprint."""
    entry, pod = served(manifest)
    [init], [vllm] = pod["initContainers"], pod["containers"]
    kv = built_kv_blocks(entry, vllm["command"])
    assert fingerprint_entry(entry, plain_env(init), kv).digest == fingerprint_entry(entry, plain_env(vllm), kv).digest


# --- the sharded build Job ------------------------------------------------------------------------


def test_indexed_job_shards_match_completions():
    [job] = kind("k8s/build-job.yaml", "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert 1 <= spec["parallelism"] <= spec["completions"]
    [container] = spec["template"]["spec"]["containers"]
    script = "\n".join(container["command"])
    shards = re.findall(r"--shard \$\(JOB_COMPLETION_INDEX\)/(\d+)", script)
    assert shards == [str(spec["completions"])]
    assert script.index("aotc build") < script.index("aotc verify") < script.index("aotc publish")
    [check] = kind("k8s/build-job.yaml", "CronJob")
    [checker] = check["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert checker["command"][:2] == ["aotc", "completeness"]


# --- the CI workflow ------------------------------------------------------------------------------


def test_ci_verifies_before_it_publishes_and_outputs_the_uris():
    [workflow] = docs("ci/github-actions.yaml")
    [job] = workflow["jobs"].values()
    assert "self-hosted" in job["runs-on"]
    steps = [s.get("run", "") for s in job["steps"]]
    order = [next(i for i, run in enumerate(steps) if run.lstrip().startswith(word) or f"aotc {word}" in run)
             for word in ("aotc build", "verify", "publish")]
    assert order == sorted(order)
    publish = next(s for s in job["steps"] if s.get("id") == "publish")
    assert "$GITHUB_OUTPUT" in publish["run"] and "manifest_url" in publish["run"]
    assert "steps.publish.outputs" in json.dumps(job["outputs"])
    # a verify that fails must stop the job: no `if: always()` / continue-on-error between them
    verify_to_publish = job["steps"][order[1]:order[2] + 1]
    assert not any(s.get("continue-on-error") or "always()" in str(s.get("if", "")) for s in verify_to_publish)


@pytest.mark.parametrize("recipe", ["ci/github-actions.yaml", "ci/github-actions-tpu-from-cpu.yaml"])
def test_ci_runs_every_action_at_a_pinned_commit(recipe):
    [workflow] = docs(recipe)
    uses = [step["uses"] for job in workflow["jobs"].values() for step in job["steps"] if "uses" in step]
    assert uses and all(re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", action) for action in uses)


def test_the_cpu_runner_recipe_builds_tpu_targets_and_verifies_before_it_publishes():
    """A GitHub-hosted CPU runner: its matrix is TPU entries of the runner that compiles for a TPU without one."""
    [workflow] = docs("ci/github-actions-tpu-from-cpu.yaml")
    [job] = workflow["jobs"].values()
    assert "self-hosted" not in str(job["runs-on"])
    matrix = load_matrix(REPO / job["env"]["MATRIX"], check_stack=False)
    assert matrix.entries and all(e.device == "tpu" and e.backend.tpu_targets_on_cpu_host for e in matrix.entries)
    runs = [s.get("run", "") for s in job["steps"]]
    order = [next(i for i, run in enumerate(runs) if f"aotc {word}" in run) for word in ("build", "verify", "publish")]
    assert order == sorted(order) and "make env env-jax" in runs[next(i for i, r in enumerate(runs) if "make env" in r)]
    between = job["steps"][order[1]:order[2] + 1]
    assert not any(s.get("continue-on-error") or "always()" in str(s.get("if", "")) for s in between)


# --- fetch --optional: the init container's exit-code policy ---------------------------------------


def fetch(store: Path, dest: Path, *extra: str, env: dict | None = None):
    return run_aotc("fetch", "--config", DEMO, "--entry", DEMO_ENTRY, "--dest", dest, "--store", store, *extra,
                    env={"AOTC_REQUIRE": "", **(env or {})})


def published_demo(tmp_path: Path) -> Path:
    """A store holding a (synthetic) artifact under the demo entry's real fingerprint."""
    entry = load_matrix(DEMO).entry(DEMO_ENTRY)
    artifact = make_artifact(tmp_path / "art", entry=DEMO_ENTRY, fingerprint=fingerprint_entry(entry).digest)
    store = tmp_path / "store"
    proc = run_aotc("publish", artifact, "--store", store)
    assert proc.returncode == 0, proc.stderr
    return store


def test_missing_artifact_is_one_clear_line_and_exit_0_when_optional(tmp_path):
    (tmp_path / "store").mkdir()
    proc = fetch(tmp_path / "store", tmp_path / "dest", "--optional")
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert DEMO_ENTRY in line and "WITHOUT a compiled cache" in line and "AOTC_REQUIRE=1" in line


@pytest.mark.parametrize("extra, env", [(["--optional"], {"AOTC_REQUIRE": "1"}), ([], {})],
                         ids=["required-by-env", "not-optional"])
def test_missing_artifact_exits_3_when_required(tmp_path, extra, env):
    (tmp_path / "store").mkdir()
    proc = fetch(tmp_path / "store", tmp_path / "dest", *extra, env=env)
    assert proc.returncode == 3, proc.stderr
    assert "WITHOUT" not in proc.stderr


def test_bad_require_value_is_a_usage_error(tmp_path):
    proc = fetch(tmp_path, tmp_path / "dest", "--optional", env={"AOTC_REQUIRE": "maybe"})
    assert proc.returncode == 2 and "AOTC_REQUIRE" in proc.stderr


def test_optional_fetch_of_a_published_artifact_and_integrity_errors_still_fail(tmp_path):
    store = published_demo(tmp_path)
    proc = fetch(store, tmp_path / "dest", "--optional")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "dest" / "manifest.json").read_text())["entry"] == DEMO_ENTRY
    for obj in (store / "objects").rglob("*"):
        if obj.is_file():
            obj.write_bytes(obj.read_bytes()[:-1] + b"!")
    proc = fetch(store, tmp_path / "dest2", "--optional")
    assert proc.returncode == 4, proc.stderr


# --- the union of the shards ----------------------------------------------------------------------


def completeness(store: Path):
    return subprocess.run([sys.executable, "-m", "aotc.cli", "completeness", str(DEMO), "--store", str(store), "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def test_completeness_check_names_missing_entries_then_passes(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = completeness(tmp_path / "empty")
    assert proc.returncode == 3 and f"not published: {DEMO_ENTRY}" in proc.stderr
    proc = completeness(published_demo(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["complete"] is True


def test_ci_and_build_job_run_the_canary_after_publish():
    [workflow] = docs("ci/github-actions.yaml")
    [job] = workflow["jobs"].values()
    runs = [s.get("run", "") for s in job["steps"]]
    publish = next(i for i, run in enumerate(runs) if "aotc publish" in run)
    canary = next(i for i, run in enumerate(runs) if "aotc canary" in run)
    assert publish < canary and "|| exit 1" in runs[canary]
    [build] = kind("k8s/build-job.yaml", "Job")
    [container] = build["spec"]["template"]["spec"]["containers"]
    script = "\n".join(container["command"])
    assert script.index("aotc publish") < script.index("aotc canary") < script.index("exit $status")
