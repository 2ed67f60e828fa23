"""What both implementations share and is not math: the model config (TransformerConfig, GenerationRules), the
Hugging Face families (how each config.json and checkpoint maps to ours, in both directions) and the checkpoint files
(reading, checking and writing config.json, generation_config.json, safetensors and shards). numpy_transformer and
torch_transformer both import it; it imports neither, nor SciPy or torch.
"""

from .config import GenerationRules, TransformerConfig

__all__ = ["TransformerConfig", "GenerationRules"]
