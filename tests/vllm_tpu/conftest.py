"""Shared helpers for the vllm-tpu runner tests: demo entries, vLLM-derived plans, runner calls."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from ..conftest import CONFIGS, run_aotc, shared_across_workers

REPO = Path(__file__).resolve().parents[2]
TINY_LLAMA = REPO / "configs" / "models" / "tiny-llama"
RUNNER_TIMEOUT = 900

DEMO_ENTRY = {  # a whole matrix Entry (Entry.to_dict()): the protocol's Request checks it
    "name": "demo--len128-seqs8-tok64-tp1",
    "model_name": "demo",
    "model": str(TINY_LLAMA),
    "revision": "main",
    "runner": "vllm-tpu",
    "device": "cpu",
    "accelerator": "v6e-1",
    "dtype": "bfloat16",
    "max_model_len": 128,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 64,
    "tensor_parallel_size": 1,
    "engine": {"block_size": 16},
    "env": {"VLLM_TPU_BUCKET_PADDING_GAP": 0},
}


def demo_entry(**env) -> dict:
    entry = copy.deepcopy(DEMO_ENTRY)
    entry["env"].update(env)
    return entry


def vllm_plan(entry: dict) -> list[dict]:
    """capture_model's graphs for an entry, from vLLM's own padding functions."""
    from vllm.utils.math_utils import cdiv
    from vllm.v1.attention.backends.pallas import PallasAttentionBackend
    from vllm.v1.worker import tpu_model_runner as tmr

    max_reqs = max(entry["max_num_seqs"], tmr.MIN_NUM_SEQS)
    cfg = SimpleNamespace(model_config=SimpleNamespace(max_model_len=entry["max_model_len"]))
    page = PallasAttentionBackend.get_page_size(cfg)
    gap = int(entry["env"].get("VLLM_TPU_BUCKET_PADDING_GAP", 0))
    tokens = tmr._get_token_paddings(16, entry["max_num_batched_tokens"], gap)
    reqs = tmr._get_req_paddings(tmr.MIN_NUM_SEQS, max_reqs)
    backbone_reqs = min(PallasAttentionBackend.get_max_num_seqs(entry["max_model_len"], page), max_reqs)
    blocks = cdiv(entry["max_model_len"], page)

    plan = vllm_mm_plan(entry, tokens)
    plan += [{"family": "backbone", "shape": {"num_tokens": t, "num_reqs": backbone_reqs, "num_blocks": blocks}}
             for t in tokens]
    for t in tokens:
        for r in reqs:
            plan.append({"family": "select_hidden_states", "shape": {"num_tokens": t, "num_reqs": r}})
            if r >= min(t, max_reqs):  # the runner's early break
                break
    plan += [{"family": "compute_logits", "shape": {"num_reqs": r}} for r in reqs]
    plan += [{"family": "structured_decoding", "shape": {"num_reqs": r}} for r in reqs]
    plan += [{"family": "sample_from_logits", "shape": {"num_reqs": r, "all_greedy": g}}
             for r in reqs for g in (False, True)]
    plan += [{"family": "gather_logprobs", "shape": {"num_reqs": r}} for r in reqs]
    return plan


def vllm_mm_budget(entry: dict):
    """vLLM's own MultiModalBudget for an entry (what TPUModelRunner._precompile_mm_encoder loops over)."""
    from vllm.config import ModelConfig, SchedulerConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.v1.worker.utils import MultiModalBudget

    engine = entry.get("engine") or {}
    model = ModelConfig(model=entry.get("model_path") or entry["model"], max_model_len=entry["max_model_len"],
                        limit_mm_per_prompt=engine.get("limit_mm_per_prompt"), dtype=entry["dtype"])
    scheduler = SchedulerConfig(max_num_batched_tokens=entry["max_num_batched_tokens"],
                                max_num_seqs=entry["max_num_seqs"], max_model_len=entry["max_model_len"],
                                enable_chunked_prefill=engine.get("enable_chunked_prefill", True),
                                is_multimodal_model=True, is_encoder_decoder=False)
    return MultiModalBudget(model, scheduler, MULTIMODAL_REGISTRY)


def vllm_mm_plan(entry: dict, tokens: list[int]) -> list[dict]:
    """_precompile_mm_encoder's graphs, from vLLM's budget: per image count the encoder, then the input embedding
    at each token bucket holding that many images; the text-only embedding per token bucket. [] for a text
    model."""
    config = json.loads((Path(entry.get("model_path") or entry["model"]) / "config.json").read_text())
    if "vision_config" not in config:
        return []
    budget = vllm_mm_budget(entry)
    per_image = budget.max_tokens_by_modality["image"]
    plan = []
    for items in range(1, budget.max_items_per_batch_by_modality["image"] + 1):
        plan.append({"family": "mm_encoder", "shape": {"num_items": items}})
        plan += [{"family": "embed_inputs", "shape": {"num_tokens": t, "num_items": items}}
                 for t in tokens if t >= items * per_image]
    return plan + [{"family": "embed_inputs", "shape": {"num_tokens": t, "num_items": 0}} for t in tokens]


