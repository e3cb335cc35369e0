"""Views, pages and figures; the saved report renders in headless Chromium with networking disabled."""

import base64
import dataclasses
import gzip
import re

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, viz
from lens_bias.analyses.sinks import key_importance

from ..conftest import shared_tiny
from .browser import PAGE_BUDGET, read_page, requires_chromium


@pytest.fixture(scope="module")
def model():
    return shared_tiny("llama", d_vocab=200)


@pytest.fixture(scope="module")
def report(model):
    return lens_bias.analyze(model, n_sequences=24, seq_len=16, progress=False)


def test_attention_view_names_heads_with_the_first_token_share(model):
    tokens = lens_bias.random_tokens(1, 10, 200, seed=1)[0]
    view = viz.attention_view(model, tokens, layers=[1], heads=[0, 2])
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None])
    alpha0 = key_importance(cache["blocks.1.attn.hook_pattern"][0])[:, 0]
    names = re.findall(r'"attentionHeadNames": \[([^\]]*)\]', view.local_src)[0]
    assert names == f'"L1H0 \\u03b10={alpha0[0]:.2f}", "L1H2 \\u03b10={alpha0[2]:.2f}"'
    with pytest.raises(LensBiasError, match="one sequence"):
        viz.attention_view(model, lens_bias.random_tokens(2, 10, 200))


def test_the_token_view_carries_the_numbers(report):
    view = report.token_preference.show(top=5)
    top = report.token_preference.p_bar.topk(5).indices.tolist()
    assert f'"tokens": {[str(t) for t in top]}'.replace("'", '"') in view.local_src
    values = report.token_preference.p_bar.double().topk(5).values * report.token_preference.d_vocab
    assert f'"values": [{torch.log10(values).float()[0].item()}' in view.local_src


def remote_loads(page):
    """What a page would fetch from another machine: off-machine src/href of tags, and imports of URLs."""
    targets = re.findall(r"<(?:script|link|img|iframe|source|embed)\b[^>]*?\b(?:src|href)\s*=\s*[\"']?([^\"'\s>]+)", page, flags=re.I)
    imports = re.findall(r"(?:\bimport\s*\(?|\bfrom)\s*[\"']((?:https?:)?//[^\"']+)", page)
    return [t for t in targets if re.match(r"(?:https?:)?//", t)] + imports


def packed_bundles(page):
    """The gzipped scripts a page unpacks, as text."""
    return [gzip.decompress(base64.b64decode(b)).decode() for b in re.findall(r'atob\("([A-Za-z0-9+/=]+)"\)', page)]


def test_remote_loads_finds_what_a_cdn_page_fetches():
    cdn = '<script src="https://cdn.example/cv.js"></script><link rel=stylesheet href=//cdn.example/a.css><script type=module>import "https://esm.sh/x"</script>'
    assert remote_loads(cdn) == ["https://cdn.example/cv.js", "//cdn.example/a.css", "https://esm.sh/x"]
    assert remote_loads('<script>var u = "https://react.dev/errors";</script><a href="https://x.org">x</a>') == []


def test_page_inlines_one_bundle_for_many_views(report, model, tmp_path):
    views = {**report.views(), "attention": viz.attention_view(model, lens_bias.random_tokens(1, 8, 200, seed=2)[0], layers=[0])}
    assert len(views) == 2
    path = viz.save_html(views, tmp_path / "v.html", title="two views")
    text = path.read_text()
    # the bundle is on the page once, gzipped: exactly the bundle of the views' own pages
    assert packed_bundles(text) == [re.search(r'<script crossorigin type="module">(.*?)CircuitsVis\.render\(', views["attention"].local_src, re.S)[1]]
    assert text.count("CircuitsVis.render(") == 2 and len(text) < 0.5 * len(views["attention"].local_src)
    assert "unpkg.com" not in text and remote_loads(text) == []
    with pytest.raises(LensBiasError, match="not a circuitsvis"):
        viz.page_html({"x": object()})


def test_figures_are_matplotlib_figures(report):
    from matplotlib.figure import Figure

    figures = report.figures()
    assert set(figures) == {"sorted V·p̄", "contraction per layer", "positional variance r_t", "first-token sink per layer and head",
                            "largest |h| and median |h| per block output", "down-projection input and output spikes per layer (Yu et al.)"}
    assert all(isinstance(f, Figure) for f in figures.values())
    ablation = lens_bias.ablate(shared_tiny("gpt2", act_fn="relu"), n_sequences=8, seq_len=8, progress=False)
    lines = ablation.plot().axes[0].get_lines()
    assert len(lines) == ablation.table.condition.nunique()


