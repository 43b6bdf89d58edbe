"""Every document of configs/k8s/*.yaml is valid against Kubernetes' own schema, offline.

kubernetes-validate ships the OpenAPI-derived JSON schemas of each Kubernetes release; strict mode also
refuses fields the schema does not define (a misspelt key that `kubectl apply` would drop or reject).
Checked against the oldest release the manifests rely on (1.29: the Job's `backoffLimitPerIndex` is on by
default from there) and the newest the package ships, so a field removed upstream shows up too.
"""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml

from .conftest import CONFIGS

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
