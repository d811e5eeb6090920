"""The pieces of `benchmarks/server_load.py`: the server process and its streaming clients
(`clients`), the per-level figures (`stats`) and the written results (`output`). Kept apart so
each stays small; the script holds only the command line and the sweep."""
