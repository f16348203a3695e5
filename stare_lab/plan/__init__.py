"""Layer 2, what a sweep file means: its schema, grid, search and declared claims, its plan and its record on disk.
May import layer 1, config and launchers."""
