"""serve_command: the stock `vllm serve` of an entry, derived from the runner interface (no process here;
tests/test_canary.py starts real servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aotc.runners.spec import runner_python
from aotc.matrix import load_matrix
from aotc.engine_args import cli_flags
from aotc.fingerprint import entry_kv_blocks
from aotc.server import serve_command

from .conftest import CONFIGS

DEMOS = {"vllm-tpu": CONFIGS / "demo.yaml", "tpu-inference": CONFIGS / "demo-jax.yaml"}


def demo(runner: str):
    return load_matrix(DEMOS[runner]).entries[0]


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("runner", ["vllm-tpu", pytest.param("tpu-inference", marks=pytest.mark.needs_jax)])
def test_stock_server_carries_the_entrys_shape_and_pinned_kv(runner, tmp_path):
    entry = demo(runner)
    cmd = serve_command(entry, tmp_path, 12345, environ={})
    assert Path(cmd.argv[0]).name == "vllm" and cmd.argv[1] == "serve" and cmd.model == entry.model_path
    assert option(cmd.argv, "--max-model-len") == str(entry.max_model_len)
    assert option(cmd.argv, "--max-num-seqs") == str(entry.max_num_seqs)
    assert option(cmd.argv, "--max-num-batched-tokens") == str(entry.max_num_batched_tokens)
    kv = entry_kv_blocks(entry)
    assert option(cmd.argv, "--num-gpu-blocks-override") == str(kv)
    assert option(cmd.argv, "--port") == "12345"
    # vLLM's default multiprocessing (API server + engine core), and the in-process flag never leaks in
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in cmd.env
    assert cmd.env["VLLM_XLA_CACHE_PATH"] == str(tmp_path) and cmd.env["AOTC_GUARD"] == "strict"
    assert "--skip-tokenizer-init" not in cmd.argv  # a pod serves text


@pytest.mark.needs_jax
def test_jax_server_points_jax_at_the_cache_from_process_start(tmp_path):
    cmd = serve_command(demo("tpu-inference"), tmp_path, 1)
    assert cmd.env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path) and cmd.env["AOTC_CPU_TWIN"] == "1"
    assert cmd.argv[0] == str(Path(runner_python("tpu-inference")).parent / "vllm")  # the runner's own venv


def test_torch_xla_twin_serves_with_the_plain_twin_worker(tmp_path):
    cmd = serve_command(demo("vllm-tpu"), tmp_path, 1)
    assert option(cmd.argv, "--worker-cls") == "aotc.runners.vllm_tpu.worker.CpuTwinServingWorker"
    assert cmd.env["AOTC_CPU_TWIN"] == "1" and cmd.env["PJRT_DEVICE"] == "CPU"


def test_cli_flags_spell_vllm_arguments():
    assert cli_flags({"max_model_len": 8, "enable_prefix_caching": False, "x": None,
                      "compilation_config": {"level": 0}}) == [
        "--max-model-len", "8", "--no-enable-prefix-caching", "--compilation-config", '{"level": 0}']


@pytest.mark.needs_jax
def test_process_env_unsets_what_the_runner_unsets(tmp_path):
    cmd = serve_command(demo("tpu-inference"), tmp_path, 1)
    env = cmd.process_env({"VLLM_DISABLE_COMPILE_CACHE": "1", "PATH": "/bin"})
    assert "VLLM_DISABLE_COMPILE_CACHE" not in env and env["PATH"] == "/bin"


# what vLLM 0.32's engine core printed when a pod's server died before ready (ANSI colour, pid prefixes)
DYING_LOG = r"""
(EngineCore pid=7) ERROR 12-04 10:15:29 [core.py:1512] Traceback (most recent call last):
(EngineCore pid=7) ERROR 12-04 10:15:29 [core.py:1512]     raise ValueError(
(EngineCore pid=7) ERROR 12-04 10:15:29 [core.py:1512] ValueError: prompt_logprobs is not supported with speculative decoding.
\x1b[0;36m(APIServer pid=6)\x1b[0;0m RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_a_server_dying_before_ready_is_one_line_naming_its_cause_and_log(tmp_path):
    """A real process that logs like vLLM and exits 1: the failure is one line an operator can act on."""
    import sys

    from aotc.server import Server, ServerCommand, ServerFailed

    script = f"import sys; sys.stdout.write({DYING_LOG.replace(chr(92) + 'x1b', chr(27))!r}); sys.exit(1)"
    command = ServerCommand(argv=[sys.executable, "-c", script], env={}, port=9)
    with pytest.raises(ServerFailed) as failed, Server(command, tmp_path / "server.log").start() as server:
        server.wait_ready(timeout=60, poll=0.05)
    message = str(failed.value)
    assert "\n" not in message and "\x1b" not in message
    assert message == ("vllm serve exited with 1 before ready: ValueError: prompt_logprobs is not supported with "
                       f"speculative decoding. (log: {tmp_path / 'server.log'})")
