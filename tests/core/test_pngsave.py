"""Figures saved small: the same pixels as matplotlib's own PNG, fewer bytes, and the same bytes every time."""
from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from scalelab.core.pngsave import save_png, shrink_file, small_png


def _figure() -> Figure:
    fig = Figure(figsize=(4, 3), dpi=80)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = np.linspace(0, 6, 200)
    ax.plot(x, np.sin(x), label="sin")
    ax.fill_between(x, np.sin(x) - 0.2, np.sin(x) + 0.2, alpha=0.3)
    ax.legend()
    return fig


def test_same_pixels_fewer_bytes_and_stable(tmp_path):
    fig = _figure()
    ref = io.BytesIO()
    fig.savefig(ref, format="png")
    out = save_png(fig, tmp_path / "f" / "a.png")
    want = Image.open(io.BytesIO(ref.getvalue())).convert("RGBA")
    got = Image.open(out)
    assert got.mode == "RGB" and got.size == want.size
    assert got.convert("RGBA").tobytes() == want.tobytes()
    assert out.stat().st_size < len(ref.getvalue())
    assert save_png(fig, tmp_path / "b.png").read_bytes() == out.read_bytes()
    (tmp_path / "c.png").write_bytes(ref.getvalue())
    before, after = shrink_file(tmp_path / "c.png")
    assert (before, after) == (len(ref.getvalue()), out.stat().st_size)
    assert (tmp_path / "c.png").read_bytes() == out.read_bytes()  # re-encoding a file == saving in the small form


def test_translucent_image_keeps_its_alpha():
    im = Image.new("RGBA", (8, 8), (10, 20, 30, 128))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    back = Image.open(io.BytesIO(small_png(buf.getvalue())))
    assert back.mode == "RGBA" and back.getpixel((3, 3)) == (10, 20, 30, 128)
