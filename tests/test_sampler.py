"""The Sampler object (medddpm.sample.sampler): loaded once, called many times, in memory or to files."""
import os

import nibabel as nib
import numpy as np
import pytest
import torch

from medddpm.core.errors import InputError
from medddpm.sample import Sampler


def test_a_sampler_loaded_with_no_device_takes_the_gpu_where_there_is_one(ixi_checkpoint):
    s = Sampler.from_checkpoint(ixi_checkpoint)  # the README's call: no device named
    assert s.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert s.config == ("fast" if torch.cuda.is_available() else "baseline")
    with pytest.raises(InputError, match="--device must be"):
        Sampler.from_checkpoint(ixi_checkpoint, device="gpu")


def test_one_sampler_samples_files_folders_and_writes_the_same_numbers(ixi16, ixi_checkpoint, tmp_path):
    s = Sampler.from_checkpoint(ixi_checkpoint, device="cpu")
    assert s.config == "baseline" and s.data_cfg.mask_labels == "brain=nonzero"  # the checkpoint's map
    mask = ixi16 / "dev" / "masks" / "IXI013.nii.gz"
    folder = s.sample(ixi16 / "dev" / "masks", sampler="dpm2m-sde", steps=2, seed=3, batch=2)
    one = s.sample(mask, sampler="dpm2m-sde", steps=2, seed=3)
    assert sorted(folder) == ["IXI012", "IXI013", "IXI014", "IXI015"] and list(one) == ["IXI013"]
    img = one["IXI013"]
    ref = nib.load(str(mask))
    assert img.shape == ref.shape and np.allclose(img.affine, ref.affine) and img.get_data_dtype() == np.float32
    assert np.array_equal(img.get_fdata(), folder["IXI013"].get_fdata())  # a mask's sample: not its batch's
    written = s.write(mask, tmp_path / "out", sampler="dpm2m-sde", steps=2, seed=3)
    assert np.array_equal(nib.load(str(written[0])).get_fdata(), img.get_fdata())
    assert not np.array_equal(s.sample(mask, sampler="dpm2m-sde", steps=2, seed=4)["IXI013"].get_fdata(), img.get_fdata())
    with pytest.raises(InputError, match="already holds IXI013"):
        s.write(mask, tmp_path / "out", sampler="dpm2m-sde", steps=2, seed=3)
    with pytest.raises(InputError, match="unmapped"):
        s.sample(mask, sampler="dpm2m-sde", steps=2, mask_labels="brain=4")
    with pytest.raises(InputError, match="--steps"):
        s.sample(mask, sampler="ddim", steps=0)


def test_without_config_a_gpu_runs_fast_only_where_its_compilation_pays_off():
    import torch

    from medddpm.core.config import FAST_FROM_CALLS, SMALL_JOB, fast_from
    from medddpm.sample.sampler import default_config

    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert default_config(cpu, 500)[0] == "baseline"
    assert default_config(gpu, 1)[0] == SMALL_JOB == "fast-eager" and "--config fast" in default_config(gpu, 1)[1]
    # fast from FAST_FROM_CALLS denoiser calls (masks × calls a mask): DDPM's 250 a mask reach it after a few tens
    # of masks, the 12-step chain's 12 after hundreds
    for calls in (250, 50, 12):
        n = fast_from(calls)
        assert (n - 1) * calls < FAST_FROM_CALLS <= n * calls
        assert default_config(gpu, n - 1, calls)[0] == SMALL_JOB and default_config(gpu, n, calls)[0] == "fast"
    assert fast_from(250) < fast_from(12) and "of 250 denoiser calls" in default_config(gpu, 1, 250)[1]
    assert default_config(gpu)[0] == "fast"  # an object kept for many calls


def test_the_compile_cache_lives_under_medddpm_cache_and_is_keyed(monkeypatch, tmp_path):
    import torch

    from medddpm.run import cache

    import torch._functorch.config as functorch_config

    monkeypatch.setenv("MEDDDPM_CACHE", str(tmp_path / "c"))
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(functorch_config, cache.ALLOW_AUTOGRAD_FUNCTIONS, False)
    assert cache.use() == tmp_path / "c"
    # AOT autograd's cache keeps graphs with fast's custom autograd.Function (skip_cat's dense gradients)
    assert getattr(functorch_config, cache.ALLOW_AUTOGRAD_FUNCTIONS) is True
    import os
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "c" / "inductor")
    cpu = torch.device("cpu")
    k = cache.key("fast", (128, 128, 128), cpu)
    assert k.startswith("fast-128x128x128-") and k == cache.key("fast", (128, 128, 128), cpu)
    assert len({k, cache.key("fast", (64, 64, 64), cpu), cache.key("bf16", (128, 128, 128), cpu)}) == 3
    assert cache.artifact(k).parent == tmp_path / "c" / "mega" and not cache.load(k)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/mine")
    cache.use()
    assert os.environ["TRITON_CACHE_DIR"] == "/mine"  # the user's own setting wins


