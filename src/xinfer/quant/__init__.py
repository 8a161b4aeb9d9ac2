"""Weight formats: one module per format (the checkpoint layout → engine tensors, the
dequantize twin, kernel launchers), the parsing of `quantization_config`, and the
assignment of a format to every linear and expert layer of a model."""

from xinfer.quant.base import TensorSpec, WeightFormat, expert_key
from xinfer.quant.config import QuantConfig, resolve_quant_config
from xinfer.quant.experts import ExpertWeights
from xinfer.quant.unquantized import Unquantized

__all__ = [
    "ExpertWeights",
    "QuantConfig",
    "TensorSpec",
    "Unquantized",
    "WeightFormat",
    "expert_key",
    "resolve_quant_config",
]
