"""shoal: data-parallel training on heterogeneous clusters."""
__version__ = "0.1.0"
