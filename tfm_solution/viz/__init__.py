"""Visualizations of the course: ipywidgets that also respond on the static website.

``frames`` is the toolkit (a control linked to precomputed frames with ``jslink``, or a live
path in a running kernel), ``student`` picks the student's function or the reference,
``diagram`` draws the architecture, ``language`` puts the widgets' labels into the notebook's language
(``set_language("zh")`` chooses it by hand), and one module per chapter holds its widgets.
"""

from .attention import library_lookup, mask_explorer, scale_explorer
from .diagram import architecture_diagram
from .embeddings import embedding_scale_explorer, similarity_explorer, training_projection
from .frames import FramePlayer, as_widget, figure_png
from .language import set_language
from .masks import FrameGrid, batch_builder, fill_value_explorer, peek_demo
from .positional_encoding import circle_explorer, distance_explorer, wave_explorer
from .student import Resolved, resolve

__all__ = [
    "FrameGrid",
    "FramePlayer",
    "Resolved",
    "architecture_diagram",
    "as_widget",
    "batch_builder",
    "circle_explorer",
    "distance_explorer",
    "embedding_scale_explorer",
    "figure_png",
    "fill_value_explorer",
    "library_lookup",
    "mask_explorer",
    "peek_demo",
    "resolve",
    "scale_explorer",
    "set_language",
    "similarity_explorer",
    "training_projection",
    "wave_explorer",
]
