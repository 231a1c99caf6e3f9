//! The llama-server option table, parsing, `Config` and `PlacementIntent`. Touches no files or devices.
