"""The cosine-schedule Gaussian diffusion (paper §2.1: DDPM training, DDPM and DDIM sampling,
``gaussian``) and the few-step solvers (``solvers``). The names of ``gaussian`` are re-exported
here, where ``medddpm.diffusion`` held them before the package had subpackages."""
from .gaussian import Denoiser, GaussianDiffusion, Generators, cosine_betas, randn  # noqa: F401
