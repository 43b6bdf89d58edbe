"""Every document of configs/k8s/*.yaml is valid against Kubernetes' own schema, offline.

kubernetes-validate ships the OpenAPI-derived JSON schemas of each Kubernetes release; strict mode also
refuses fields the schema does not define (a misspelt key that `kubectl apply` would drop or reject).
Checked against the oldest release the manifests rely on (1.29: the Job's `backoffLimitPerIndex` is on by
default from there) and the newest the package ships, so a field removed upstream shows up too.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from aotc.build import shard_entries
from aotc.cli import build_parser
from aotc.matrix import load_matrix
from tests.helpers.recipes import recipe_command_lines

from .conftest import CONFIGS, REPO

VERSIONS = ["1.29", kubernetes_validate.utils.latest_version()]
DOCUMENTS = [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
             for path in sorted((CONFIGS / "k8s").glob("*.yaml"))
             for doc in yaml.safe_load_all(path.read_text()) if doc]


def validate(doc: dict, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_every_manifest_file_is_checked():
    assert {name.split(":")[0] for name, _ in DOCUMENTS} == {p.name for p in (CONFIGS / "k8s").glob("*.yaml")}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name, doc", DOCUMENTS, ids=[name for name, _ in DOCUMENTS])
def test_manifest_matches_the_kubernetes_schema(name: str, doc: dict, version: str):
    validate(doc, version)


def serving_container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def misspelt_key(doc: dict) -> None:
    container = serving_container(doc)
    container["volumeMount"] = container.pop("volumeMounts")


def port_as_word(doc: dict) -> None:
    serving_container(doc)["ports"][0]["containerPort"] = "http"


def container_without_name(doc: dict) -> None:
    del serving_container(doc)["name"]


def env_as_mapping(doc: dict) -> None:
    container = serving_container(doc)
    container["env"] = {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize("break_it", [misspelt_key, port_as_word, container_without_name, env_as_mapping])
def test_a_broken_field_fails_validation(break_it):
    [(_, deployment)] = [(n, d) for n, d in DOCUMENTS if n == "serving.yaml:Deployment/vllm-qwen"]
    broken = copy.deepcopy(deployment)
    break_it(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken, VERSIONS[-1])


# --- the pod security policy a platform team's admission applies ---------------------------------------------
# Pod Security Standards "restricted" (non-root with a fixed UID, no privilege escalation, every capability
# dropped, seccomp RuntimeDefault, no host namespaces or ports), plus: a read-only root filesystem, requests and
# limits on every container, a sizeLimit on every emptyDir, hostPath volumes of type Directory mounted read-only.
# A pod may go beyond it only where its template's annotation says so, one `<container or volume>: <rule>: why`
# line per exception; an exception nothing needs is a violation too.

EXCEPTIONS = "aotc/pod-security-exceptions"
POD_SPEC_PATHS = {"Deployment": ("spec", "template"), "DaemonSet": ("spec", "template"), "Job": ("spec", "template"),
                  "CronJob": ("spec", "jobTemplate", "spec", "template")}


def pod_template(doc: dict) -> dict | None:
    path = POD_SPEC_PATHS.get(doc["kind"])
    if path is None:
        return None
    node = doc
    for key in path:
        node = node[key]
    return node


def exceptions(template: dict) -> set[tuple[str, str]]:
    text = template.get("metadata", {}).get("annotations", {}).get(EXCEPTIONS, "")
    lines = [line.split(":", 2) for line in text.splitlines() if line.strip()]
    assert all(len(parts) == 3 and parts[2].strip() for parts in lines), f"{EXCEPTIONS}: <name>: <rule>: why"
    return {(name.strip(), rule.strip()) for name, rule, _ in lines}


def effective(pod: dict, container: dict, key: str):
    """A securityContext field as the container runs it: its own value, else the pod's."""
    own = container.get("securityContext", {})
    return own[key] if key in own else pod.get("securityContext", {}).get(key)