def assert_built_as_planned(entry, report: dict, artifact: Path) -> None:
    """An `aotc build --json` entry report and its artifact: every planned graph has cache files, no problem."""
    from aotc.plan import plan_entry

    planned = plan_entry(entry).graphs
    assert report["ok"] and report["problems"] == []
    assert report["planned"] == report["graphs_with_keys"] == len(planned)
    manifest = json.loads((artifact / "manifest.json").read_text())
    with_keys = {(g["family"], json.dumps(g["shape"], sort_keys=True)) for g in manifest["graphs"] if g["keys"]}
    assert {(g.family, json.dumps(g.shape_dict, sort_keys=True)) for g in planned} <= with_keys


@dataclass
class RunnerRun:
    returncode: int
    result: dict
    log: Path
    request: dict


def run_runner(mode: str, request: dict, workdir: Path) -> RunnerRun:
    """`python -m aotc.runners.vllm_tpu` in a fresh process, as the core calls it."""
    workdir.mkdir(parents=True, exist_ok=True)
    req_path, res_path, log = workdir / f"{mode}-request.json", workdir / f"{mode}-result.json", workdir / f"{mode}.log"
    req_path.write_text(json.dumps(request))
    env = {**os.environ, **{k: str(v) for k, v in request["entry"]["env"].items()}}
    with open(log, "w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "aotc.runners.vllm_tpu", mode, str(req_path), str(res_path)],
            stdout=out, stderr=subprocess.STDOUT, env=env, timeout=RUNNER_TIMEOUT,
        )
    result = json.loads(res_path.read_text()) if res_path.exists() else {}
    return RunnerRun(proc.returncode, result, log, request)


def aotc_plan(entry: dict) -> list[dict]:
    from aotc.matrix import Entry
    from aotc.plan import plan_entry

    return [g.to_dict() for g in plan_entry(Entry.from_dict(entry)).graphs]


def build(entry: dict, workdir: Path, traffic: int = 32, seed: int = 0) -> RunnerRun:
    # the plan under test is aotc's own; test_aotc_plan_is_vllms proves it equal to vllm_plan
    request = {"entry": entry, "plan": aotc_plan(entry), "cache_dir": str(workdir / "cache"),
               "traffic": traffic, "seed": seed}
    return run_runner("build", request, workdir)


def verify(build_run: RunnerRun, workdir: Path, cache_dir: Path | None = None,
           traffic: int = 32, seed: int = 0) -> RunnerRun:
    request = {**build_run.request, "cache_dir": str(cache_dir or build_run.request["cache_dir"]),
               "traffic": traffic, "seed": seed}
    return run_runner("verify", request, workdir)


DEMO = CONFIGS / "demo.yaml"  # what `make build-cache` builds and tests/vllm_tpu/test_e2e.py runs through the CLI
DEMO_NAME = "tiny-llama--len128-seqs8-tok64-tp1"
# The demo build's traffic (enough for the sweep to reach the mixed greedy+random sampler), and its verify's:
# a seed the build (seed 0) did not use, more requests than the build sent.
DEMO_TRAFFIC, VERIFY_SEED, VERIFY_TRAFFIC = 32, 1234, 48


@dataclass(frozen=True)
class DemoBuild:
    """configs/demo.yaml built and verified once per run through the real CLI, as `make build-cache` does."""
    artifact: Path
    report: dict
    """`aotc build --json`'s report of the entry."""
    verify: dict
    """`aotc verify --json` of the artifact."""
    cache_before_verify: dict
    cache_after_verify: dict
    """Each cache file's (size, mtime_ns) before and after the verify."""


def cache_files(cache_dir: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(cache_dir).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in cache_dir.rglob("*") if p.is_file()}


def build_and_verify_demo(out: Path) -> dict:
    built = run_aotc("build", DEMO, "--out", out, "--json", "--traffic", DEMO_TRAFFIC)
    assert built.returncode == 0, built.stderr[-3000:]
    artifact = out / DEMO_NAME
    before = cache_files(artifact / "cache")
    verified = run_aotc("verify", artifact, "--json", "--seed", VERIFY_SEED, "--traffic", VERIFY_TRAFFIC)
    assert verified.returncode == 0, verified.stderr[-3000:]
    return {"artifact": str(artifact), "report": json.loads(built.stdout)["entries"][0],
            "verify": json.loads(verified.stdout), "cache_before_verify": before,
            "cache_after_verify": cache_files(artifact / "cache")}


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory) -> DemoBuild:
    """The one demo build of the run, whichever worker asks first; its consumers only read it (a test that
    damages it works on a copy)."""
    with shared_across_workers(tmp_path_factory, "demo-build") as shared:
        record = shared / "demo-build.json"
        if not record.is_file():
            record.write_text(json.dumps(build_and_verify_demo(shared / "artifacts")))
        done = json.loads(record.read_text())
    done["artifact"] = Path(done["artifact"])
    done["cache_before_verify"], done["cache_after_verify"] = (
        {k: tuple(v) for k, v in done[which].items()} for which in ("cache_before_verify", "cache_after_verify"))
    return DemoBuild(**done)
