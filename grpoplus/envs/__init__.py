"""Multi-turn environments and tool use (in progress): trajectories assembled token in, token out."""

from grpoplus.envs.trajectory import Trajectory, Turn, to_rollouts

__all__ = ["Trajectory", "Turn", "to_rollouts"]
