"""The figures a graded release stores for the cells of its unreleased chapters (see ``tfm_solution.viz.stored``,
which shows them): written by the release's build from the committed notebooks' outputs, read back by a cell's
source. No widget here: the release's build (``autograder.release``) imports it, and the grader ships what that
imports.
"""

from __future__ import annotations

import base64
import hashlib
import json
from functools import lru_cache
from pathlib import Path

STORED = Path(__file__).resolve().parent / "assets" / "stored_figures.json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def cell_key(source: str) -> str:
    """The key of a cell's source: its lines without trailing spaces, without blank edges."""
    text = "\n".join(line.rstrip() for line in source.strip().splitlines())
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


@lru_cache(maxsize=1)
def _stored() -> dict[str, str]:
    return json.loads(STORED.read_text()) if STORED.is_file() else {}


def stored_figure(source: str) -> bytes | None:
    """The PNG stored for the cell whose source is ``source``, if the release holds one."""
    found = _stored().get(cell_key(source))
    return base64.b64decode(found) if found else None


def _first_image(model_id: str, state: dict, seen: set[str]) -> str | None:
    """The first image (base64 PNG) under a widget model, depth first through its children."""
    if model_id in seen or model_id not in state:
        return None
    seen.add(model_id)
    model = state[model_id]
    if model.get("model_name") == "ImageModel":
        for buffer in model.get("buffers", []):
            if buffer.get("path") == ["value"]:
                return buffer["data"]
    value = model.get("state", {}).get("value")
    if isinstance(value, str) and "data:image/png;base64," in value:
        return value.split("data:image/png;base64,", 1)[1].split('"', 1)[0]
    for child in json.dumps(model.get("state", {})).split("IPY_MODEL_")[1:]:
        found = _first_image(child[:32], state, seen)
        if found:
            return found
    return None


def figures_of(nb: dict) -> dict[str, str]:
    """``{cell key: base64 PNG}`` for every code cell of a notebook whose stored output holds a figure."""
    state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    found = {}
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            png = data.get("image/png")
            if png is None and WIDGET_VIEW in data:
                png = _first_image(data[WIDGET_VIEW]["model_id"], state, set())
            if png:
                found[cell_key("".join(cell.get("source", [])))] = "".join(png).replace("\n", "")
                break
    return found
