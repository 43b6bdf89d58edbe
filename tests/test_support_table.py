"""docs/support.md's table is generated (tests/support_table.py) from the matrices the suite builds and the case
lists its slow tests parametrize over (tests/support_cases.py): it cannot drift from the suite while these pass.
No stack needed: the matrices are read without the runner's check, the test modules by their source."""

from __future__ import annotations

import ast
import difflib
import json
import os
import subprocess
import sys

import pytest

from tests.support_cases import REPO, SUITES
from tests.support_table import DOC, generated_section, load_records, table


def test_the_generated_support_table_is_current():
    """A matrix entry added, renamed or removed, a test moved, a canary added: the page says so, or this fails."""
    on_page, fresh = generated_section(DOC.read_text()), table()
    diff = "\n".join(difflib.unified_diff(on_page.splitlines(), fresh.splitlines(), "docs/support.md", "generated",
                                          lineterm="", n=0))
    if on_page != fresh:
        pytest.fail(f"docs/support.md's support table is stale: run `make support-table`\n{diff[:3000]}", pytrace=False)


def test_every_evidence_test_is_a_test_function_of_its_module():
    """The tests the table names exist where it says (a renamed or moved test fails here, not on the page)."""
    for suite in SUITES:
        for check in filter(None, (suite.build, suite.verify, suite.canary)):
            module = REPO / check.module
            assert module.is_file(), f"{suite.matrix}: {check.module} does not exist"
            functions = {node.name for node in ast.parse(module.read_text()).body if isinstance(node, ast.FunctionDef)}
            assert check.function in functions, f"{suite.matrix}: {check.test} is not a test of {check.module}"


def test_the_case_lists_name_entries_of_their_matrix():
    """A case list naming an entry its matrix no longer has would drop that entry's test silently."""
    for suite in SUITES:
        names = {entry.model_name for entry in suite.entries()}
        for listed in (suite.built or (), suite.served or (), suite.not_served):
            assert set(listed) <= names, (suite.matrix, sorted(set(listed) - names))


RECORDING_CONFTEST = """
from tests.helpers import support_records
from tests.helpers.support_records import pytest_runtest_makereport
from tests.support_cases import SUITES

SUITE = SUITES[0]
ENTRY = SUITE.entries()[0]
support_records.evidence = lambda: {"test_cases.py::test_built": [(SUITE, ENTRY, "build")],
                                    "test_cases.py::test_verify_fails": [(SUITE, ENTRY, "verify")]}
"""
RECORDING_TESTS = """
import json
from tests.helpers.support_records import saw
from tests.support_cases import SUITES

ENTRY = SUITES[0].entries()[0].name

def test_built():
    built = {"entry": ENTRY, "planned": 23, "graphs_with_keys": 23}
    saw(["build", "m.yaml", "--json"], json.dumps({"entries": [built]}))

def test_verify_fails():
    saw(["verify", "a", "--json"], json.dumps({"entry": ENTRY, "misses": 1, "traffic_requests": 8}))
    assert False
"""


@pytest.mark.parametrize("records_on", [True, False])
def test_a_passing_evidence_test_leaves_a_record_the_table_shows(tmp_path, records_on):
    """Under pytest, with $AOTC_SUPPORT_RECORDS set, a passing evidence test writes its stage's record with the
    figures its CLI run printed, a failing one writes none, and the table renders the record as "Last measured";
    unset, nothing is written."""
    (tmp_path / "conftest.py").write_text(RECORDING_CONFTEST)
    (tmp_path / "test_cases.py").write_text(RECORDING_TESTS)
    records = tmp_path / "records"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "AOTC_SUPPORT_RECORDS": str(records) if records_on else ""}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "test_cases.py"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-3000:]
    suite, entry = SUITES[0], SUITES[0].entries()[0]
    written = sorted(p.relative_to(records).as_posix() for p in records.rglob("*.json")) if records.exists() else []
    if not records_on:
        assert written == []
        return
    assert written == [f"{suite.name}/{entry.name}.build.json"]
    record = json.loads((records / written[0]).read_text())
    assert record["test"] == "test_cases.py::test_built" and (record["planned"], record["built"]) == (23, 23)
    [row] = [line for line in table(load_records(records)).splitlines()
             if line.startswith(f"| `{entry.model_name}` · [{suite.name}](")]
    assert row.endswith(f"| 23/23 built ({record['date']}) |"), row


def test_the_readme_summary_links_to_the_generated_table():
    readme = (REPO / "README.md").read_text()
    assert "docs/support.md#in-the-suite" in readme
    assert "## In the suite" in DOC.read_text()
