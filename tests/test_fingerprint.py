"""The fingerprint: deterministic across processes, and sensitive to every single input."""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aotc.cli import main
from aotc.errors import MatrixError
from aotc.fingerprint import diff_inputs, fingerprint_entry
from aotc.entry import MODEL_FILES
from aotc.matrix import parse_matrix
from aotc.runners.spec import load_runner

from .conftest import CONFIGS, REPO, launch_environ, run_aotc
from .helpers.cli import json_output, one_line_error

# a hub model pinned to a commit, as fingerprint_entry requires
COMMIT, OTHER_COMMIT = "a" * 40, "b" * 40
BASE = parse_matrix(f"""
defaults: {{env: {{VLLM_TPU_BUCKET_PADDING_GAP: 0}}, engine: {{block_size: 16, num_gpu_blocks_override: 2049}}}}
models: [{{name: m, model: org/m, revision: {COMMIT}, matrix: {{max_model_len: [2048], max_num_seqs: [128],
          max_num_batched_tokens: [512], tensor_parallel_size: [1]}}}}]
""").entries[0]
ENV = {"XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_cpu_enable_fast_math=false", "LIBTPU_INIT_ARGS": ""}


def digest(entry=BASE, environ=ENV):
    return fingerprint_entry(entry, environ).digest


# BASE's engine arguments: a TPU entry's count pinned (sizing it needs the TPU)
PINNED = {"block_size": 16, "num_gpu_blocks_override": 2049}

ENTRY_CHANGES = {
    "model": {"model": "org/other"},
    "revision": {"revision": OTHER_COMMIT},
    "runner_device": {"device": "cpu"},
    "accelerator": {"accelerator": "v5e-8"},
    "dtype": {"dtype": "float32"},
    "max_model_len": {"max_model_len": 4096},
    "max_num_seqs": {"max_num_seqs": 256},
    "max_num_batched_tokens": {"max_num_batched_tokens": 1024},
    "tensor_parallel_size": {"tensor_parallel_size": 2},
    "engine_arg": {"engine": {**PINNED, "block_size": 32}},
    "engine_arg_added": {"engine": {**PINNED, "max_logprobs": 5}},
    # one per kind of vllm serve argument the matrix may set: a switch, a count, a JSON config, a string
    "engine_switch": {"engine": {**PINNED, "async_scheduling": False}},
    "engine_count": {"engine": {**PINNED, "data_parallel_size": 2}},
    "engine_json_config": {"engine": {**PINNED, "speculative_config": {"method": "ngram",
                                                                               "num_speculative_tokens": 2}}},
    "engine_string": {"engine": {**PINNED, "kv_cache_dtype": "fp8"}},
    "runner_env": {"env": {"VLLM_TPU_BUCKET_PADDING_GAP": 128}},
    "most_model_len": {"env": {"VLLM_TPU_BUCKET_PADDING_GAP": 0, "VLLM_TPU_MOST_MODEL_LEN": 1024}},
}


@pytest.mark.parametrize("name", ENTRY_CHANGES)
def test_each_entry_input_changes_the_digest(name):
    changed = dataclasses.replace(BASE, **ENTRY_CHANGES[name])
    assert digest(changed) != digest()
    assert diff_inputs(fingerprint_entry(changed, ENV).inputs, fingerprint_entry(BASE, ENV).inputs)


def test_changed_engine_argument_is_named():
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    ours = dataclasses.replace(BASE, engine={**PINNED, "speculative_config": spec})
    theirs = dataclasses.replace(BASE, engine={**PINNED, "speculative_config": {**spec, "num_speculative_tokens": 3}})
    assert diff_inputs(fingerprint_entry(ours, ENV).inputs, fingerprint_entry(theirs, ENV).inputs) == [
        "engine.speculative_config.num_speculative_tokens"]


