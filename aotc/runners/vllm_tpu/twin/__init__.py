"""The CPU twin: vLLM 0.13's TPU path on PJRT CPU.

* plugin    -- vLLM platform-plugin hook (every process that resolves its platform); inert unless
  AOTC_CPU_TWIN=1, then it names the twin's platform
* platform  -- vLLM's TpuPlatform with the device name, attention backend and worker a CPU host needs
* attention, moe -- the Pallas stand-ins: ragged paged attention and the vision encoders' flash attention;
  the MoE grouped matmul

Every module of this package enters the fingerprint of a `device: cpu` entry (``RunnerSpec.twin_package``):
a module added here is hashed without being listed anywhere. Importing the package imports nothing: vLLM
loads `plugin` in every process.
"""
