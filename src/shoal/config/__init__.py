"""Run configuration: a pydantic schema, TOML loading and `--set` overrides.

Every user-facing mistake (unknown key, wrong type, impossible value, missing
file) becomes one ``ConfigError`` whose message names the key and the
problem; the CLI prints that line and exits with code 2.

base.py holds what every section shares, sections.py the sections, sync.py
[sync] and its scheme sections, schema.py the root ``Config`` with the
rules across sections, files.py reading, overrides and writing.
"""

from shoal.config.base import Section
from shoal.config.files import (apply_overrides, build_config, key_bounds, load_config, override_keys,
                                parse_override, to_toml, toml_value)
from shoal.config.schema import Config
from shoal.config.sections import (BackendConfig, ClusterConfig, CompressionConfig, DataConfig, GDTopKConfig,
                                   MembershipChange, ModelConfig, NetworkConfig, OptimizerConfig, RunConfig,
                                   SimilarityConfig, SpeedChange, StragglerConfig, TaskConfig)
from shoal.config.sync import (FLAT_KEY_SECTIONS, DiLoCoOptions, GSSPOptions, KBatchOptions, LocalSGDOptions,
                               SSPOptions, StreamingDiLoCoOptions, SyncConfig, fragment_offsets, max_overlap,
                               turn_spacing)
from shoal.errors import ConfigError

__all__ = [
    "FLAT_KEY_SECTIONS", "BackendConfig", "ClusterConfig", "CompressionConfig", "Config", "ConfigError", "DataConfig",
    "DiLoCoOptions", "GDTopKConfig", "GSSPOptions", "KBatchOptions", "LocalSGDOptions", "MembershipChange",
    "ModelConfig", "NetworkConfig", "OptimizerConfig", "RunConfig", "SSPOptions", "Section", "SimilarityConfig",
    "SpeedChange", "StragglerConfig", "StreamingDiLoCoOptions", "SyncConfig", "TaskConfig", "apply_overrides",
    "build_config", "fragment_offsets", "key_bounds", "load_config", "max_overlap", "override_keys", "parse_override", "to_toml", "toml_value", "turn_spacing",
]
