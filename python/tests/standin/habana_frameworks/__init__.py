"""A recording stand-in of Intel Gaudi's PyTorch bridge for tests (the real one cannot be
installed here): it records ``mark_step`` calls and every event's record and synchronize, and
times events with the host clock. Only what dropcompute.torch calls."""