def container_violations(pod: dict, container: dict) -> set[str]:
    context = container.get("securityContext", {})
    uid = effective(pod, container, "runAsUser")
    rules = {
        "root": effective(pod, container, "runAsNonRoot") is not True or not uid,
        "privileged": context.get("privileged") is True,
        "privilege-escalation": context.get("allowPrivilegeEscalation") is not False,
        "capabilities": context.get("capabilities", {}).get("drop") != ["ALL"]
                        or bool(context.get("capabilities", {}).get("add")),
        "seccomp": (effective(pod, container, "seccompProfile") or {}).get("type") not in ("RuntimeDefault",
                                                                                           "Localhost"),
        "writable-root": context.get("readOnlyRootFilesystem") is not True,
        "resources": resource_problem(container.get("resources", {})),
        "host-port": any("hostPort" in port for port in container.get("ports", [])),
    }
    return {rule for rule, broken in rules.items() if broken}


def resource_problem(resources: dict) -> bool:
    """cpu and memory requested and limited; an extended resource (google.com/tpu) requested as limited."""
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    extended = {k for k in {*requests, *limits} if "/" in k}
    return (not {"cpu", "memory"} <= requests.keys() or not {"cpu", "memory"} <= limits.keys()
            or any(requests.get(k) != limits.get(k) for k in extended))


def policy_violations(template: dict) -> set[tuple[str, str]]:
    """(container or volume name, rule) for each thing this pod template does beyond the policy."""
    pod = template["spec"]
    containers = pod.get("initContainers", []) + pod["containers"]
    found = {(c["name"], rule) for c in containers for rule in container_violations(pod, c)}
    found |= {("pod", ns) for ns in ("hostNetwork", "hostPID", "hostIPC") if pod.get(ns)}
    host_paths = set()
    for volume in pod.get("volumes", []):
        if "emptyDir" in volume and not volume["emptyDir"].get("sizeLimit"):
            found.add((volume["name"], "sizeLimit"))
        if "hostPath" in volume:
            host_paths.add(volume["name"])
            found.add((volume["name"], "hostPath"))
            if volume["hostPath"].get("type") != "Directory":  # a node the pod does not prepare itself
                found.add((volume["name"], "hostPath-create"))
    found |= {(c["name"], "hostPath-write") for c in containers for mount in c.get("volumeMounts", [])
              if mount["name"] in host_paths and not mount.get("readOnly")}
    return found


POD_TEMPLATES = [(name, pod_template(doc)) for name, doc in DOCUMENTS if pod_template(doc) is not None]


def test_every_workload_kind_is_checked():
    """A kind whose pods this file cannot find would slip past the policy test."""
    assert {doc["kind"] for _, doc in DOCUMENTS} <= {*POD_SPEC_PATHS, "ServiceAccount", "ConfigMap", "Service",
                                                     "Namespace"}


@pytest.mark.parametrize("name, template", POD_TEMPLATES, ids=[name for name, _ in POD_TEMPLATES])
def test_every_pod_meets_the_policy_or_says_why_not(name: str, template: dict):
    allowed = exceptions(template)
    found = policy_violations(template)
    assert found - allowed == set(), "beyond the policy without a stated exception"
    assert allowed - found == set(), "an exception nothing in the pod needs"


def serving_template(name: str = "serving.yaml:Deployment/vllm-qwen") -> dict:
    [template] = [t for n, t in POD_TEMPLATES if n == name]
    return copy.deepcopy(template)


def named(items: list[dict], name: str) -> dict:
    [item] = [i for i in items if i["name"] == name]
    return item


def set_security(container: dict, **fields) -> None:
    # a new dict: the manifests share one securityContext between containers (a YAML anchor)
    container["securityContext"] = {**container["securityContext"], **fields}


def root_server(pod: dict) -> None:
    set_security(named(pod["containers"], "vllm"), runAsUser=0, runAsNonRoot=False)


