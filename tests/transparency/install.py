"""Completes the ``ecosystem`` extra for the transparency suite, in the environment that runs it.

Run it with that environment's Python after ``pip install torch==2.13.0 -e ".[ecosystem]"``
(``.ci/run`` does). Two things pip's resolver cannot do:

- torchtune 0.6.1 imports its NF4 tensor from torchao 0.10.0, and peft refuses to import beside
  any torchao older than 0.16. torchao 0.10.0 goes into its own folder,
  ``<sys.prefix>/transparency-torchao`` (``pip install --no-deps --target``), which only the
  torchtune scenarios put on ``PYTHONPATH``: the environment itself has no torchao.
- torchvision 0.28.0 (the version for torch 2.13, pinned in the extra) is found here only as a CUDA
  build, whose C extension cannot load against the CPU torch. ``cpu_torchvision.py`` goes into
  ``site-packages`` with a ``.pth`` line that imports it at start-up: it defines the two operator
  schemas torchvision's import expects, just before torchvision is first imported, when (and only
  when) the extension cannot load.

Then it imports each library of the suite in a fresh process and exits 1 naming any that fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
TORCHAO = "torchao==0.10.0"
TORCHAO_TARGET = Path(sys.prefix) / "transparency-torchao"
PTH_NAME = "cpu_torchvision.pth"
#: What must import in the environment itself, and with torchao on PYTHONPATH.
IMPORTS = ("torchvision", "timm", "ultralytics", "opacus", "higher", "pytorch_metric_learning", "torchrl",
           "x_transformers", "diffusers", "torch_geometric", "peft", "transformers", "pytorch_lightning")
TORCHTUNE_IMPORTS = ("torchtune.models.llama2", "torchtune.modules.peft")


def install_torchao() -> None:
    installed = TORCHAO_TARGET / "torchao-0.10.0.dist-info"
    if installed.is_dir():
        return
    if TORCHAO_TARGET.exists():
        shutil.rmtree(TORCHAO_TARGET)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(TORCHAO_TARGET),
                    TORCHAO], check=True)


def install_torchvision_schemas() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    shutil.copyfile(HERE / "cpu_torchvision.py", site / "cpu_torchvision.py")
    (site / PTH_NAME).write_text("import cpu_torchvision\n", encoding="utf-8")


#: Tries each import in one process and prints ``module: error`` for each that fails.
CHECK = """
import importlib, sys
for module in sys.argv[1:]:
    try:
        importlib.import_module(module)
    except Exception as error:
        print(f"{module}: {type(error).__name__}: {error}".splitlines()[0])
"""


def failed_imports(modules: tuple[str, ...], pythonpath: str | None = None) -> list[str]:
    """The imports that fail in a fresh process of this Python, each with its error."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    result = subprocess.run([sys.executable, "-c", CHECK, *modules], capture_output=True, text=True, env=env)
    return result.stdout.splitlines() if result.returncode == 0 else [f"{modules}: {result.stderr[-500:]}"]


def main() -> int:
    install_torchao()
    install_torchvision_schemas()
    failed = failed_imports(IMPORTS) + failed_imports(TORCHTUNE_IMPORTS, str(TORCHAO_TARGET))
    if failed_imports(("torchao",)) == []:
        failed.append("torchao: importable in the environment itself, where peft refuses torchao < 0.16: "
                      "pip uninstall torchao (the suite keeps its own under " f"{TORCHAO_TARGET})")
    for line in failed:
        print(f"tests/transparency/install.py: cannot import {line}", file=sys.stderr)
    if failed:
        print('tests/transparency/install.py: install the extra first: pip install torch==2.13.0 -e ".[ecosystem]"',
              file=sys.stderr)
        return 1
    print(f"tests/transparency/install.py: {len(IMPORTS) + len(TORCHTUNE_IMPORTS)} imports work; torchao 0.10.0 in "
          f"{TORCHAO_TARGET}; torchvision's schemas from {PTH_NAME}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
