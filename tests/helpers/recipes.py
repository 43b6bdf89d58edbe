"""The ``aotc`` command lines the recipes run (configs/k8s, configs/ci), as argv lists the real parser can take.

A recipe runs aotc three ways: a container's ``command`` list (``["aotc", "fetch", ...]``), a container's shell
script (``["/bin/sh", "-c", script]``) and a CI step's ``run`` script. A script is split the way sh splits it:
into simple commands at ``;``, ``&&``, ``||``, ``|``, ``&`` and newlines, redirections and heredoc bodies
dropped, a leading ``if``/``then``/``else``/``do`` skipped. Variables and command substitutions become their
value where the recipe gives one (a CI job's ``env``, a container's ``env``, the caller's), else a placeholder
word; an ``aotc`` call inside a substitution is not looked for (``aotc_mentions`` counts what a script holds, so
a test can see none was missed).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

PLACEHOLDER = "UNSET"
SHELLS = ("/bin/sh", "sh", "/bin/bash", "bash")
KEYWORDS = {"if", "then", "else", "elif", "do", "while", "until", "!", "time", "{"}
CONTROL = {";", ";;", "&", "&&", "|", "||", "(", ")"}
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
FD_BEFORE_REDIRECT = re.compile(r"(?<![^\s;&|(])\d+(?=[<>])")
# `aotc` as a command word: not part of a path (.aotc/, /aotc/), a name (aotc-logs) or a variable (AOTC_STORE)
MENTION = re.compile(r"(?<![\w/.$-])aotc\s+[a-z]")


@dataclass(frozen=True)
class CommandLine:
    where: str  # the recipe, and the step or container
    argv: list[str]

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def substitute(text: str, values: Mapping[str, str]) -> str:
    """$(NAME) (Kubernetes' expansion, or a command substitution), ${NAME}, $NAME and ${{ expr }} (GitHub
    Actions): the value ``values`` gives, else PLACEHOLDER."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("${{", i):
            end = text.index("}}", i) + 2
            out.append(PLACEHOLDER)
        elif text.startswith("$(", i):
            end = closing_paren(text, i + 1) + 1
            out.append(values.get(text[i + 2:end - 1].strip(), PLACEHOLDER))
        elif (match := VARIABLE.match(text, i)):
            end = match.end()
            out.append(values.get(match[1] or match[2], PLACEHOLDER))
        else:
            end = i + 1
            out.append(text[i])
        i = end
    return "".join(out)


def closing_paren(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced $( in {text!r}")


def script_lines(script: str) -> Iterator[str]:
    """The script's lines, continuation lines joined, heredoc bodies left out."""
    delimiter = None
    for line in script.replace("\\\n", " ").splitlines():
        if delimiter is not None:
            delimiter = None if line.strip() == delimiter else delimiter
            continue
        if (match := HEREDOC.search(line)):
            delimiter = match[2]
        yield line


def simple_commands(line: str) -> Iterator[list[str]]:
    lexer = shlex.shlex(FD_BEFORE_REDIRECT.sub("", line), posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    redirect = False
    for token in lexer:
        if redirect:  # the redirection's target is no argument
            redirect = False
        elif token in CONTROL:
            yield words
            words = []
        elif token[0] in "<>":
            redirect = True
        elif words or token not in KEYWORDS:
            words.append(token)
    yield words


def calls(script: str, program: str, values: Mapping[str, str]) -> list[list[str]]:
    """Each simple command of a shell script that runs ``program``."""
    return [words for line in script_lines(script) for words in simple_commands(substitute(line, values))
            if words[:1] == [program]]


def aotc_calls(script: str, values: Mapping[str, str]) -> list[list[str]]:
    return calls(script, "aotc", values)


def aotc_mentions(script: str) -> int:
    """How many times ``aotc COMMAND`` appears in a script's text, heredoc bodies and comments left out."""
    return sum(len(MENTION.findall(without_comment(line))) for line in script_lines(script))


def without_comment(line: str) -> str:
    return "" if line.lstrip().startswith("#") else line.split(" #", 1)[0]


def plain_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def containers(node: object, where: str) -> Iterator[tuple[str, dict]]:
    """Every container and init container of a Kubernetes document, wherever its pod template is."""
    if isinstance(node, dict):
        for key in ("initContainers", "containers"):
            for container in node.get(key, []) if isinstance(node.get(key), list) else []:
                yield f"{where}/{container['name']}", container
        for value in node.values():
            yield from containers(value, where)
    elif isinstance(node, list):
        for value in node:
            yield from containers(value, where)


def container_commands(name: str, documents: list[dict]) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    """(where, command + args, its env's plain values) for each container of the documents."""
    for doc in documents:
        for where, container in containers(doc, f"{name}:{doc['kind']}/{doc['metadata']['name']}"):
            yield where, [*container.get("command", []), *container.get("args", [])], plain_env(container)


def workflow_scripts(name: str, workflow: dict) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(where, script, the variables it sees from the workflow's, job's and step's env) for each run step."""
    for job_name, job in workflow.get("jobs", {}).items():
        for index, step in enumerate(job.get("steps", [])):
            if "run" in step:
                env = {**workflow.get("env", {}), **job.get("env", {}), **step.get("env", {})}
                yield (f"{name}:{job_name}/{step.get('name', index)}", step["run"],
                       {k: str(v) for k, v in env.items()})


def is_shell(command: list[str]) -> bool:
    return command[:1] != [] and command[0] in SHELLS and command[1:2] == ["-c"]


def recipe_scripts(name: str, documents: list[dict]) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(where, shell script, its variables) for each script a recipe runs: a CI step's, a container's sh -c."""
    for document in documents:
        if "jobs" in document and "kind" not in document:
            yield from workflow_scripts(name, document)
    kubernetes = [d for d in documents if "kind" in d]
    yield from ((where, command[2], env) for where, command, env in container_commands(name, kubernetes)
                if is_shell(command))


def recipe_command_lines(name: str, documents: list[dict],
                         values: Mapping[str, str] | None = None) -> list[CommandLine]:
    """Every aotc command line of a recipe (Kubernetes documents or a CI workflow). ``values``: variables the
    recipe leaves to its runtime, e.g. JOB_COMPLETION_INDEX."""
    values = values or {}
    kubernetes = [d for d in documents if "kind" in d]
    lines = [CommandLine(where, [substitute(word, {**env, **values}) for word in command])
             for where, command, env in container_commands(name, kubernetes) if command[:1] == ["aotc"]]
    lines += [CommandLine(where, argv) for where, script, env in recipe_scripts(name, documents)
              for argv in aotc_calls(script, {**env, **values})]
    return lines


def recipe_aotc_mentions(name: str, documents: list[dict]) -> int:
    """``aotc COMMAND`` as the recipe's text holds it: direct container commands and in its scripts."""
    kubernetes = [d for d in documents if "kind" in d]
    direct = sum(command[:1] == ["aotc"] for _, command, _ in container_commands(name, kubernetes))
    return direct + sum(aotc_mentions(script) for _, script, _ in recipe_scripts(name, documents))
