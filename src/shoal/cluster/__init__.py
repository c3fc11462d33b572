"""Who the workers are: speed profiles, transient stragglers (and, later, grouping)."""

from shoal.cluster.profile import ClusterProfile, StragglerModel, build_profile

__all__ = ["ClusterProfile", "StragglerModel", "build_profile"]
