"""Fast paths over the notes' model: the same ``state_dict``, the same numbers, fewer and larger kernels.

The chapters' modules stay as the notes write them; this package reads the same parameters.

* ``InferenceEngine(model)``: cached greedy, beam and sampling decoding with fused and prepacked
  weights, a preallocated cache and per-sentence cross-attention (``inference``);
  ``InferenceEngine(model, int8=True)``: the same with dynamic int8 projections;
* the engine's products: float32 transposed or MKL-packed, or int8 (``linear``);
* ``fast_forward`` and ``FastTraining(model)``: the training forward pass with fused projections,
  gradients landing in the model's own parameters (``forward``);
* ``layer_norm``: either LayerNorm flavour in as few kernels as it can be (``layer_norm``).
"""

from .forward import FastTraining, fast_forward
from .inference import InferenceEngine, StaticKVCache
from .layer_norm import NotesLayerNormFunction, layer_norm

__all__ = ["FastTraining", "InferenceEngine", "NotesLayerNormFunction", "StaticKVCache", "fast_forward", "layer_norm"]
