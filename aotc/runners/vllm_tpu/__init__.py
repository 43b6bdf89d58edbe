"""Runner `vllm-tpu`: vLLM 0.13's own TPUWorker / TPUModelRunner fills the XLA cache.

Entry point: `python -m aotc.runners.vllm_tpu {build|verify} REQUEST.json RESULT.json`
(one process per entry). Modules, heaviest last:

* cpu_platform  -- vLLM platform-plugin hook; inert unless AOTC_CPU_TWIN=1
* records       -- worker records -> families/shapes (no torch)
* engine        -- entry -> environment + vllm.LLM arguments
* build, verify -- the two runner commands
* traffic       -- seeded request sweep through the real engine
* probe         -- cache-dir / counter / stderr evidence per call
* worker        -- measuring TPUWorker and its PJRT-CPU twin
* twin_platform, twin_attention -- the CPU twin's TpuPlatform and Pallas stand-in

Importing this package must not import torch: vLLM loads `cpu_platform` in
every process that resolves its platform.
"""

from aotc.runners.spec import RunnerSpec

SPEC = RunnerSpec(
    name="vllm-tpu",
    module="aotc.runners.vllm_tpu",
    buckets="aotc.runners.vllm_tpu.buckets",
    packages=("torch", "torch_xla", "vllm", "libtpu"),
    env_vars=("VLLM_TPU_BUCKET_PADDING_GAP", "VLLM_TPU_MOST_MODEL_LEN", "VLLM_XLA_USE_SPMD", "VLLM_TPU_USING_PATHWAYS"),
    validate="aotc.runners.vllm_tpu.rules:validate",
)
