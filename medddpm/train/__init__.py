"""Training: the loop with EMA, checkpoints and exact resume (``trainer``), held-out evaluation
(``heldout``), the real loop against its benchmark (``loop``) and the configurations' numerical
and training parity (``parity``). The names of ``trainer`` are re-exported here, where
``medddpm.train`` held them before."""
from .trainer import (  # noqa: F401
    BEST, CHECKPOINT, HELDOUT, HELDOUT_COLUMNS, Trainer, configs_from_checkpoint, ema_update, load_checkpoint,
    rng_state, sample_order, set_rng_state, steady_intervals,
)