@pytest.mark.parametrize("pod_only", [{"host": "0.0.0.0"}, {"port": 9000}, {"served_model_name": ["x"]},
                                      {"api_key": "k"}, {"uvicorn_log_level": "debug"}])
def test_pod_only_arguments_leave_the_digest_alone(pod_only):
    assert digest(dataclasses.replace(BASE, engine={**PINNED, **pod_only})) == digest()


ENV_CHANGES = {
    "xla_flag_value": {**ENV, "XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_cpu_enable_fast_math=true"},
    "libtpu_flag": {**ENV, "LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=true"},
    "runner_env_from_process": {**ENV, "VLLM_TPU_MOST_MODEL_LEN": "1024"},
}


@pytest.mark.parametrize("name", ENV_CHANGES)
def test_each_environment_input_changes_the_digest(name):
    assert digest(environ=ENV_CHANGES[name]) != digest()


def test_config_env_wins_over_process_env():
    assert digest(environ={**ENV, "VLLM_TPU_BUCKET_PADDING_GAP": "64"}) == digest()


def test_flag_order_and_non_xla_words_do_not_matter():
    reordered = {**ENV, "XLA_FLAGS": "--xla_cpu_enable_fast_math=false   --xla_dump_to=/tmp/x"}
    assert digest(environ=reordered) == digest()
    assert digest(environ={**ENV, "UNRELATED": "1"}) == digest()


@pytest.mark.parametrize("package", load_runner("vllm-tpu").packages)
def test_each_package_version_changes_the_digest(package, monkeypatch):
    from aotc.runners import spec

    real = spec.package_version
    monkeypatch.setattr(spec, "package_version", lambda name: "9.9.9" if name == package else real(name))
    patched = fingerprint_entry(BASE, ENV)
    monkeypatch.setattr(spec, "package_version", real)
    assert patched.digest != digest()
    assert patched.inputs["versions"][package] == "9.9.9"


def test_local_model_config_content_changes_the_digest(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 4, "hidden_size": 64}))
    text = f"models: [{{name: t, model: {model}, matrix: {{max_model_len: [128], max_num_seqs: [8], " \
           "max_num_batched_tokens: [64]}, engine: {num_gpu_blocks_override: 65}}]"
    before = fingerprint_entry(parse_matrix(text).entries[0], ENV)
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 4, "hidden_size": 128}))
    after = fingerprint_entry(parse_matrix(text).entries[0], ENV)
    assert before.digest != after.digest
    assert diff_inputs(before.inputs, after.inputs) == ["model_config_sha256"]


def test_local_model_location_does_not_matter(tmp_path):
    digests = set()
    for where in ("a", "b"):
        model = tmp_path / where / "tiny"
        model.mkdir(parents=True)
        (model / "config.json").write_text('{"num_attention_heads": 4}')
        text = f"models: [{{name: t, model: {model}, matrix: {{max_model_len: [128], max_num_seqs: [8], " \
               "max_num_batched_tokens: [64]}, engine: {num_gpu_blocks_override: 65}}]"
        digests.add(fingerprint_entry(parse_matrix(text).entries[0], ENV).digest)
    assert len(digests) == 1


def draft_entry(matrix_dir, draft="./draft"):
    """An eagle3 entry whose draft model is a local dir named relative to the matrix's own dir."""
    text = ("models: [{name: t, model: org/m, revision: %s, runner: tpu-inference, engine: {speculative_config: "
            "{method: eagle3, model: %s, num_speculative_tokens: 2}, num_gpu_blocks_override: 65}, matrix: "
            "{max_model_len: [128], max_num_seqs: [8], max_num_batched_tokens: [64]}}]" % (COMMIT, draft))
    return parse_matrix(text, base_dir=matrix_dir, check_stack=False).entries[0]


def write_draft(where, hidden=64):
    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": hidden}))