def test_warmup_runs_once_and_says_what_it_cached(capsys, ixi_checkpoint, monkeypatch):
    """On a CPU nothing compiled outlives the process: `warmup` says so without sampling (250 calls for nothing)."""
    from medddpm.cli import main

    def sampled(*args, **kwargs):
        raise AssertionError("warmup sampled a chain whose compiled work no cache would keep")

    monkeypatch.setattr(Sampler, "volumes", sampled)
    assert main(["warmup", "--checkpoint", str(ixi_checkpoint), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "warmup: compiling baseline for 16×16×16, batch 1" in err and "nothing to cache" in out
    assert main(["warmup", "--checkpoint", str(ixi_checkpoint), "--batch", "0"]) == 2
    assert main(["warmup", "--checkpoint", str(ixi_checkpoint), "--device", "cpu", "--sampler", "ddpm",
                 "--steps", "10"]) == 2  # refused before anything compiles
    assert "runs all 250 steps" in capsys.readouterr().err


def test_warmup_compiles_every_configuration_sample_may_pick():
    """On a GPU `sample` without --config runs fast-eager for small jobs and fast for large ones
    (``default_config``): `warmup` compiles both, or the one --config names."""
    import torch

    from medddpm.cli import warmup_configs
    from medddpm.core.config import SMALL_JOB
    from medddpm.sample.sampler import default_config

    gpu = torch.device("cuda")
    picked = {default_config(gpu, n, 250)[0] for n in (1, 10_000)}
    assert set(warmup_configs(None, gpu)) == picked == {SMALL_JOB, "fast"}
    assert warmup_configs("opt1", gpu) == ["opt1"] and warmup_configs(None, torch.device("cpu")) == ["baseline"]


def test_a_cache_that_cannot_be_read_or_written_costs_only_a_warning(monkeypatch, tmp_path):
    import torch

    from medddpm.run import cache

    monkeypatch.setenv("MEDDDPM_CACHE", str(tmp_path))
    k = cache.key("fast", (16, 16, 16), torch.device("cpu"))
    cache.artifact(k).parent.mkdir(parents=True)
    cache.artifact(k).write_bytes(b"not a cache")
    assert not cache.load(k)  # torch finds nothing usable in it
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda b: (_ for _ in ()).throw(RuntimeError("stale")))
    with pytest.warns(UserWarning, match="not loaded"):
        assert not cache.load(k)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"x", None))
    monkeypatch.setattr(cache, "atomic_path", lambda p: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.warns(UserWarning, match="not written"):
        assert cache.save(k) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fast-eager's Triton kernels and CUDA graphs need a GPU")
@pytest.mark.parametrize("sampler,steps", [("ddpm", None), ("dpm2m-sde", 4)])
def test_the_small_job_sampler_samples_what_fast_samples_on_a_gpu(tiny_checkpoint, phantoms, sampler, steps):
    """`fast-eager` (sample's pick for a small job: no torch.compile) on a GPU: the same files twice
    from one object, and fast's samples up to bf16 rounding (Inductor fuses what it runs op by op)."""
    import numpy as np

    from medddpm.sample import Sampler

    masks = phantoms / "masks"
    out = {}
    for config in ("fast-eager", "fast"):
        s = Sampler.from_checkpoint(tiny_checkpoint, config=config, device="cuda")
        out[config] = [{k: np.asarray(v.dataobj) for k, v in s.sample(masks, sampler=sampler, steps=steps, seed=1).items()}
                       for _ in range(2)]
    eager, fast = out["fast-eager"], out["fast"]
    assert all(np.array_equal(eager[0][k], eager[1][k]) for k in eager[0])
    diff = np.concatenate([np.abs(eager[0][k] - fast[0][k]).ravel() for k in fast[0]])
    scale = np.ptp(np.concatenate([v.ravel() for v in fast[0].values()]))  # the samples' range, in their units
    assert diff.mean() < 0.02 * scale and np.percentile(diff, 99) < 0.1 * scale, (diff.mean(), diff.max(), scale)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fast-eager's Triton kernels and CUDA graphs need a GPU")
def test_one_sampler_at_a_growing_batch_replays_its_first_graphs_exactly(tiny_checkpoint, phantoms, monkeypatch):
    """One `fast-eager` Sampler at batch 1, then 3 (its norms' arrival counters outgrow their buffer: the minimum
    set to 1, as a large batch at 128³ does), then 1 again: the batch-1 graphs captured first replay to the files
    a fresh object writes (issue 77 item 9)."""
    import numpy as np

    from medddpm.net import kernels
    from medddpm.sample import Sampler

    monkeypatch.setattr(kernels, "_MIN_COUNTERS", 1)
    monkeypatch.setattr(kernels, "_COUNTERS", {})
    masks = phantoms / "masks"

    def run(s, batch):
        return {k: np.asarray(v.dataobj) for k, v in s.sample(masks, sampler="dpm2m-sde", steps=4, seed=1,
                                                               batch=batch).items()}
    reused = Sampler.from_checkpoint(tiny_checkpoint, config="fast-eager", device="cuda")
    first, _, again = (run(reused, b) for b in (1, 3, 1))
    assert kernels._OUTGROWN, "the batch of 3 did not outgrow the counters: the test checks nothing"
    fresh = run(Sampler.from_checkpoint(tiny_checkpoint, config="fast-eager", device="cuda"), 1)
    assert all(np.array_equal(again[k], fresh[k]) and np.array_equal(first[k], fresh[k]) for k in fresh)


def test_without_a_sampler_a_v_checkpoint_runs_ddpm_250_and_the_command_says_so(capsys, ixi16, ixi_checkpoint8,
                                                                                 tmp_path):
    """A v-prediction checkpoint, as an ε one (test_solvers): DDPM 250 (solvers.REFERENCE), as the object picks too;
    the gate's unconfirmed 12-call chain (solvers.CANDIDATE) is one option away and writes
    others."""
    from medddpm.cli import main
    from medddpm.diffusion.solvers import CANDIDATE, REFERENCE

    ixi_checkpoint = ixi_checkpoint8  # ixi_checkpoint's recipe at 8³: DDPM 250 of one mask in 3 s on a CPU
    masks = sorted((ixi16 / "val" / "masks").glob("*.nii.gz"))[0]  # one mask: 250 calls a run on a CPU
    base = ["sample", "--checkpoint", str(ixi_checkpoint), "--masks", str(masks), "--device", "cpu", "--quiet"]
    assert main([*base, "--out", str(tmp_path / "default")]) == 0
    assert f"sampler {REFERENCE.describe()}: the default; " in capsys.readouterr().err
    chain = ["--sampler", CANDIDATE.sampler, "--steps", str(CANDIDATE.steps), "--spacing", CANDIDATE.spacing,
             "--eta", f"{CANDIDATE.eta:g}"]
    assert main([*base, *chain, "--out", str(tmp_path / "chain")]) == 0
    assert "the default" not in capsys.readouterr().err  # nothing to say when the sampler is named

    def volume(folder):
        return np.asarray(nib.load(next((tmp_path / folder).glob("*.nii.gz"))).dataobj)

    assert not np.array_equal(volume("default"), volume("chain"))
    s = Sampler.from_checkpoint(ixi_checkpoint, device="cpu")
    assert s.choose()[1:] == (REFERENCE.sampler, None, None, 1.0)


def test_tritons_key_is_computed_once_per_installation_and_then_read(monkeypatch, tmp_path):
    """``cache.remember_triton_key``: the first process computes Triton's installation key and keeps
    it under MEDDDPM_CACHE; a later one reads it without hashing Triton again; another installation
    (a new fingerprint) computes its own."""
    tcache = pytest.importorskip("triton.runtime.cache")
    from medddpm.run import cache

    calls = []

    def computed():
        calls.append(1)
        return f"key-{len(calls)}"

    monkeypatch.setattr(tcache, "triton_key", computed)
    assert cache.remember_triton_key(tmp_path) == "key-1" and len(calls) == 1
    assert tcache.triton_key() == "key-1" and len(calls) == 1  # installed: Triton's compile asks it
    assert cache.remember_triton_key(tmp_path) == "key-1" and len(calls) == 1
    kept = list((tmp_path / "triton-key").iterdir())
    assert len(kept) == 1 and kept[0].read_text() == "key-1"

    monkeypatch.setattr(tcache, "triton_key", computed)  # a new process: Triton's own function again
    assert cache.remember_triton_key(tmp_path) == "key-1" and len(calls) == 1  # read, not hashed
    monkeypatch.setattr(tcache, "triton_key", computed)
    monkeypatch.setattr(cache, "triton_fingerprint", lambda base, version: "another-installation")
    assert cache.remember_triton_key(tmp_path) == "key-2" and len(calls) == 2


def test_tritons_fingerprint_follows_its_files(tmp_path):
    """The fingerprint changes with a file's size or time and with the version, and only with them."""
    from medddpm.run import cache

    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "cache.py").write_text("x")
    (tmp_path / "_C").mkdir()
    lib = tmp_path / "_C" / "libtriton.so"
    lib.write_bytes(b"a" * 10)
    first = cache.triton_fingerprint(tmp_path, "3.6.0")
    assert first == cache.triton_fingerprint(tmp_path, "3.6.0") != cache.triton_fingerprint(tmp_path, "3.7.0")
    os.utime(lib, ns=(1, 1))
    assert cache.triton_fingerprint(tmp_path, "3.6.0") != first
