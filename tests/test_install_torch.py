"""scripts/install_torch.py: pip's configuration carried over to uv, pip's index kept out where PyTorch's is named, and
pip taking over where uv cannot be had or fails."""
import importlib.util
import subprocess
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("install_torch", Path(__file__).parents[1] / "scripts" / "install_torch.py")
install_torch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_torch)

CONFIG = """global.extra-index-url='file:///a/simple file:///b/simple'
global.find-links='/wheels'
global.constraint='/etc/caps.txt'
global.cert='/etc/ca.crt'
:env:.index-url='https://mirror/simple'
global.timeout='60'
"""


class Runs:
    """subprocess.run stand-in: each call's argv recorded; `pip config list` answers CONFIG, uv's install ``uv_rc``."""

    def __init__(self, uv_rc=0):
        self.calls, self.uv_rc = [], uv_rc

    def __call__(self, cmd, **kw):
        self.calls.append(list(cmd))
        if cmd[-2:] == ["config", "list"]:
            return subprocess.CompletedProcess(cmd, 0, CONFIG, "")
        return subprocess.CompletedProcess(cmd, self.uv_rc if cmd[2:5] == ["uv", "pip", "install"] else 0, "", "")


def test_pips_configuration_becomes_uvs_flags(monkeypatch):
    monkeypatch.setattr(install_torch.subprocess, "run", Runs())
    monkeypatch.delenv("MEDDDPM_PIP", raising=False)
    cfg = install_torch.pip_config()
    assert cfg == {"extra-index-url": ["file:///a/simple", "file:///b/simple"], "find-links": ["/wheels"],
                   "constraint": ["/etc/caps.txt"], "cert": ["/etc/ca.crt"], "index-url": ["https://mirror/simple"]}
    cmd = install_torch.uv_command(["torch"], cfg)
    flags = " ".join(cmd)
    assert "--index-strategy unsafe-best-match" in flags and "--index-url https://mirror/simple" in flags
    assert "--extra-index-url file:///a/simple --extra-index-url file:///b/simple" in flags
    assert "--find-links /wheels" in flags and "--constraint /etc/caps.txt" in flags and cmd[-1] == "torch"
    assert "--compile-bytecode" in cmd  # where PYTHONDONTWRITEBYTECODE is set, no process writes .pyc of its own
    own = install_torch.uv_command(["--index-url", "https://download.pytorch.org/whl/cpu", "torch"], cfg)
    assert own.count("--index-url") == 1 and "https://mirror/simple" not in own  # PyTorch's index, not pip's
    monkeypatch.setenv("MEDDDPM_PIP", "1")
    assert install_torch.uv_command(["torch"], cfg) is None


@pytest.mark.parametrize("uv_rc", [0, 1])
def test_pip_installs_where_uv_fails(monkeypatch, uv_rc):
    runs = Runs(uv_rc)
    monkeypatch.setattr(install_torch.subprocess, "run", runs)
    monkeypatch.delenv("MEDDDPM_PIP", raising=False)
    install_torch.install(["-e", ".[test]"])
    installs = [c for c in runs.calls if "install" in c and "--version" not in c and c[-2:] != ["config", "list"]]
    assert ["uv", "pip", "install"] == installs[0][2:5] and installs[0][-2:] == ["-e", ".[test]"]
    pip = [c for c in installs if c[1:4] == ["-m", "pip", "install"] and c[-2:] == ["-e", ".[test]"]]
    assert len(pip) == uv_rc  # pip only after uv failed


def test_a_bad_argument_is_refused():
    assert install_torch.main(["--extras", "x"]) == 2 and install_torch.main(["a", "b"]) == 2
