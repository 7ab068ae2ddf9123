"""What the server and the agents share: protobuf <-> domain conversion and settings."""