def test_local_draft_model_is_read_beside_the_matrix_and_named_by_its_config(tmp_path):
    write_draft(tmp_path / "draft")
    entry = draft_entry(tmp_path)
    assert entry.engine["speculative_config"]["model"] == str((tmp_path / "draft").resolve())  # for the runner
    before = fingerprint_entry(entry, ENV)
    assert before.inputs["engine"]["speculative_config"]["model"] == "draft"
    write_draft(tmp_path / "draft", hidden=128)
    after = fingerprint_entry(draft_entry(tmp_path), ENV)
    assert diff_inputs(before.inputs, after.inputs) == ["engine.speculative_config.model_config_sha256"]


def test_local_draft_model_location_does_not_matter(tmp_path):
    digests = set()
    for where in ("a", "b"):
        write_draft(tmp_path / where / "models" / "draft")
        digests.add(digest(draft_entry(tmp_path / where, "./models/draft")))
    assert len(digests) == 1


def test_local_draft_model_without_a_config_is_a_one_line_matrix_error(tmp_path):
    (tmp_path / "draft").mkdir()
    with pytest.raises(MatrixError, match=r"models\['t'\]\.engine\.speculative_config\.model: local model dir "
                                          "has no config.json"):
        draft_entry(tmp_path)


def test_identical_across_processes():
    code = ("import sys; from aotc.matrix import load_matrix; from aotc.fingerprint import fingerprint_entry;"
            "m = load_matrix(sys.argv[1]); print(fingerprint_entry(m.entries[0], {}).digest)")
    # the demo (CPU twin): sized once by its stack and kept on disk, so both processes read the same count
    outs = {subprocess.run([sys.executable, "-c", code, str(CONFIGS / "demo.yaml")], capture_output=True,
                           text=True, cwd=cwd, check=True).stdout for cwd in (REPO, "/")}
    assert len(outs) == 1 and len(outs.pop().strip()) == 64


