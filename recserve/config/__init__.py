"""Configuration: DeepRec's processor JSON (and the EAS wrappers) parsed into one
`ProcessorConfig` per model. Every layer reads it, so it sits at the bottom of the
package and imports nothing of recserve's but `errors`."""

from recserve.config.schema import ConfigField, ProcessorConfig, config_fields, parse_config, parse_model_configs
from recserve.config.values import Secret

__all__ = ["ConfigField", "ProcessorConfig", "Secret", "config_fields", "parse_config", "parse_model_configs"]
