"""Search spaces, their expansion into trials, and the trial state machine."""
