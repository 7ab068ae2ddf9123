"""Domain types, ids, clock and errors shared by every part of HyperSack."""
