"""The cosine-schedule Gaussian diffusion (paper §2.1: DDPM training, DDPM and DDIM sampling, run on
the denoiser: ``gaussian``) and the few-step solvers' plans and sampler choices (``solvers``: NumPy
alone, so a reader of the sampler names and defaults does not load PyTorch)."""
