"""Install PyTorch, and with EXTRAS this package (editable, with those extras), into the running Python without
pulling a multi-GB CUDA build onto a machine that has no NVIDIA GPU.

* torch already importable → nothing to do for it.
* an NVIDIA GPU (``nvidia-smi`` works) → the normal wheel from the package index.
* no GPU → a CPU build: the one pip would pick anyway if it is a CPU build; else a CPU build
  from the local wheel folders pip is configured with (``find-links``); else PyTorch's own
  CPU-only index. A wheel is a CPU build when it requires no ``nvidia-*`` packages.

pip chooses the wheel; uv installs it and the package in one resolution where uv can be had (``pip install uv``
into this Python; a fresh set-up in a fraction of pip's time), reading pip's own configuration (its
indexes, wheel folders, constraints and certificate) and taking the best version across them as pip does; pip
installs them where uv cannot be had or fails. ``MEDDDPM_PIP=1`` keeps to pip.

Usage: python scripts/install_torch.py [EXTRAS]   (EXTRAS e.g. test,plot; TORCH_SPEC overrides, e.g. "torch==2.11.*")
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


def torch_args() -> list[str]:
    """pip's install arguments for the PyTorch this machine should have (the module's docstring); none where torch is
    importable already."""
    if have_torch():
        print("torch is already installed; leaving it as it is")
        return []
    if have_gpu():
        return [SPEC]
    for extra in ((), ("--no-index",)):
        found = candidate(*extra)
        if found and found[1]:
            url = found[0]
            return [url2pathname(urlparse(url).path) if url.startswith("file://") else SPEC]
    return ["--index-url", CPU_INDEX, "--extra-index-url", "https://pypi.org/simple", SPEC]


def pip_config() -> dict[str, list[str]]:
    """pip's configured ``index-url``, ``extra-index-url``, ``find-links``, ``constraint`` and ``cert`` (``pip config
    list``: its files and PIP_* variables), each a list of values."""
    out = subprocess.run(PIP + ["config", "list"], capture_output=True, text=True).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in ("index-url", "extra-index-url", "find-links", "constraint", "cert"):
            found[name] = value.strip().strip("'\"").split()
    return found


def uv_command(args: list[str], cfg: dict[str, list[str]]) -> list[str] | None:
    """``python -m uv pip install ARGS`` for the running Python with pip's configuration ``cfg`` (its index where
    ``args`` name none), uv installed first where it is missing; None where it cannot be had or ``MEDDDPM_PIP`` is
    set."""
    if os.environ.get("MEDDDPM_PIP"):
        return None
    have = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0
    if not have and subprocess.run(PIP + ["install", "--quiet", "uv"], capture_output=True).returncode != 0:
        return None
    cmd = [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", sys.executable,
           "--compile-bytecode",  # as pip does: where PYTHONDONTWRITEBYTECODE is set, every process would compile torch
           "--index-strategy", "unsafe-best-match"]  # pip's rule: the best version on any index
    cmd += [a for url in cfg.get("index-url", [])[:1] if "--index-url" not in args for a in ("--index-url", url)]
    cmd += [a for url in cfg.get("extra-index-url", []) for a in ("--extra-index-url", url)]
    cmd += [a for path in cfg.get("find-links", []) for a in ("--find-links", path)]
    cmd += [a for path in cfg.get("constraint", []) for a in ("--constraint", path)]
    return cmd + args


def install(args: list[str]) -> None:
    """Install ``args`` (pip install's arguments) with uv where it can be had, else, or where uv fails, with pip."""
    if not args:
        return
    cfg = pip_config()
    uv = uv_command(args, cfg)
    if uv is not None:
        cert = cfg.get("cert", [])
        env = {**os.environ, **({"SSL_CERT_FILE": cert[0]} if cert and "SSL_CERT_FILE" not in os.environ else {})}
        print("+ uv pip install", " ".join(args), flush=True)
        if subprocess.run(uv, env=env).returncode == 0:
            return
        print("uv failed; installing with pip instead", flush=True)
    print("+ pip install", " ".join(args), flush=True)
    subprocess.run(PIP + ["install", *args], check=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: python scripts/install_torch.py [EXTRAS]   (EXTRAS e.g. test,plot)", file=sys.stderr)
        return 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    package = ["-e", f"{root}[{argv[0]}]"] if argv else []
    torch = torch_args()
    if package and torch[:1] == ["--index-url"]:  # PyTorch's own index for torch alone: then the package
        install(torch)
        torch = []
    install(torch + package)
    return 0


if __name__ == "__main__":
    sys.exit(main())
