"""xinfer: LLM inference for Mixture-of-Experts models that do not fit in GPU memory."""

from __future__ import annotations

from xinfer.errors import UserError
from xinfer.llm import LLM, GenerationResult
from xinfer.sampling import SamplingParams

__all__ = ["LLM", "GenerationResult", "SamplingParams", "UserError"]
__version__ = "0.1.0"
