"""Running a configuration: the engine that builds model, diffusion and optimizer under a run
configuration's knobs (``engine``; the only place a knob is applied) and the ranks of a
distributed run (``distributed``)."""
