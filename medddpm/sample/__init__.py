"""Sampling with a trained checkpoint: one volume per mask written in the mask's space
(``sampler``), samples against the real images (``quality``) and the few-step samplers' quality
gate (``gate``). The names of ``sampler`` are re-exported here, where ``medddpm.sample`` held them
before."""
from .sampler import Job, Sampler, check_options, default_config, mask_seed, read_masks, sample_masks  # noqa: F401
