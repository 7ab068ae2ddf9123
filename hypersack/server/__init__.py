"""The gRPC server: servicers that translate, and the wiring that drives the orchestrator."""
