"""Sampling with a trained checkpoint: one volume per mask written in the mask's space
(``sampler``), samples against the real images (``quality``) and the few-step samplers' quality
gate (``gate``). ``from medddpm.sample import Sampler`` (README) reads ``sampler``'s names; they are
loaded when first asked for, so the gate's and the measures' modules start without PyTorch."""

SAMPLER_NAMES = ("Job", "Sampler", "check_options", "default_config", "mask_seed", "read_masks", "sample_masks")


def __getattr__(name: str):
    if name in SAMPLER_NAMES:
        from . import sampler

        return getattr(sampler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
