"""The YAML matrix: schema, validation and expansion into entries.

A matrix names models and the engine settings to build for; every combination of the values listed
under a model's ``matrix`` is one entry with a stable, readable name. Validation is strict: a typo in
a key would otherwise silently build the wrong cache, which a pod only discovers by compiling.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, TypeAdapter, ValidationError,
                      field_validator, model_validator)

from aotc.accelerators import Accelerator, parse_accelerator
from aotc.engine_args import ARGUMENT_FILES, OWN_KEYS, decoded_json_args, normalize, stack_verdicts, with_hf_overrides
from aotc.entry import MAX_CONFIG_JSON_BYTES, Entry
from aotc.errors import BadInput, MatrixError
from aotc.files import PLAIN_NAME, read_regular_file
from aotc.hf_cache import cached_file
from aotc.runners.spec import (DEFAULT_RUNNER, RunnerSpec, UnknownRunner, load_runner, registered, runner_python,
                               runner_versions)

NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._]|-(?!-))*$")

MAX_MATRIX_BYTES = 1 << 20  # a matrix is a few KiB: /dev/zero or a log named by mistake is not read whole
MAX_YAML_NODES = 100_000  # values once aliases expand (each entry's engine is a few dozen)
STR_TAG, MERGE_TAG = "tag:yaml.org,2002:str", "tag:yaml.org,2002:merge"
JSON_TAGS = frozenset(f"tag:yaml.org,2002:{kind}" for kind in ("str", "int", "float", "bool", "null", "seq", "map"))

PositiveInt = Annotated[StrictInt, Field(ge=1)]


class MatrixLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing a key one mapping gives twice: YAML keeps the last value silently,
    so one of two settings would be dropped without a word."""

    def construct_document(self, node: yaml.Node) -> Any:
        self._refuse_duplicate_keys(node, "", set())
        return super().construct_document(node)

    def _refuse_duplicate_keys(self, node: yaml.Node, path: str, seen: set[int]) -> None:
        if id(node) in seen:  # an alias: its node is checked once, where it is defined
            return
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self._refuse_duplicate_keys(item, f"{path}[{index}]", seen)
        elif isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key, value in node.value:
                label = key.value if isinstance(key, yaml.ScalarNode) else "?"
                where = f"{path}.{label}" if path else label
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    name = self.construct_object(key)  # as the mapping will hold it: 1 and 0x1 are one key
                    if name in first:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {where} (first at line {first[name] + 1})", key.start_mark)
                    first[name] = key.start_mark.line
                self._refuse_duplicate_keys(value, where, seen)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _engine_keys(data: Any) -> Any:
    """Argument names as vLLM reads them; the matrix's own keys are set in their own places."""
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        name = normalize(str(key))
        if name in OWN_KEYS:
            raise ValueError(f"{key}: set by the matrix itself (matrix axes, dtype, model, revision), not engine:")
        if name in ARGUMENT_FILES:
            raise ValueError(f"{key}: a file of vllm serve arguments is read by the server alone (the build would "
                             "not apply it, the fingerprint not see it): give its arguments under engine:")
        out[name] = value
    return out


class EngineArgs(BaseModel):
    """Any ``vllm serve`` argument (the stack's parser checks names and values: aotc/engine_args.py). The few
    aotc reads itself are typed here."""

    model_config = ConfigDict(extra="allow", frozen=True)

    _keys = model_validator(mode="before")(_engine_keys)

    block_size: PositiveInt | None = None
    kv_cache_dtype: StrictStr | None = None
    quantization: StrictStr | None = None
    enable_prefix_caching: StrictBool | None = None
    max_logprobs: Annotated[StrictInt, Field(ge=0)] | None = None
    enable_lora: StrictBool | None = None
    max_loras: PositiveInt | None = None
    max_lora_rank: PositiveInt | None = None
    disable_chunked_mm_input: StrictBool | None = None
    # MoE experts sharded over the tensor-parallel ranks (tpu-inference: its expert-parallel GMM backend)
    enable_expert_parallel: StrictBool | None = None
    # The KV block count, a shape in every backbone graph; unset: the runner's (its stack's sizing, or its rule),
    # pinned the same way for build, verify and the serving flags (aotc/fingerprint.py: entry_kv_blocks).
    num_gpu_blocks_override: PositiveInt | None = None