def test_cli_json_shows_inputs(capsys):
    entry = "tiny-llama--len128-seqs8-tok64-tp1"
    assert main(["fingerprint", str(CONFIGS / "demo.yaml"), "--entry", entry, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["entry"] == entry and len(doc["fingerprint"]) == 64
    # jax/jaxlib: torch_xla's Pallas kernels are lowered with them on a TPU
    assert set(doc["inputs"]["versions"]) == {"torch", "torch_xla", "vllm", "libtpu", "jax", "jaxlib"}
    assert doc["inputs"]["versions"]["vllm"] == "0.13.0"
    assert {"model", "revision", "engine", "env", "xla_flags", "tensor_parallel_size", "accelerator"} <= set(
        doc["inputs"])


def test_flags_are_hashed_as_jax_hashes_them_duplicates_included():
    # JAX's cache key hashes every word of XLA_FLAGS / LIBTPU_INIT_ARGS, a repeated flag twice; a pod whose
    # engine core sees a flag twice computes other keys than a build that saw it once.
    once = {**ENV, "XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
    twice = {**ENV, "XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_cpu_enable_fast_math=false"}
    assert digest(environ=once) != digest(environ=twice)


def test_kv_block_count_is_an_input():
    # (an entry without the override is sized by its stack on its device: tests/vllm_tpu/test_kv_size.py)
    assert fingerprint_entry(BASE, ENV).inputs["kv_blocks"] == 2049
    pinned = dataclasses.replace(BASE, engine={**BASE.engine, "num_gpu_blocks_override": 4000})
    assert fingerprint_entry(pinned, ENV).inputs["kv_blocks"] == 4000 and digest(pinned) != digest()


def test_twin_code_is_an_input_of_cpu_entries_only(tmp_path, monkeypatch):
    # The CPU twin's own attention enters every backbone graph: a changed twin must not match graphs built
    # with the old one. A TPU entry has no twin.
    from aotc.fingerprint import code_digest

    package = tmp_path / "twin_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    module = package / "attention.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    digests = []
    for source in ("def f(x):\n    return x * 2\n", "def f(x):\n    return x * 2\n", "def f(x):\n    return x * 3\n"):
        module.write_text(source)
        digests.append(code_digest(("twin_pkg.attention",)))
    assert digests[0] == digests[1] != digests[2]

    cpu = dataclasses.replace(BASE, device="cpu")
    assert fingerprint_entry(cpu, ENV).inputs["twin"] == code_digest((BASE.backend.twin_package,))
    assert "twin" not in fingerprint_entry(BASE, ENV).inputs


def test_a_module_added_to_the_twin_package_enters_the_twin_digest(tmp_path, monkeypatch):
    """The twin is hashed as its package: a new stand-in module changes the digest without being listed anywhere
    (a list of module names could leave one out, and a twin artifact would match graphs built without it)."""
    from aotc.fingerprint import code_digest

    package = tmp_path / "new_twin"
    package.mkdir()
    (package / "__init__.py").write_text("def install():\n    pass\n")
    (package / "attention.py").write_text("def f(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_digest(("new_twin",))
    (package / "moe.py").write_text("def g(x):\n    return x\n")
    assert code_digest(("new_twin",)) != before


@pytest.mark.needs_jax
def test_serving_fixes_are_an_input_of_the_entries_whose_graphs_they_change():
    """The tpu-inference serving fixes change what a Qwen2.5-VL server compiles (a pod runs them too): their
    code is in that entry's fingerprint, and in no local text model's, whose graphs they leave alone."""
    from aotc.fingerprint import code_digest
    from aotc.matrix import load_matrix
    from aotc.runners.tpu_inference.plan.buckets import SERVING_FIXES

    multimodal, *_ = load_matrix(CONFIGS / "multimodal-jax.yaml").entries
    [text] = load_matrix(CONFIGS / "demo-jax.yaml").entries
    assert fingerprint_entry(multimodal, ENV).inputs["serving_fixes"] == code_digest(SERVING_FIXES)
    assert "serving_fixes" not in fingerprint_entry(dataclasses.replace(text, engine={"num_gpu_blocks_override": 65}),
                                                    ENV).inputs
    # a hub id has no local config: it may be a vision model, and no machine can tell it from a cache
    hub = dataclasses.replace(text, model="Qwen/Qwen2.5-VL-7B-Instruct", revision=COMMIT, model_path=None,
                              engine={"num_gpu_blocks_override": 65})
    assert fingerprint_entry(hub, ENV).inputs["serving_fixes"] == code_digest(SERVING_FIXES)


def test_a_torch_xla_tpu_entry_is_not_sized_on_a_host_without_a_tpu(tmp_path):
    """`device: tpu` without a pinned count on the vllm-tpu runner (torch_xla cannot compile for a TPU it does
    not have): the stack sizes it on the TPU; here (no TPU) that is a one-line error at once, exit 2, instead of
    starting the stack for nothing. (tpu-inference sizes it against the target's HBM: tests/tpu_inference.)"""
    from aotc.runners.tpu_host import has_tpu

    assert not has_tpu()  # CI and developer machines: the suite never runs on a TPU host
    assert not load_runner("vllm-tpu").tpu_targets_on_cpu_host
    proc = subprocess.run([sys.executable, "-m", "aotc.cli", "fingerprint", str(CONFIGS / "example-tpu.yaml"),
                           "--entry", "llama31-8b--len2048-seqs128-tok512-tp4"], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={**os.environ, "AOTC_HOME": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "to size on a TPU (v6e-8) and this host has none" in proc.stderr


def test_a_tpu_host_is_known_by_its_pci_vendor_id_stand_in_sysfs(tmp_path):
    """A stand-in /sys/bus/pci/devices (no TPU exists here): Google's vendor id marks a TPU chip."""
    from aotc.runners.tpu_host import GOOGLE_PCI_VENDOR, has_tpu

    for name, vendor in (("0000:00:04.0", "0x1af4"), ("0000:00:05.0", "0x8086")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor + "\n")
    assert not has_tpu(tmp_path)
    (tmp_path / "0000:00:06.0").mkdir()
    (tmp_path / "0000:00:06.0" / "vendor").write_text(GOOGLE_PCI_VENDOR + "\n")
    assert has_tpu(tmp_path) and not has_tpu(tmp_path / "missing")


# --- answers kept under $AOTC_HOME are checked, not trusted as found -------------------------------

# torch_xla's runner: its stack sizes a TPU entry on a TPU only (tpu-inference's sizes it here, against the
# target's HBM: tests/tpu_inference/test_tpu_target_jax.py)
TPU_CONFIG, TPU_ENTRY = CONFIGS / "example-tpu.yaml", "llama31-8b--len2048-seqs128-tok512-tp4"


def kept_sizing(home) -> Path:
    """Where `aotc fingerprint` looks for the stack's sizing of the TPU entry, with AOTC_HOME=home."""
    from aotc import kv
    from aotc.fingerprint import kv_sizing_key
    from aotc.matrix import load_matrix

    entry = load_matrix(TPU_CONFIG).entry(TPU_ENTRY)
    environ = {**launch_environ(), "AOTC_HOME": str(home)}
    return kv.sizing_path(kv_sizing_key(entry, environ), environ)


@pytest.mark.parametrize("kept, trusted", [(4096, True), (True, False), (-7, False), (1e3, False), ("64", False)])
def test_a_kept_kv_sizing_is_used_only_when_it_is_a_block_count(tmp_path, kept, trusted):
    """A TPU entry's KV block count is the stack's to size on a TPU (none here): a valid kept answer is used, an
    invalid one is discarded, so the command asks for a sizing it cannot do here (exit 2)."""
    path = kept_sizing(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"entry": TPU_ENTRY, "kv_blocks": kept}))
    proc = subprocess.run([sys.executable, "-m", "aotc.cli", "fingerprint", str(TPU_CONFIG), "--entry", TPU_ENTRY,
                           "--json"], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**launch_environ(), "AOTC_HOME": str(tmp_path)})
    if trusted:
        assert proc.returncode == 0, proc.stderr
        assert '"kv_blocks": 4096' in proc.stdout, proc.stdout
    else:
        assert proc.returncode == 2 and "this host has none" in proc.stderr, (proc.returncode, proc.stderr)
        assert not path.exists()  # discarded: the next command sizes again


# --- every input that can change the set of graphs, through `aotc fingerprint` (issue 45) ------------------


def entry_name(name: str, tokens: int = 64) -> str:
    return f"{name}--len128-seqs8-tok{tokens}-tp1"


def write_matrix(path, models: list[dict], **defaults) -> str:
    """A matrix file (JSON is YAML) of ``models``, each with the demo's shapes unless it names its own."""
    shapes = {"max_model_len": [128], "max_num_seqs": [8], "max_num_batched_tokens": [64]}
    path.write_text(json.dumps({"defaults": defaults, "models": [{"matrix": shapes, **m} for m in models]}))
    return str(path)


def cli_fingerprint(config: str, entry: str, env: dict | None = None) -> dict:
    return json_output(run_aotc("fingerprint", config, "--entry", entry, "--json", env=env))


def sha256_of(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


JAX_CPU = {"runner": "tpu-inference", "device": "cpu", "accelerator": "v6e-4"}


@pytest.mark.needs_jax  # fingerprints a tpu-inference entry: the JAX venv's versions
def test_a_draft_given_as_json_text_is_known_by_its_config_as_in_a_mapping(tmp_path):
    """vllm serve takes speculative_config as JSON text too (any JSON argument): that draft is read beside the
    matrix and known by its config.json, as a mapping's is, not by its path (two drafts at one path with other
    configs shared one fingerprint; the mapping's tests above change the config itself)."""
    draft = CONFIGS / "models" / "tiny-llama-eagle3"
    (tmp_path / "draft").symlink_to(draft)  # resolved, as a model dir is: the stack's verdict stays cached
    spec = {"method": "eagle3", "model": "./draft", "num_speculative_tokens": 2}
    target = str(CONFIGS / "models" / "tiny-llama-8-layers")
    config = write_matrix(tmp_path / "matrix.yaml", [
        {"name": "text", "model": target, "engine": {"speculative_config": json.dumps(spec)}},
        {"name": "mapping", "model": target, "engine": {"speculative_config": spec}}],
        **JAX_CPU, engine={"num_gpu_blocks_override": 65})
    text, mapping = (cli_fingerprint(config, entry_name(name)) for name in ("text", "mapping"))
    assert text["fingerprint"] == mapping["fingerprint"]
    known = text["inputs"]["engine"]["speculative_config"]
    assert (known["model"], known["model_config_sha256"]) == (draft.name, sha256_of(draft / "config.json"))


@pytest.mark.needs_jax  # fingerprints a tpu-inference entry: the JAX venv's versions
def test_a_preprocessor_config_that_changes_the_plan_changes_the_fingerprint(tmp_path):
    """Qwen2.5-VL with dynamic image sizes: the processor's max_pixels (its preprocessor_config.json) bounds the
    images, so the plan's encoder graphs; the fingerprint hashes that file as the plan reads it."""
    model = tmp_path / "vl"
    shutil.copytree(CONFIGS / "models" / "tiny-qwen2_5-vl", model)
    config = write_matrix(tmp_path / "matrix.yaml", [{
        "name": "vl", "model": "./vl",
        "engine": {"num_gpu_blocks_override": 64, "limit_mm_per_prompt": {"image": 2, "video": 0},
                   "additional_config": {"enable_dynamic_image_sizes": True}},
        "matrix": {"max_model_len": [128], "max_num_seqs": [8], "max_num_batched_tokens": [32]}}],
        runner="tpu-inference", device="cpu", accelerator="v6e-1")
    entry = entry_name("vl", tokens=32)
    preprocessor = model / "preprocessor_config.json"
    seen = []
    for max_pixels in (12544, 50176):
        preprocessor.write_text(json.dumps({**json.loads(preprocessor.read_text()), "max_pixels": max_pixels}))
        plan = json_output(run_aotc("plan", config, "--entry", entry, "--json"))
        seen.append((plan["total_graphs"], cli_fingerprint(config, entry)))
    (small_graphs, small), (large_graphs, large) = seen
    assert small_graphs != large_graphs  # the plan reads the file
    assert diff_inputs(small["inputs"], large["inputs"]) == ["model_files_sha256.preprocessor_config.json"]
    assert large["inputs"]["model_files_sha256"]["preprocessor_config.json"] == sha256_of(preprocessor)


@pytest.mark.needs_jax  # fingerprints a tpu-inference entry: the JAX venv's versions
@pytest.mark.parametrize("name", MODEL_FILES)
def test_each_model_file_a_plan_reads_is_in_the_fingerprint(tmp_path, name):
    model = tmp_path / "guard"
    shutil.copytree(CONFIGS / "models" / "tiny-llama-guard-4", model)  # it has all of them
    config = write_matrix(tmp_path / "matrix.yaml", [{
        "name": "guard", "model": "./guard", "engine": {"num_gpu_blocks_override": 64,
                                                       "limit_mm_per_prompt": {"image": 1}}}],
        runner="tpu-inference", device="cpu", accelerator="v6e-1")
    before = cli_fingerprint(config, entry_name("guard"))
    with open(model / name, "a") as f:
        f.write("\n")  # the same JSON, other bytes: the fingerprint hashes the file, not a reading of it
    after = cli_fingerprint(config, entry_name("guard"))
    assert before["fingerprint"] != after["fingerprint"]


OPENED_MODEL_FILES = """
import json, os, sys
from pathlib import Path

models, opened = Path(sys.argv[1]).resolve(), set()


def record(event, args):
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = Path(os.path.realpath(os.fsdecode(args[0])))
        if models in path.parents:
            opened.add(path.name)


sys.addaudithook(record)
from aotc.matrix import load_matrix
from aotc.plan import plan_entries

for config in sys.argv[2:]:
    plan_entries(load_matrix(config, check_stack=False).entries)
print(json.dumps(sorted(opened)))
"""


def test_the_fingerprint_hashes_every_model_file_the_plans_open():
    """Every plan of the repo's matrices, its opens recorded by an audit hook: the files of model dirs it reads
    are exactly MODEL_FILES, which the fingerprint hashes (a rule reading another file fails here)."""
    configs = sorted(str(p) for p in CONFIGS.glob("*.yaml"))
    proc = subprocess.run([sys.executable, "-c", OPENED_MODEL_FILES, str(CONFIGS / "models"), *configs],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == sorted(MODEL_FILES)


def hub_matrix(tmp_path, **model) -> str:
    return write_matrix(tmp_path / "hub.yaml", [{"name": "hub", "model": "org/m", **model}],
                        engine={"num_gpu_blocks_override": 65})


def test_a_hub_model_at_a_branch_is_refused_naming_the_commit_it_names_here(tmp_path):
    """A pod's vLLM loads whatever `main` names when it starts; no fingerprint can know that commit, so a hub
    model must be pinned to one. This machine's Hugging Face cache says which commit its ref names."""
    refs = tmp_path / "hf" / "models--org--m" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text(COMMIT)
    env = {"HF_HUB_CACHE": str(tmp_path / "hf")}
    line = one_line_error(run_aotc("fingerprint", hub_matrix(tmp_path), "--entry", entry_name("hub"), env=env), 2)
    assert "revision: hub model org/m at 'main', not a commit" in line and f"'main' names {COMMIT}" in line
    pinned = cli_fingerprint(hub_matrix(tmp_path, revision=COMMIT), entry_name("hub"), env=env)
    assert pinned["inputs"]["revision"] == COMMIT


def test_a_hub_draft_at_its_default_branch_is_refused_by_a_pods_fetch(tmp_path):
    config = write_matrix(tmp_path / "hub.yaml", [{
        "name": "hub", "model": "org/m", "revision": COMMIT,
        "engine": {"speculative_config": {"method": "eagle3", "model": "org/draft", "num_speculative_tokens": 2}}}],
        **JAX_CPU, engine={"num_gpu_blocks_override": 65})
    proc = run_aotc("fetch", "--config", config, "--entry", entry_name("hub"), "--dest", tmp_path / "dest",
                    "--store", tmp_path / "store")
    assert "engine.speculative_config.revision: hub model org/draft at its default branch" in one_line_error(proc, 2)


@pytest.mark.parametrize("where", ["engine", "matrix"])
def test_a_vllm_serve_config_file_is_refused(tmp_path, where):
    """`--config FILE` is read by the server's parser alone: the build would not apply its arguments and the
    fingerprint would hash a path. The matrix takes the arguments themselves."""
    arguments = tmp_path / "serve-args.yaml"
    arguments.write_text("max_logprobs: 5\n")
    model = {"name": "m", "model": str(CONFIGS / "models" / "tiny-llama")}
    if where == "engine":
        model["engine"] = {"config": str(arguments)}
    else:
        model["matrix"] = {"max_model_len": [128], "max_num_seqs": [8], "max_num_batched_tokens": [64],
                           "config": [str(arguments)]}
    config = write_matrix(tmp_path / "matrix.yaml", [model], device="cpu", engine={"num_gpu_blocks_override": 65})
    line = one_line_error(run_aotc("fingerprint", config, "--entry", entry_name("m")), 2)
    assert f"models['m'].{where}" in line and "a file of vllm serve arguments is read by the server alone" in line
