"""Visualizations of the course: ipywidgets that also respond on the static website.

``frames`` is the toolkit (a control linked to precomputed frames with ``jslink``, or a live
path in a running kernel), ``student`` picks the student's function or the reference,
``diagram`` draws the architecture, and one module per chapter holds its widgets.
"""

from .attention import library_lookup, mask_explorer, scale_explorer
from .diagram import architecture_diagram
from .embeddings import similarity_explorer, training_projection
from .frames import FramePlayer, as_widget, figure_png
from .positional_encoding import circle_explorer, distance_explorer, wave_explorer
from .student import Resolved, resolve

__all__ = [
    "FramePlayer",
    "Resolved",
    "architecture_diagram",
    "as_widget",
    "circle_explorer",
    "distance_explorer",
    "figure_png",
    "library_lookup",
    "mask_explorer",
    "resolve",
    "scale_explorer",
    "similarity_explorer",
    "training_projection",
    "wave_explorer",
]
