"""The node agent: device backends, the trial launcher, and the loop that talks to the server."""
