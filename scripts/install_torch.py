"""Install PyTorch into the running Python without pulling a multi-GB CUDA build onto a machine
that has no NVIDIA GPU.

* torch already importable → nothing to do.
* an NVIDIA GPU (``nvidia-smi`` works) → the normal wheel from the package index.
* no GPU → a CPU build: the one pip would pick anyway if it is a CPU build; else a CPU build
  from the local wheel folders pip is configured with (``find-links``); else PyTorch's own
  CPU-only index. A wheel is a CPU build when it requires no ``nvidia-*`` packages.

Usage: python scripts/install_torch.py   (override with TORCH_SPEC, e.g. TORCH_SPEC="torch==2.11.*")
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from urllib.parse import urlparse
from urllib.request import url2pathname

SPEC = os.environ.get("TORCH_SPEC", "torch>=2.4")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PIP = [sys.executable, "-m", "pip"]


def have_torch() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def have_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


def candidate(*extra: str) -> tuple[str, bool] | None:
    """(url, is_cpu_build) of the torch wheel pip would choose, without installing it."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = PIP + ["install", "--quiet", "--dry-run", "--ignore-installed", "--no-deps",
                     "--report", report, *extra, SPEC]
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            return None
        for item in json.load(open(report))["install"]:
            if item["metadata"]["name"].lower() == "torch":
                needs = item["metadata"].get("requires_dist") or []
                return item["download_info"]["url"], not any(d.startswith("nvidia-") for d in needs)
    return None


def pip_install(*args: str) -> None:
    print("+ pip install", " ".join(args), flush=True)
    subprocess.run(PIP + ["install", *args], check=True)


def main() -> int:
    if have_torch():
        print("torch is already installed; leaving it as it is")
        return 0
    if have_gpu():
        pip_install(SPEC)
        return 0
    for extra in ((), ("--no-index",)):
        found = candidate(*extra)
        if found and found[1]:
            url = found[0]
            pip_install(url2pathname(urlparse(url).path) if url.startswith("file://") else SPEC)
            return 0
    pip_install("--index-url", CPU_INDEX, "--extra-index-url", "https://pypi.org/simple", SPEC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
