"""Artifact dirs with real build manifests, without compiling anything.

The plan is the real one (``plan_entry`` of a real matrix entry) and the manifest comes from the real
``aotc.build.make_manifest``; only the runner's result is made up: one cache file per planned graph
(except the ones asked to be missing), a few start-up and runtime graphs, seeded compile times.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from aotc.build import make_manifest, plan_coverage, runner_process_env
from aotc.fingerprint import fingerprint_entry
from aotc.manifest import CACHE_DIR_NAME, VerifySummary
from aotc.matrix import Entry, parse_matrix
from aotc.plan import plan_entry
from aotc.runners.protocol import BuildResult

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

MATRIX = """
defaults: {runner: vllm-tpu, device: cpu, accelerator: v6e-1, dtype: bfloat16}
models:
  - name: tiny-llama
    model: ./models/tiny-llama
    matrix:
      max_model_len: [128, 256]
      max_num_seqs: [8]
      max_num_batched_tokens: [64]
      tensor_parallel_size: [1]
"""


def demo_entries(matrix: str = MATRIX) -> list[Entry]:
    """The demo model in a small matrix (two lengths, so fingerprint inputs differ)."""
    return list(parse_matrix(matrix, "demo-matrix.yaml", base_dir=CONFIGS).entries)


def write_build(out: Path, entry: Entry, missing: int = 0, runtime: int = 2, startup: int = 1,
                seed: int = 0, verify: VerifySummary | None = None, canary: dict[str, Any] | None = None) -> Path:
    """An artifact dir for ``entry``; the first ``missing`` planned graphs of the first family get no key."""
    rng = random.Random(seed)
    plan = plan_entry(entry)
    artifact = out / entry.name
    cache = artifact / CACHE_DIR_NAME
    cache.mkdir(parents=True)

    def graph(family: str, shape: dict[str, Any], keyed: bool = True) -> dict[str, Any]:
        keys = []
        if keyed:
            key = f"tp1_rank0/{rng.getrandbits(64):016x}"
            (cache / key).parent.mkdir(parents=True, exist_ok=True)
            (cache / key).write_bytes(rng.randbytes(rng.randint(256, 4096)))
            keys.append(key)
        return {"family": family, "shape": shape, "keys": keys, "compile_seconds": round(rng.uniform(0.05, 3), 3)}

    result = BuildResult(
        calls=[graph(g.family, g.shape_dict, keyed=i >= missing) for i, g in enumerate(plan.graphs)],
        startup=[graph("startup", {"what": f"profile_run_{i}"}) for i in range(startup)],
        # the first runtime graph names the planned family its call belongs to, the others only their step
        runtime=[graph("runtime", {"what": f"step/{plan.graphs[-1].family}" if i == 0 else "step",
                                   "num_tokens": 16 * (i + 1)}) for i in range(runtime)],
    )
    planned, _ = plan_coverage(plan, result)
    fingerprint = fingerprint_entry(plan.entry, runner_process_env(plan.entry))
    manifest = make_manifest(plan, fingerprint, artifact, result, planned, traffic=16, seed=seed)
    extra = {**manifest.extra, **({"canary": canary} if canary else {})}
    replace(manifest, verify=verify, extra=extra).save(artifact)
    return artifact


def write_demo_build(out: Path) -> list[Path]:
    """Two entries: one complete, verified and canaried; one with a missing graph and a verify that missed."""
    first, second = demo_entries()
    return [
        write_build(out, first, seed=1, verify=VerifySummary(misses=0, replayed_graphs=40, traffic_requests=64),
                    canary={"requests": 32, "compiles_at_startup": 0, "compiles_after_ready": 0,
                            "ready_seconds": 12.5}),
        write_build(out, second, missing=1, seed=2,
                    verify=VerifySummary(misses=1, replayed_graphs=40, traffic_requests=64)),
    ]

