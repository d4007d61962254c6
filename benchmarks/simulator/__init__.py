"""The simulator (malleable_sim): regimes on traces, loads, windows, its own speed."""
