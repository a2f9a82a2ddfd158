"""Straggler models (emulated in experiments, simulated at any scale), the simulator and the planner."""
