"""The complete reference implementation of the course: the encoder–decoder Transformer.

Modules follow the chapters: embeddings, positional_encoding, attention, masks, multihead,
feed_forward, norm, encoder_decoder (with ``make_model``), schedule.
"""

from .attention import attention, softmax_saturation
from .cloning import clones
from .decoding import beam_search, greedy_decode, sample
from .embeddings import Embeddings, cosine_similarity_matrix
from .encoder_decoder import Decoder, DecoderLayer, Encoder, EncoderDecoder, EncoderLayer, Generator, make_model
from .feed_forward import PositionwiseFeedForward
from .kv_cache import KVCache, kv_cache_bytes
from .masks import Batch, masked_softmax, subsequent_mask
from .multihead import MultiHeadedAttention
from .norm import LayerNorm, SublayerConnection
from .positional_encoding import PositionalEncoding, positional_encoding, rotation_matrix
from .schedule import rate
from .training import LabelSmoothing, SimpleLossCompute, TrainState, run_epoch

__all__ = [
    "Batch",
    "Decoder",
    "DecoderLayer",
    "Embeddings",
    "Encoder",
    "EncoderDecoder",
    "EncoderLayer",
    "Generator",
    "KVCache",
    "LabelSmoothing",
    "LayerNorm",
    "MultiHeadedAttention",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "SimpleLossCompute",
    "SublayerConnection",
    "TrainState",
    "attention",
    "beam_search",
    "clones",
    "cosine_similarity_matrix",
    "greedy_decode",
    "kv_cache_bytes",
    "make_model",
    "masked_softmax",
    "positional_encoding",
    "rate",
    "rotation_matrix",
    "run_epoch",
    "sample",
    "softmax_saturation",
    "subsequent_mask",
]

from ._release import RELEASED_THROUGH as _RELEASED_THROUGH

if _RELEASED_THROUGH < 12:  # a graded release: an unreleased answer's cell shows its stored figure and one line
    # Imported by name: the widgets are no part of what the grader loads (nor ships: autograder.gradescope
    # follows import statements), and the grader's own package holds every answer, so it never gets here.
    import importlib as _importlib

    _importlib.import_module(f"{__name__}.viz.stored").install()
