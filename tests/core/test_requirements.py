"""A missing browser or Lightning skips a test locally and fails it in CI; .ci/run agrees."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _requirements import find_browser, in_ci, require, require_module

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]


def _env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def test_ci_is_read_from_the_ci_variable() -> None:
    assert in_ci({"CI": "true"}) and in_ci({"CI": "TRUE"}) and in_ci({"CI": "1"}) and in_ci({"CI": "yes"})
    assert not in_ci({}) and not in_ci({"CI": ""}) and not in_ci({"CI": "false"}) and not in_ci({"CI": "0"})


def test_a_missing_requirement_skips_locally_with_the_reason() -> None:
    with pytest.raises(pytest.skip.Exception, match="no Chromium binary"):
        require(False, "no Chromium binary on PATH", ci=False)


def test_a_missing_requirement_fails_in_ci_saying_why() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"no Chromium binary on PATH; CI is set \(CI=true\)"):
        require(False, "no Chromium binary on PATH", ci=True)


def test_a_requirement_that_is_there_neither_skips_nor_fails() -> None:
    assert require(True, "anything", ci=True) is None
    assert require(True, "anything", ci=False) is None


def test_find_browser_looks_only_on_the_path_given(tmp_path: Path) -> None:
    assert find_browser(str(tmp_path)) is None
    browser = tmp_path / "chromium-browser"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    assert find_browser(str(tmp_path)) == str(browser)


def _lightning_callback_with(blocked: str, ci: str | None) -> str:
    """What require_lightning_callback() does in a fresh interpreter where ``blocked`` cannot be imported."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        f"sys.modules[{blocked!r}] = None  # Python's own way to make an import fail\n"
        "import pytest\n"
        "from _requirements import require_lightning_callback\n"
        "try:\n"
        "    print('returned', require_lightning_callback().__name__)\n"
        "except pytest.skip.Exception as e:\n"
        "    print('skipped:', e.msg)\n"
        "except pytest.fail.Exception as e:\n"
        "    print('failed:', e.msg)\n"
        "except ImportError as e:\n"
        "    print('ImportError:', type(e).__name__, e.name)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(CI=ci),
                            timeout=240, check=True)
    return result.stdout.strip()


def test_the_ddp_tests_skip_locally_only_when_lightning_itself_is_absent() -> None:
    assert _lightning_callback_with("pytorch_lightning", ci=None).startswith(
        "skipped: PyTorch Lightning is not installed")


def test_the_ddp_tests_fail_in_ci_when_lightning_is_absent() -> None:
    out = _lightning_callback_with("pytorch_lightning", ci="true")
    assert out.startswith("failed: PyTorch Lightning is not installed") and "CI=true" in out


def test_the_ddp_tests_never_skip_when_leafwatchs_own_callback_does_not_import() -> None:
    require_module("pytorch_lightning")  # only Lightning there tells leafwatch's own import error apart
    out = _lightning_callback_with("leafwatch.integrations.lightning", ci=None)
    assert out == "ImportError: ModuleNotFoundError leafwatch.integrations.lightning"


def test_the_lightning_callback_is_returned_when_everything_imports() -> None:
    require_module("pytorch_lightning")
    assert _lightning_callback_with("an_unrelated_module", ci="true") == "returned LeafWatch"


def _browser_tests(ci: str | None) -> subprocess.CompletedProcess:
    """tests/dashboard/test_dashboard_browser.py run with no browser on PATH (only this Python's folder)."""
    env = _env(CI=ci, PATH=str(Path(sys.executable).parent))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           str(TESTS / "dashboard" / "test_dashboard_browser.py")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_browser_tests_skip_locally_without_a_browser_with_the_reason() -> None:
    result = _browser_tests(ci=None)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "skipped" in result.stdout and "failed" not in result.stdout and "error" not in result.stdout
    assert "no Chromium binary on PATH" in result.stdout


@pytest.mark.slow
def test_the_browser_tests_fail_in_ci_without_a_browser() -> None:
    result = _browser_tests(ci="true")
    assert result.returncode == 1, result.stdout[-3000:]
    assert "skipped" not in result.stdout and "passed" not in result.stdout
    assert "no Chromium binary on PATH" in result.stdout and "CI=true" in result.stdout


def _ci_run_without_apt_or_chromium(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    """.ci/run with a PATH holding only bash and dirname: no apt-get, no chromium, no python3."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        found = shutil.which(tool)
        assert found is not None, f"{tool} is needed to run .ci/run"
        (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([str(bin_dir / "bash"), str(REPO / ".ci" / "run")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_ci_run_fails_in_ci_when_chromium_cannot_be_installed(tmp_path: Path) -> None:
    result = _ci_run_without_apt_or_chromium(tmp_path, ci="true")
    assert result.returncode == 1
    assert "error: could not install chromium" in result.stderr
    assert "python3" not in result.stderr  # it stopped before the tests


def test_ci_run_outside_ci_warns_and_goes_on_to_the_tests(tmp_path: Path) -> None:
    result = _ci_run_without_apt_or_chromium(tmp_path, ci=None)
    assert "warning: could not install chromium; the browser tests will be skipped" in result.stderr
    # It went on to the README's test command, which cannot start without python3 on this PATH.
    assert result.returncode == 127 and "python3: command not found" in result.stderr
