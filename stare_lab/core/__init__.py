"""Layer 1, the ground floor: helpers every layer uses (processes, kernels, CPU facts) and the controls' names.
Imports nothing of stare_lab."""
