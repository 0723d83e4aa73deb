"""Training: checkpoints (``checkpoint``), the loop with EMA and exact resume (``trainer``), held-out
evaluation (``heldout``), the real loop against its benchmark (``loop``) and the configurations'
numerical and training parity (``parity``)."""
