"""What tests of HyperSack and of its plug-ins build on (as `optuna.testing`): stores that
fail on demand, small builders of profiles, spaces and clusters, and the contract suites
that every store, device backend and policy passes."""