def writable_root(pod: dict) -> None:
    set_security(named(pod["initContainers"], "aotc-fetch"), readOnlyRootFilesystem=False)


def unbounded_scratch(pod: dict) -> None:
    named(pod["volumes"], "xla-cache")["emptyDir"] = {}


def server_without_limits(pod: dict) -> None:
    del named(pod["containers"], "vllm")["resources"]["limits"]


def node_cache_created_by_kubelet(pod: dict) -> None:
    named(pod["volumes"], "aotc-objects")["hostPath"]["type"] = "DirectoryOrCreate"


def server_writes_the_node_cache(pod: dict) -> None:
    named(pod["containers"], "vllm")["volumeMounts"].append({"name": "aotc-objects", "mountPath": "/objects"})


def capability_added(pod: dict) -> None:
    set_security(named(pod["containers"], "vllm"), capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]})


@pytest.mark.parametrize("break_it", [root_server, writable_root, unbounded_scratch, server_without_limits,
                                      node_cache_created_by_kubelet, server_writes_the_node_cache, capability_added])
def test_the_policy_check_catches_a_pod_that_strays(break_it):
    template = serving_template()
    break_it(template["spec"])
    assert policy_violations(template) - exceptions(template)


# --- TPU executables built on a CPU node pool (build-job-tpu-from-cpu.yaml) ----------------------------------------
# The pods hold no TPU (nothing requested, selected, tolerated), fit the CPU machine type they select, run an aotc
# command line aotc's own parser takes, and their shards together build every entry of the matrix the file's header
# mounts, each entry one the tpu-inference runner compiles for its TPU without one.

CPU_POOL_JOB = "build-job-tpu-from-cpu.yaml"
# GB of memory per vCPU of Compute Engine's predefined machine types, by their type name's middle word
GB_PER_VCPU = {"standard": 4, "highmem": 8, "highcpu": 1}
INSTANCE_TYPE = "node.kubernetes.io/instance-type"


def cpu_pool_job() -> dict:
    [job] = [doc for name, doc in DOCUMENTS if name.startswith(f"{CPU_POOL_JOB}:Job/")]
    return job


def mentions_tpu(node: object) -> list[str]:
    """Every key or value of a pod spec that asks for a TPU: google.com/tpu, the GKE TPU node labels."""
    text = yaml.safe_dump(node)
    return [word for word in ("google.com/tpu", "gke-tpu", "tpu-v") if word in text]


def test_the_cpu_pool_job_asks_for_no_tpu():
    pod = cpu_pool_job()["spec"]["template"]["spec"]
    scheduling = {key: pod.get(key) for key in ("nodeSelector", "affinity", "tolerations")}
    resources = [c["resources"] for c in pod.get("initContainers", []) + pod["containers"]]
    assert mentions_tpu(scheduling) == [] and mentions_tpu(resources) == []