class Settings(_Frozen):
    runner: StrictStr | None = None  # a registered backend (aotc/runners/spec.py)
    device: Literal["tpu", "cpu"] | None = None
    accelerator: StrictStr | None = None
    dtype: Literal["bfloat16", "float32", "float16", "auto"] | None = None
    engine: EngineArgs | None = None
    # environment variables, each one the entry's runner lets a matrix set (RunnerSpec.matrix_env): checked
    # per entry, once its runner is known
    env: dict[StrictStr, Any] | None = None

    @field_validator("runner")
    @classmethod
    def _runner(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                load_runner(v)
            except UnknownRunner as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("accelerator")
    @classmethod
    def _accelerator(cls, v: str | None) -> str | None:
        if v is not None:
            parse_accelerator(v)
        return v


def _axis(minimum: int):
    return Annotated[list[Annotated[StrictInt, Field(ge=minimum)]], Field(min_length=1)]


class Axes(BaseModel):
    """The four shape axes, and any engine argument swept as an axis of its own (``async_scheduling:
    [true, false]``, ``speculative_config: [{...}, {...}]``): a list of values, one entry each."""

    model_config = ConfigDict(extra="allow", frozen=True)

    # The minimums are vLLM's own (SchedulerConfig, ParallelConfig: ge=1); aotc needs an explicit length,
    # so max_model_len has no "auto". Every other rule is the runner's (RunnerSpec.validate).
    max_model_len: _axis(1)
    max_num_seqs: _axis(1)
    max_num_batched_tokens: _axis(1)
    tensor_parallel_size: _axis(1) = [1]

    @model_validator(mode="before")
    @classmethod
    def _engine_axes(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        shape = set(cls.model_fields)
        out = {k: v for k, v in data.items() if k in shape}
        for key, values in _engine_keys({k: v for k, v in data.items() if k not in shape}).items():
            if not isinstance(values, list) or not values:
                raise ValueError(f"{key}: an engine-argument axis is a non-empty list of values, got {values!r}")
            out[key] = values
        return out

    @field_validator("*")
    @classmethod
    def _distinct(cls, values: list[int]) -> list[int]:
        if len(set(values)) != len(values):
            raise ValueError(f"values repeat: {values}")
        return values

    def engine_axes(self) -> dict[str, list[Any]]:
        axes = dict(self.model_extra or {})
        for key, values in axes.items():
            if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
                raise ValueError(f"{key}: values repeat: {values}")
        return axes


class ModelSpec(Settings):
    name: StrictStr
    model: StrictStr
    revision: StrictStr = "main"
    matrix: Axes

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v) or len(v) > 64:
            raise ValueError(f"must be lowercase letters, digits, '.', '_' or single '-' (at most 64), got {v!r}")
        return v


class MatrixFile(_Frozen):
    store: StrictStr | None = None
    defaults: Settings = Settings()
    models: Annotated[list[ModelSpec], Field(min_length=1)]


DEFAULTS = {"runner": DEFAULT_RUNNER, "device": "tpu", "accelerator": "v6e-8", "dtype": "bfloat16"}


@dataclass(frozen=True)
class Matrix:
    path: str
    store: str | None
    entries: tuple[Entry, ...]

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise BadInput(f"{self.path}: no entry named {name!r}; entries: {', '.join(self.names())}")

    def select(self, names: list[str] | None) -> list[Entry]:
        return [self.entry(n) for n in names] if names else list(self.entries)


def entry_name(model_name: str, len_: int, seqs: int, tok: int, tp: int, swept: dict[str, str] | None = None) -> str:
    """``swept``: each engine-argument axis's label for this entry's value (``axis_label``)."""
    extra = "".join(f"-{key}.{label}" for key, label in (swept or {}).items())
    return f"{model_name}--len{len_}-seqs{seqs}-tok{tok}-tp{tp}{extra}"


def axis_label(values: list[Any], index: int) -> str:
    """A scalar names itself (``true``, ``fp8``, ``-5``); a mapping or list its 1-based place in the axis."""
    value = values[index]
    if isinstance(value, (dict, list)):
        return str(index + 1)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return re.sub(r"[^a-z0-9.-]", "", str(value).lower())  # -5 is not 5: the sign stays (1e+20: 1e20)
    text = json.dumps(value) if isinstance(value, bool) else str(value)
    label = re.sub(r"[^a-z0-9._]+", "_", text.lower()).strip("_")
    return label or str(index + 1)


def load_matrix(path: str | Path, check_stack: bool = True) -> Matrix:
    """``check_stack=False``: skip the runner stack's check of engine arguments (aotc/engine_args.py), for
    readers of a matrix a build already checked (fetch, completeness): an init container must not pay the
    stack's import, and a wrong argument there only finds no artifact."""
    path = Path(path)
    try:
        text = read_regular_file(path, MAX_MATRIX_BYTES).decode()
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # not a regular file, too large, not UTF-8
        raise BadInput(f"{path}: cannot read: {exc}") from None
    return parse_matrix(text, str(path), base_dir=path.parent, check_stack=check_stack)


def parse_matrix(text: str, file: str = "<matrix>", base_dir: Path | None = None, check_stack: bool = True) -> Matrix:
    _check_yaml_nodes(text, file)
    try:
        raw = yaml.load(text, Loader=MatrixLoader)
    except yaml.YAMLError as exc:
        raise _invalid_yaml(file, exc) from None
    if not isinstance(raw, dict):
        raise MatrixError(file, "", f"expected a mapping with 'models', got {type(raw).__name__}")
    try:
        spec = MatrixFile.model_validate(raw)
    except ValidationError as exc:
        raise _first_error(file, raw, exc) from None
    return Matrix(path=file, store=spec.store, entries=tuple(_expand(spec, file, base_dir or Path.cwd(), check_stack)))


def _check_yaml_nodes(text: str, file: str) -> None:
    """Before anything is built from the YAML: it holds only what JSON holds (engine values reach vLLM as
    JSON; a date, bytes, a set or a non-string key would fail far from the matrix) and, with every alias
    counted each time it is used, at most MAX_YAML_NODES values (a few hundred bytes of nested aliases
    otherwise expand to billions)."""
    try:
        root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: 5x faster
        if root is not None:
            _NodeCounter(file).count(root, "")
    except RecursionError:
        raise MatrixError(file, "", "invalid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        raise _invalid_yaml(file, exc) from None


def _invalid_yaml(file: str, exc: yaml.YAMLError) -> MatrixError:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return MatrixError(file, where, f"invalid YAML: {problem}")


class _NodeCounter:
    """Values under each YAML node as the loaded document holds them; a node an alias shares is counted once
    per use but walked once."""

    def __init__(self, file: str):
        self.file = file
        self.counted: dict[int, int] = {}
        self.open: set[int] = set()  # nodes being walked: an alias to one of them is a cycle

    def count(self, node: yaml.Node, path: str) -> int:
        if id(node) in self.counted:
            return self.counted[id(node)]
        if id(node) in self.open:
            self.refuse(node, path, "an alias refers to a value that contains it (a recursive structure)")
        if node.tag not in JSON_TAGS:
            fix = "quote it to give a string" if isinstance(node, yaml.ScalarNode) else "use a list or a mapping"
            self.refuse(node, path, f"{_yaml_kind(node)} is not a JSON value; {fix}")
        self.open.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(self.count(item, f"{path}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                total += self.count(value, self.key_path(key, path))
        self.open.discard(id(node))
        if total > MAX_YAML_NODES:
            self.refuse(node, path, f"expands to more than {MAX_YAML_NODES} values (YAML aliases?)")
        self.counted[id(node)] = total
        return total

    def key_path(self, key: yaml.Node, path: str) -> str:
        if key.tag == MERGE_TAG:  # `<<: *defaults` merges into this mapping
            return path
        if key.tag != STR_TAG:
            self.refuse(key, path, f"key {_yaml_kind(key)} is not a string; quote it")
        return f"{path}.{key.value}" if path else key.value

    def refuse(self, node: yaml.Node, path: str, reason: str) -> None:
        raise MatrixError(self.file, path, f"{reason} (line {node.start_mark.line + 1})")


def _yaml_kind(node: yaml.Node) -> str:
    kind = node.tag.rpartition(":")[2] if node.tag.startswith("tag:yaml.org,2002:") else node.tag
    shown = f"{node.value!r} " if isinstance(node, yaml.ScalarNode) else ""
    return f"{shown[:60]}(a YAML {kind})"


def _first_error(file: str, raw: dict, exc: ValidationError) -> MatrixError:
    err = exc.errors()[0]
    loc = list(err["loc"])
    # pydantic reports union branches as extra path parts ('int', 'constrained-int'); drop them
    loc = [p for p in loc if not (isinstance(p, str) and ("[" in p or p in {"int", "str", "bool", "none"}))]
    return MatrixError(file, _key_path(raw, loc), _reason(err))


def _reason(err: dict[str, Any]) -> str:
    """One pydantic error in the matrix's words."""
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    reason = msg.removeprefix("Value error, ")
    if "input" in err and kind not in ("too_short", "value_error"):
        reason += f" (got {err['input']!r})"
    return reason


def _key_path(raw: Any, loc: list) -> str:
    parts: list[str] = []
    node = raw
    for p in loc:
        if isinstance(p, int):
            label = None
            if isinstance(node, list) and p < len(node) and isinstance(node[p], dict) and "name" in node[p]:
                label = node[p]["name"]
            parts[-1] = f"{parts[-1]}[{label!r}]" if label and parts else f"{parts[-1] if parts else ''}[{p}]"
        else:
            parts.append(str(p))
        node = node[p] if isinstance(node, (list, dict)) and _has(node, p) else None
    return ".".join(parts)


def _has(node: list | dict, key: Any) -> bool:
    return key in node if isinstance(node, dict) else isinstance(key, int) and key < len(node)


def _merge(defaults: Settings, model: ModelSpec) -> dict[str, Any]:
    merged = dict(DEFAULTS)
    engine: dict[str, Any] = {}
    env: dict[str, Any] = {}
    for layer in (defaults, model):
        for key in DEFAULTS:
            value = getattr(layer, key)
            if value is not None:
                merged[key] = value
        if layer.engine is not None:
            engine.update(layer.engine.model_dump(exclude_none=True))
        if layer.env is not None:
            env.update({var: value for var, value in layer.env.items() if value is not None})
    merged["engine"], merged["env"] = engine, env
    return merged


def _expand(spec: MatrixFile, file: str, base_dir: Path, check_stack: bool) -> list[Entry]:
    entries: list[tuple[Entry, str]] = []
    seen: dict[str, str] = {}
    for index, model in enumerate(spec.models):
        where = f"models[{model.name!r}]"
        settings = _merge(spec.defaults, model)
        _check_env(settings["env"], load_runner(settings["runner"]), file,
                   lambda var: f"{where if var in (model.env or {}) else 'defaults'}.env.{var}")
        model_path = _local_model_dir(model.model, base_dir)
        if model_path:
            hf_config = _read_model_config(model_path, file, where)
        elif cached := cached_file(model.model, "config.json", model.revision):
            hf_config = _read_config_file(cached, file, where)
        else:
            hf_config = None
        axes = model.matrix
        try:
            swept = axes.engine_axes()
        except ValueError as exc:
            raise MatrixError(file, f"{where}.matrix", str(exc)) from None
        for key in swept.keys() & settings["engine"].keys():
            raise MatrixError(file, f"{where}.matrix.{key}", "set both as an axis and under engine:")
        _check_axis_values(swept, file, where)
        for len_, seqs, tok, tp, *picks in itertools.product(
            axes.max_model_len, axes.max_num_seqs, axes.max_num_batched_tokens, axes.tensor_parallel_size,
            *(range(len(values)) for values in swept.values())
        ):
            chosen = {key: values[i] for (key, values), i in zip(swept.items(), picks)}
            labels = {key: axis_label(values, i) for (key, values), i in zip(swept.items(), picks)}
            name = entry_name(model.name, len_, seqs, tok, tp, labels)
            if name in seen:
                raise MatrixError(file, f"models[{index}].name",
                                  f"duplicate entry name {name!r} (also from {seen[name]})")
            seen[name] = f"models[{index}]"
            if not PLAIN_NAME.fullmatch(name):  # it names the artifact's store path (aotc/store/layout.py)
                raise MatrixError(file, f"{where}.matrix", f"entry name {name[:80]!r}... is {len(name)} characters; "
                                  "a store takes at most 200: shorten the model name or the swept values")
            engine = _with_local_draft(decoded_json_args({**settings["engine"], **chosen}), base_dir, file,
                                       f"{where}.{'matrix' if 'speculative_config' in chosen else 'engine'}")
            entry = Entry(name=name, model_name=model.name, model=model.model, revision=model.revision,
                          max_model_len=len_, max_num_seqs=seqs, max_num_batched_tokens=tok,
                          tensor_parallel_size=tp, model_path=str(model_path) if model_path else None,
                          **{**settings, "engine": engine})
            _check_entry(entry, with_hf_overrides(hf_config, entry.engine), file, where)
            entries.append((entry, where, frozenset(swept)))
    if check_stack:
        _check_engine_args(entries, file)
    return [entry for entry, *_ in entries]


def _check_axis_values(swept: dict[str, list[Any]], file: str, where: str) -> None:
    """Each value of an engine-argument axis is what ``engine:`` would take: the same types and bounds."""
    for key, values in swept.items():
        for index, value in enumerate(values):
            try:
                EngineArgs.model_validate({key: value})
            except ValidationError as exc:
                raise MatrixError(file, f"{where}.matrix.{key}[{index}]", _reason(exc.errors()[0])) from None


def _check_engine_args(entries: list[tuple[Entry, str, frozenset[str]]], file: str) -> None:
    """Each runner's ``vllm serve`` parser, in its own interpreter, on every entry's ``engine:``; an error
    names the key where the matrix set it (``engine.X`` or, for a swept argument, ``matrix.X``)."""
    for runner in dict.fromkeys(entry.runner for entry, *_ in entries):
        mine = [item for item in entries if item[0].runner == runner]
        verdicts = stack_verdicts(runner_python(runner), runner_versions(runner), [item[0].engine for item in mine],
                                  load_runner(runner).packages)
        for (entry, where, swept), verdict in zip(mine, verdicts):
            if verdict:
                flag = re.search(r"(--[a-z0-9][a-z0-9-]*)", verdict)  # the first flag it names is the culprit
                key = _flag_key(flag[1], entry.engine) if flag else ""
                path = f"{where}.{'matrix' if key in swept else 'engine'}" + (f".{key}" if key else "")
                raise MatrixError(file, path, f"vllm serve ({runner}): {verdict}")


def _flag_key(flag: str, engine: dict[str, Any]) -> str:
    """The engine key a flag spells: ``--no-x`` is ``x: false``."""
    key = normalize(flag)
    return key if key in engine else key.removeprefix("no_")


def _local_model_dir(model: str, base_dir: Path) -> Path | None:
    """A model given as a path (absolute, ./ or ../, or an existing dir beside the config) is local."""
    candidate = Path(model).expanduser()
    if not candidate.is_absolute():
        candidate = base_dir / candidate
    looks_like_path = model.startswith(("/", "./", "../", "~")) or candidate.is_dir()
    return candidate.resolve() if looks_like_path else None


def _with_local_draft(engine: dict[str, Any], base_dir: Path, file: str, where: str) -> dict[str, Any]:
    """A speculative draft model given as a local dir lies beside the matrix, as ``model:`` does; the runner
    (another process, another cwd) gets its absolute path."""
    spec = engine.get("speculative_config")
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), str):
        return engine
    draft = _local_model_dir(spec["model"], base_dir)
    if draft is None:
        return engine
    _read_model_config(draft, file, f"{where}.speculative_config")
    return {**engine, "speculative_config": {**spec, "model": str(draft)}}


def _read_model_config(model_dir: Path, file: str, where: str) -> dict[str, Any]:
    config = model_dir / "config.json"
    if not config.is_file():
        raise MatrixError(file, where + ".model", f"local model dir has no config.json: {model_dir}")
    return _read_config_file(config, file, where)


def _read_config_file(config: Path, file: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(read_regular_file(config, MAX_CONFIG_JSON_BYTES))
    except OSError as exc:
        raise MatrixError(file, where + ".model", f"{config}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MatrixError(file, where + ".model", f"{config} is not valid JSON: {exc}") from None
    except ValueError as exc:  # not a regular file, too large
        raise MatrixError(file, where + ".model", f"{config}: {exc}") from None
    if not isinstance(data, dict):
        raise MatrixError(file, where + ".model", f"{config} is not a JSON object")
    return data


def _check_entry(entry: Entry, hf_config: dict | None, file: str, where: str) -> None:
    if problems := entry_problems(entry, hf_config):
        key, _, reason = problems[0].partition(": ")
        raise MatrixError(file, f"{where}.{key}", reason)


def entry_problems(entry: Entry, hf_config: dict | None) -> list[str]:
    """Every refusal of an entry, one ``KEY.PATH: reason`` a line (the key path relative to the model): a device
    its runner does not build for, what cannot run on the named TPU, and the runner's own rules (what vLLM
    itself rejects at start-up, what its plan does not follow: ``RunnerSpec.validate``); [] when valid."""
    runner = entry.backend
    if entry.device not in runner.devices:
        return [f"device: runner {runner.name} builds for {', '.join(runner.devices)}, not {entry.device!r}"]
    return _tpu_problems(entry) + runner.validate(entry, hf_config)


def _check_env(env: dict[str, Any], runner: RunnerSpec, file: str, path_of: Callable[[str], str]) -> None:
    """``env:`` sets only what the entry's runner lets a matrix set (``RunnerSpec.matrix_env``: variables its
    stack reads and the fingerprint hashes, of the type it takes): anything else would reach the runner's
    process unhashed, not matter at all, or change what the stack compiles behind the plan's back.
    ``path_of``: where the matrix set a variable."""
    for var, value in env.items():
        if var not in runner.matrix_env():
            raise MatrixError(file, path_of(var), _unsettable(var, runner))
        try:
            _env_type(runner.name, var).validate_python(value)
        except ValidationError as exc:
            raise MatrixError(file, path_of(var), _reason(exc.errors()[0])) from None


def _unsettable(var: str, runner: RunnerSpec) -> str:
    stack = f"runner {runner.name}'s stack"
    if var in runner.env_unhashed:
        return f"{stack} reads it but it changes no graph ({runner.env_unhashed[var]})"
    if var in runner.env_vars:
        return (f"{stack} reads it but its plan does not follow it; a matrix sets only "
                f"{', '.join(sorted(runner.matrix_env()))}")
    if any(var in spec.matrix_env() for spec in registered().values()):
        return f"{stack} does not read it"
    return "unknown key"


@functools.cache
def _env_type(runner: str, var: str) -> TypeAdapter:
    return TypeAdapter(load_runner(runner).matrix_env()[var])


def _tpu_problems(entry: Entry) -> list[str]:
    """A tensor-parallel group is a set of JAX devices of one host with a valid chip topology (libtpu's
    TPU_CHIPS_PER_PROCESS_BOUNDS: 1, 2, 4 or 8 chips); the CPU twin has no such limit."""
    if entry.device != "tpu":
        return []
    tp, accelerator = entry.tensor_parallel_size, parse_accelerator(entry.accelerator)
    if tp > accelerator.host_devices:
        return [f"matrix.tensor_parallel_size: {tp} exceeds the {_host(accelerator)}"]
    if tp & (tp - 1):
        return [f"matrix.tensor_parallel_size: {tp} devices is not a TPU topology on {entry.accelerator} "
                "(a power of two: libtpu's process bounds take 1, 2, 4 or 8 chips)"]
    return []


def _host(accelerator: Accelerator) -> str:
    """'8 JAX devices of a v7x-8 host (4 chips, 2 devices a chip; ...)': the figures a limit comes from."""
    generation = accelerator.generation
    per_chip = f"{generation.devices_per_chip} device{'s' if generation.devices_per_chip > 1 else ''} a chip"
    counted = (f"; the {accelerator.name.rpartition('-')[2]} of {accelerator.name} counts TensorCores, "
               f"{generation.cores_per_chip_in_name} a chip" if generation.cores_per_chip_in_name > 1 else "")
    return (f"{accelerator.host_devices} JAX devices of a {accelerator.name} host ({accelerator.host_chips} chips, "
            f"{per_chip}{counted})")