def test_results_plot_and_show_themselves(report):
    from matplotlib.figure import Figure

    assert isinstance(report.token_preference.plot(), Figure) and isinstance(report.sinks.plot(position=0, eps=0.1), Figure)
    assert "CircuitsVis.ColoredTokens" in report.token_preference.show(top=3).local_src
    with pytest.raises(LensBiasError, match="DecompositionResult has no figure"):
        report.decomposition.plot()
    with pytest.raises(LensBiasError, match="PositionalVarianceResult has no circuitsvis view"):
        report.positional_variance.show()  # its r_t by position said nothing a figure does not: no view
    lines = report.positional_variance.plot().axes[0].get_lines()
    assert len(lines) == 2 + 1  # an init of 2 layers: one line per layer and the (t+1)^-1/2 law
    trained = dataclasses.replace(report.positional_variance, regime="trained")  # a trained (or deep) model: a layer × position heatmap
    image = trained.plot().axes[0].images[0].get_array()
    assert image.shape == tuple(trained.r_out.shape) and torch.allclose(torch.as_tensor(image.data), torch.log10(trained.r_out), equal_nan=True)


@requires_chromium
def test_the_browser_check_catches_a_script_error_and_an_undrawn_view(tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>notDefined();</script></body></html>")
    with pytest.raises(AssertionError, match="notDefined is not defined"):
        read_page(broken)
    empty = tmp_path / "empty.html"
    empty.write_text('<html><body><div id="circuits-vis-1234"></div></body></html>')
    with pytest.raises(AssertionError, match="was not drawn"):
        read_page(empty)


@requires_chromium
def test_random_init_page_reads_in_the_browser(report, model, tmp_path):
    tokens = lens_bias.random_tokens(1, 10, 200, seed=2)[0]
    path = report.to_html(tmp_path / "report.html", views={"attention": viz.attention_view(model, tokens, layers=[0])})
    dom = read_page(path, screenshot="report_random_init.png")
    assert len(re.findall(r'<div id="(circuits-vis-[^"]+)"', path.read_text())) == 2  # the favourite tokens and the attention view
    assert dom.count("<img") == len(report.figures()) == 6 and "<table" in dom and path.stat().st_size < PAGE_BUDGET
    # read like a figure page: headline numbers first, figures before the tables, the text summary last
    assert re.findall(r"<h2>([^<]*)</h2>", dom)[:2] == ["Headline numbers", "Token preference"]
    assert dom.index("Headline numbers") < dom.index("<img") < dom.index('class="dataframe"') < dom.index("<pre>")
    assert "token_str" not in dom and ">None</td>" not in dom and ">nan</td>" not in dom  # no tokenizer: no empty column
    assert "sink_rate_0" not in dom and "Sink_0 (% of sequences, α &gt; ε)" in dom  # columns in words


@requires_chromium
def test_trained_page_opens_with_the_anatomy_and_shows_the_sink_heads(tmp_path):
    model = shared_tiny("llama")
    report = lens_bias.analyze(model, n_sequences=8, seq_len=12, regime="trained", sections=[..., "sink_attribution"], progress=False)
    path = report.to_html(tmp_path / "trained.html")
    dom = read_page(path)
    headings = re.findall(r"<h2>([^<]*)</h2>", dom)
    assert headings[:4] == ["Anatomy of the sink", "What removes the sink", "Attention of the strongest sink heads", "Other numbers"]
    assert headings.count("Anatomy of the sink") == 1 and "Headline numbers" not in headings
    heads = report.sink_heads
    assert "attention of the strongest sink heads (unedited)" in dom and len(heads.views()) == len(heads.conditions)
    assert path.stat().st_size < PAGE_BUDGET


def test_sink_heatmap_has_integer_ticks(report):
    ax = report.sinks.plot(position=0).axes[0]
    assert list(ax.get_xticks()) == [0, 1, 2, 3] and list(ax.get_yticks()) == [0, 1]


def test_a_random_inits_figures_say_something(report):
    """No head of a random init passes ε: its sink heatmap shows the first token's mean share instead of a uniform
    zero; its 2 layers are ticked 0 and 1, not 0, 0.5, 1."""
    assert report.sinks.rate_by_head(0).max() == 0
    ax = report.sinks.plot(position=0).axes[0]
    assert "no head passes ε" in ax.get_title()
    assert torch.allclose(torch.as_tensor(ax.images[0].get_array().data).float(), report.sinks.share(0).float())
    for fig in (report.massive_activations.plot(), report.super_weights.plot()):
        fig.canvas.draw()
        assert [t for t in fig.axes[0].get_xticks() if 0 <= t <= 1] == [0, 1]