def test_the_tpu_check_catches_a_tpu_request():
    """The check above would fail a pod that asked for a chip or a TPU node."""
    assert mentions_tpu({"requests": {"google.com/tpu": "4"}}) == ["google.com/tpu"]
    assert mentions_tpu({"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}) == ["gke-tpu", "tpu-v"]


def bytes_of(quantity: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    for unit, factor in sorted(units.items(), key=lambda u: -len(u[0])):
        if quantity.endswith(unit):
            return float(quantity[:-len(unit)]) * factor
    return float(quantity)


def test_the_cpu_pool_job_fits_the_machine_type_it_selects():
    pod = cpu_pool_job()["spec"]["template"]["spec"]
    family, kind, vcpus = pod["nodeSelector"][INSTANCE_TYPE].split("-")
    [container] = pod["containers"]
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    # the kubelet and the node's own daemons keep part of each node: a request of all of it never schedules
    assert float(requests["cpu"]) < int(vcpus) and bytes_of(requests["memory"]) < GB_PER_VCPU[kind] * int(vcpus) * 2**30
    assert bytes_of(requests["memory"]) <= bytes_of(limits["memory"]) < GB_PER_VCPU[kind] * int(vcpus) * 2**30
    assert float(requests["cpu"]) <= float(limits["cpu"]) <= int(vcpus)


def cpu_pool_matrix() -> tuple[Path, str]:
    """The matrix the Job's header puts in its ConfigMap, and that ConfigMap's name."""
    header = (CONFIGS / "k8s" / CPU_POOL_JOB).read_text()
    [(configmap, matrix)] = re.findall(r"create configmap (\S+) --from-file=matrix\.yaml=(\S+)", header)
    return REPO / matrix, configmap


def cpu_pool_build_lines(index: int) -> list:
    job = cpu_pool_job()
    return [line for line in recipe_command_lines(CPU_POOL_JOB, [job], {"JOB_COMPLETION_INDEX": str(index)})
            if line.argv[1] == "build"]


def test_the_cpu_pool_job_builds_verifies_then_publishes_and_serves_nothing():
    """A keys-only verify before each publish; no canary, which would serve traffic on a TPU this pool lacks."""
    lines = recipe_command_lines(CPU_POOL_JOB, [cpu_pool_job()], {"JOB_COMPLETION_INDEX": "0"})
    assert [line.argv[1] for line in lines] == ["build", "verify", "publish"]


def test_the_cpu_pool_job_mounts_the_matrix_its_header_names():
    _, configmap = cpu_pool_matrix()
    pod = cpu_pool_job()["spec"]["template"]["spec"]
    [line] = cpu_pool_build_lines(0)
    config = build_parser().parse_args(line.argv[1:]).config
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if config.startswith(m["mountPath"] + "/")]
    assert {"name": mount["name"], "configMap": {"name": configmap}} in pod["volumes"]


def test_the_cpu_pool_job_shards_cover_the_matrix():
    """Pod i's `aotc build --shard i/N`, parsed by aotc's own parser and sharded by its own rule: each entry in one
    shard, no shard idle."""
    matrix, _ = cpu_pool_matrix()
    entries = load_matrix(matrix, check_stack=False).entries
    shards = []
    for index in range(cpu_pool_job()["spec"]["completions"]):
        [line] = cpu_pool_build_lines(index)
        shards.append([e.name for e in shard_entries(entries, build_parser().parse_args(line.argv[1:]).shard)])
    built = [name for shard in shards for name in shard]
    assert sorted(built) == sorted(e.name for e in entries) and all(shards)


def test_every_entry_of_the_cpu_pool_matrix_builds_without_a_tpu():
    """device tpu, the runner that compiles for a TPU without one, a single-host slice (a multi-host one is refused
    on a host without a TPU), and a JAX-native model (the torchax path is refused there)."""
    from aotc.runners.tpu_inference.plan.rules import resolved_implementation
    from aotc.runners.tpu_inference.topology import topology_for

    matrix, _ = cpu_pool_matrix()
    for entry in load_matrix(matrix, check_stack=False).entries:
        assert entry.device == "tpu" and entry.backend.tpu_targets_on_cpu_host, entry.name
        assert topology_for(entry.accelerator).hosts == 1, entry.name
        config = CONFIGS / "models" / entry.model.split("/")[-1].lower() / "config.json"  # the committed copy
        [architecture] = json.loads(config.read_text())["architectures"]
        setting = entry.backend.runner_env(entry, environ={}).get("MODEL_IMPL_TYPE")
        assert resolved_implementation(setting, architecture) == "flax_nnx", entry.name


def test_the_cpu_pool_pod_sets_nothing_the_fingerprint_hashes():
    """Its env is the builders' (store, logs, libtpu's metadata query): an artifact built here fingerprints as a
    serving pod computes it."""
    matrix, _ = cpu_pool_matrix()
    [container] = cpu_pool_job()["spec"]["template"]["spec"]["containers"]
    hashed = {var for entry in load_matrix(matrix, check_stack=False).entries for var in entry.backend.env_vars}
    assert {e["name"] for e in container["env"]} & hashed == set()
