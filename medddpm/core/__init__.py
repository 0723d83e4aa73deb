"""What every layer uses: the frozen configuration dataclasses (``config``), the package's errors,
atomic file writes (``io``) and the process's backend flags and device (``runtime``)."""
