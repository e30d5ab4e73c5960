"""The house style every figure shares: layout, colours and the standalone page the site embeds.

`house_layout` is legible from a 390 px phone to a wide screen; `figure_html` writes one page per figure
(self-hosted plotly.js, the parent page's light/dark scheme, fitted to its width by ``page.js``).
"""
from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go

from .palette import SERIES
from .words import SEPARATORS

STAGE_NAMES = {0: "DDP (stage 0)", 1: "ZeRO-1 (P_os)", 2: "ZeRO-2 (P_os+g)", 3: "ZeRO-3 (P_os+g+p)"}
PALETTE = SERIES


def house_layout(fig: go.Figure, title: str, x: str, y: str, lang: str = "en", **kw) -> go.Figure:
    """The house layout, legible from a 390 px phone to a wide screen.

    The title and every axis push the margins out as far as they need (automargin), the legend sits
    below everything else, and nothing depends on a fixed pixel margin. On the site the figure's page
    rewraps the title and the category labels to the width it has (figure_page.js); `title` is kept
    whole in ``layout.meta`` for that. `lang` sets the decimal mark of plotly's own number formatting.
    """
    fig.update_layout(title=dict(text=title, x=0, xref="container", xanchor="left", y=1, yref="paper",
                                 yanchor="bottom", automargin=True, pad=dict(l=10, b=12), font=dict(size=15)),
                      meta=dict(title=title), margin=dict(l=10, r=10, t=10, b=10),
                      legend=dict(orientation="h", x=0, xanchor="left", xref="container", y=0, yanchor="bottom",
                                  yref="container"),
                      font=dict(family="system-ui, sans-serif", size=13), colorway=PALETTE,
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)", **kw)
    if lang != "en":
        fig.update_layout(separators=SEPARATORS[lang])
    if x:
        fig.update_layout(xaxis_title_text=x)
    if y:
        fig.update_layout(yaxis_title_text=y)
    fig.update_xaxes(automargin=True, title_font_size=14)
    fig.update_yaxes(automargin=True, title_font_size=14)
    return fig


# Runs inside the figure's page: theme, fitting to the width, and the frame's height (see the file).
PAGE_SCRIPT = Path(__file__).with_name("page.js")


def figure_html(fig: go.Figure, div_id: str, plotly_src: str, title: str = "", lang: str = "en") -> str:
    """A standalone HTML page for one figure in `lang`: self-hosted plotly.js, deterministic div id, theme-aware."""
    page = fig.to_html(full_html=True, include_plotlyjs=plotly_src, div_id=div_id,
                       post_script=PAGE_SCRIPT.read_text(encoding="utf-8"),
                       config={"displaylogo": False, "responsive": True,
                               "modeBarButtonsToRemove": ["sendDataToCloud", "select2d", "lasso2d"]},
                       default_width="100%", default_height="100%")
    head = ('<meta name="viewport" content="width=device-width, initial-scale=1"><title>'
            + html.escape(title or div_id) + "</title><style>html,body{margin:0;height:100%;"
            "background:transparent;overflow:hidden}"
            # plotly's toolbar shows on hover only: a keyboard user tabbing through it sees it too, and where
            # the focus is (WCAG 2.4.7)
            ".js-plotly-plot .plotly .modebar:focus-within{opacity:1!important}"
            ".js-plotly-plot .plotly .modebar-btn:focus-visible{outline:3px solid #303fa0;outline-offset:1px}"
            "</style>")
    if not lang.isalpha():
        raise ValueError(f"figure page language {lang!r}: expected a language code such as 'nl'")
    return page.replace("<html>", f'<html lang="{lang}">', 1).replace("<head>", "<head>" + head, 1)
