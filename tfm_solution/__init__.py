"""The complete reference implementation of the course: the encoder–decoder Transformer.

Modules follow the chapters: embeddings, positional_encoding, attention, masks, multihead,
feed_forward, norm, encoder_decoder (with ``make_model``), schedule.
"""

from .attention import attention, softmax_saturation
from .cloning import clones
from .embeddings import Embeddings
from .encoder_decoder import Decoder, DecoderLayer, Encoder, EncoderDecoder, EncoderLayer, Generator, make_model
from .feed_forward import PositionwiseFeedForward
from .masks import Batch, subsequent_mask
from .multihead import MultiHeadedAttention
from .norm import LayerNorm, SublayerConnection
from .positional_encoding import PositionalEncoding, positional_encoding, rotation_matrix
from .schedule import rate

__all__ = [
    "Batch",
    "Decoder",
    "DecoderLayer",
    "Embeddings",
    "Encoder",
    "EncoderDecoder",
    "EncoderLayer",
    "Generator",
    "LayerNorm",
    "MultiHeadedAttention",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "SublayerConnection",
    "attention",
    "clones",
    "make_model",
    "positional_encoding",
    "rate",
    "rotation_matrix",
    "softmax_saturation",
    "subsequent_mask",
]
