"""Figures saved small: matplotlib's picture within a few levels per channel on its anti-aliased edges, far fewer
bytes, the same bytes every time; few-colour images pixel for pixel, translucent ones untouched."""
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


def test_nearly_the_same_picture_in_far_fewer_bytes_and_stable(tmp_path):
    fig = _figure()
    ref = io.BytesIO()
    fig.savefig(ref, format="png")
    out = save_png(fig, tmp_path / "f" / "a.png")
    want = np.asarray(Image.open(io.BytesIO(ref.getvalue())).convert("RGB"), dtype=int)
    got = Image.open(out)
    assert got.mode == "P" and got.size == (want.shape[1], want.shape[0])   # > 256 colours: a palette
    diff = np.abs(np.asarray(got.convert("RGB"), dtype=int) - want)
    assert diff.mean() < 0.1 and (diff > 0).mean() < 0.05 and diff.max() <= 48   # a few edge pixels, slightly
    assert out.stat().st_size < 0.6 * len(ref.getvalue())
    assert save_png(fig, tmp_path / "b.png").read_bytes() == out.read_bytes()
    (tmp_path / "c.png").write_bytes(ref.getvalue())
    before, after = shrink_file(tmp_path / "c.png")
    assert (before, after) == (len(ref.getvalue()), out.stat().st_size)
    assert (tmp_path / "c.png").read_bytes() == out.read_bytes()  # re-encoding a file == saving in the small form


def test_few_colours_are_kept_pixel_for_pixel():
    im = Image.new("RGBA", (40, 30), (255, 255, 255, 255))
    for x in range(40):
        im.putpixel((x, x % 30), (x * 6, 100, 255 - x * 6, 255))    # 41 colours in all
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    back = Image.open(io.BytesIO(small_png(buf.getvalue())))
    assert back.mode == "RGB" and back.tobytes() == im.convert("RGB").tobytes()


def test_translucent_image_keeps_its_alpha():
    im = Image.new("RGBA", (8, 8), (10, 20, 30, 128))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    back = Image.open(io.BytesIO(small_png(buf.getvalue())))
    assert back.mode == "RGBA" and back.getpixel((3, 3)) == (10, 20, 30, 128)
