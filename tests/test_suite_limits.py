"""The suite's own limits (pytest.ini, tests/conftest.py): a hung test, a worker the kernel kills and a test that
runs away with memory each fail the run in seconds, naming the test, instead of leaving it to wait for CI's limit;
a passing test's files do not outlive it."""

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import warm_python

REPO = Path(__file__).resolve().parents[1]
# as tests/conftest.py groups the real tests: one group per file, which is where a replaced worker used to hang
GROUPS = """import pytest
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(item.module.__name__))
"""


def run_suite(folder, *options):
    """pytest with this repo's pytest.ini (two workers) on the test files in `folder`: (seconds, exit code, output)."""
    (folder / "conftest.py").write_text(GROUPS)
    command = [sys.executable, "-m", "pytest", "-c", REPO / "pytest.ini", "--rootdir", folder, "-p", "no:cacheprovider"]
    command += [*options, folder]
    start = time.time()
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=240)
    return time.time() - start, result.returncode, result.stdout + result.stderr


def test_a_hung_test_fails_after_its_time_limit_with_its_name(tmp_path):
    (tmp_path / "test_hangs.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(600)\n")
    seconds, code, output = run_suite(tmp_path, "-o", "timeout=3")
    assert code == 1 and "FAILED test_hangs.py::test_hangs" in output and "Timeout" in output, output
    assert seconds < 120


def test_a_files_tests_share_one_worker_so_its_module_fixtures_are_built_once(tmp_path):
    """tests/conftest.py's groups reach pytest-xdist: else each worker builds a file's module fixtures (an export of
    every format, a trained model) again, which once doubled the suite's time unnoticed (requirements-dev.txt)."""
    counted = "import os, time, pytest\n\n@pytest.fixture(scope='module')\ndef built():\n"
    counted += "    with open('built.txt', 'a') as f:\n        f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n\n"
    tests = "".join(f"def test_{k}(built):\n    time.sleep(0.3)\n\n" for k in range(6))
    (tmp_path / "test_grouped.py").write_text(counted + tests)
    _, code, output = run_suite(tmp_path)
    assert code == 0, output
    assert len((tmp_path / "built.txt").read_text().split()) == 1, "the module fixture was built on both workers"


def test_a_killed_worker_stops_the_run_naming_its_test(tmp_path):
    """The kernel's out-of-memory killer, as SIGKILL: the run ends with the test named (a replaced worker would have
    left --dist loadgroup waiting for the rest of the killed worker's group forever)."""
    killed = "import os, signal\n\ndef test_first():\n    pass\n\ndef test_killed():\n    os.kill(os.getpid(), 9)\n"
    (tmp_path / "test_killed.py").write_text(killed + "\ndef test_after():\n    pass\n")
    (tmp_path / "test_other.py").write_text("import time\n\ndef test_other():\n    time.sleep(2)\n")
    seconds, code, output = run_suite(tmp_path)
    assert code == 1 and "crashed while running 'test_killed.py::test_killed" in output, output
    assert seconds < 120


def test_a_passing_tests_files_are_deleted_as_it_ends_and_a_failing_ones_are_kept(tmp_path):
    """The suite writes about 5 GB of checkpoints and exports; kept to the end, they filled a CI machine's disk."""
    wrote = "def wrote(tmp_path, name):\n    (tmp_path / 'last.pt').write_bytes(bytes(1000))\n"
    wrote += "    with open(name, 'w') as f:\n        f.write(str(tmp_path))\n\n"
    tests = "def test_passes(tmp_path):\n    wrote(tmp_path, 'passed.txt')\n\n"
    tests += "def test_fails(tmp_path):\n    wrote(tmp_path, 'failed.txt')\n    assert False\n"
    (tmp_path / "test_files.py").write_text(wrote + tests)
    _, code, output = run_suite(tmp_path, "--basetemp", tmp_path / "basetemp")
    assert code == 1 and "FAILED test_files.py::test_fails" in output, output
    assert not Path((tmp_path / "passed.txt").read_text()).exists()
    assert (Path((tmp_path / "failed.txt").read_text()) / "last.pt").is_file()


def test_a_test_that_runs_away_with_memory_fails_with_a_memory_error():
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert soft != resource.RLIM_INFINITY and soft <= physical  # so the allocation below is refused, never made
    with pytest.raises(MemoryError):
        bytearray(soft + 2**30)


def test_a_warm_run_gets_the_threads_a_new_python_would(tmp_path, monkeypatch):
    """tests/warm_python.py forks a server that imported torch: after a library changed the worker's environment
    (`import paddle` sets OMP_NUM_THREADS=1), its forks must run as a `python` started now does, or a resume test that
    compares a warm run with a started one is not bitwise."""
    script = tmp_path / "threads.py"
    script.write_text("import torch\nprint(torch.get_num_threads())\n")
    cold = lambda: subprocess.run([sys.executable, script], capture_output=True, text=True).stdout.strip()  # noqa: E731
    warm = lambda: warm_python.run([sys.executable, str(script)], tmp_path).stdout.strip()  # noqa: E731
    assert warm() == cold()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert warm() == cold() == "1"


def test_the_readme_test_command_installs_what_ci_installs_and_runs_what_ci_runs():
    """README "Tests": the quick command installs requirements-dev.txt (an export format's tests then skip, naming
    its pip line: tests/runtimes.py); the whole one installs what .ci/run installs, and both run CI's test command: a
    package that .ci/run alone installed (tf_keras once was) failed test_deploy.py on a fresh clone that followed the
    README."""
    readme = (REPO / "README.md").read_text()
    commands = readme.split("## Tests", 1)[1].split("```", 2)[1].splitlines()
    ci = (REPO / ".ci" / "run").read_text()
    installs = [
        line.split("pip install", 1)[1].replace(" -q", "").strip() for line in ci.splitlines() if "pip install" in line
    ]
    installs = [words for words in installs if words != "--upgrade pip"]
    test_command = next(line.split(".venv/bin/", 1)[1] for line in ci.splitlines() if "pytest" in line)
    quick = f"pip install -r requirements-dev.txt && {test_command}"
    assert any(line.startswith(quick) for line in commands), (quick, commands)
    whole = " && ".join([*(f"pip install {words}" for words in installs), test_command])
    assert len(installs) >= 2 and any(line.startswith(whole) for line in commands), (whole, commands)
