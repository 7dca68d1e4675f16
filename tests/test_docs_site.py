"""The docs site (mkdocs.yml, docs/, ``make docs``): what a reader gets, checked without the
network and, but for the last test, without building it.

* it works opened from the disk (``use_directory_urls: false``; search from file://) and
  loads nothing from a CDN: every script and stylesheet is a file under docs/;
* maths is typeset offline: pymdownx.arithmatex (generic) and the KaTeX copy in
  docs/javascripts/katex/, fonts included;
* the home page names every family of algorithms and links its page;
* the API page documents exactly what ``strategies`` exports (plus the two engines and
  ``strategies.client``), without the engines' internal methods;
* the run-config keys table keeps key names whole, gives the meaning the page's width, and
  its strategy filter shows the keys ``fedhetero keys --strategy NAME`` prints;
* ``make docs`` installs the ``docs`` extra alone, which holds no torch;
* ``deploy run --help`` and docs/deployment.md use the same port for remote SuperNodes.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import strategies
from fedapp import config_docs
from fedapp.config_keys import ALL, APP, KEYS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def top_block(key: str) -> str:
    """The lines under a top-level key of mkdocs.yml (read as text: PyYAML is not among the
    declared dependencies, and the file's ``!!python`` tag needs a loader of its own)."""
    text = (ROOT / "mkdocs.yml").read_text()
    found = re.search(rf"^{re.escape(key)}:(.*)\n((?:(?:[ #].*)?\n)*)", text, re.M)
    assert found, f"mkdocs.yml has no {key}"
    return found.group(1).strip() or found.group(2)


def items(block: str, indent: int = 2) -> list[str]:
    """The ``- item`` entries of a block at one indentation (``- name:`` gives ``name``)."""
    return [item.rstrip(":").strip() for item in
            re.findall(rf"^ {{{indent}}}- ([^#\n]*)", block, re.M)]


def option(block: str, name: str) -> str:
    """The value of ``name: value`` in a block (its first occurrence)."""
    found = re.search(rf"^\s+{re.escape(name)}: (.*?)\s*(?:#.*)?$", block, re.M)
    assert found, f"no {name} in {block[:200]}"
    return found.group(1)


def local_links(page: Path) -> list[tuple[str, str]]:
    """(path, anchor) of every relative link of a Markdown page."""
    links = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        links.append((path, anchor))
    return links


# ----------------------------------------------------------------- offline, from the disk
def test_the_site_opens_from_the_disk_and_loads_nothing_from_the_network():
    assert top_block("use_directory_urls") == "false"  # page.html links, no directory listings
    assert "offline" in items(top_block("plugins"))  # search from file:// too
    polyfills = items(re.search(r"^  polyfills:\n((?:    .*\n)+)", top_block("extra"),
                                re.M).group(1), indent=4)
    assets = [*items(top_block("extra_javascript")), *items(top_block("extra_css")), *polyfills]
    assert len(assets) >= 6
    for asset in assets:
        assert not re.match(r"[a-z]+:|//", asset), f"{asset}: not a local file"
        assert (DOCS / asset).is_file(), asset
    # Material's offline plugin adds iframe-worker from a CDN unless a polyfill names it
    assert any("iframe-worker" in p for p in polyfills)
    assert option(top_block("theme"), "font") == "false"  # no web fonts


def test_maths_is_typeset_by_the_local_katex_copy():
    extensions = top_block("markdown_extensions")
    assert re.search(r"^  - pymdownx\.arithmatex:\n      generic: true\n", extensions, re.M)
    scripts, styles = items(top_block("extra_javascript")), items(top_block("extra_css"))
    assert scripts.index("javascripts/katex/katex.min.js") < scripts.index("javascripts/math.js")
    css = next(s for s in styles if s.startswith("javascripts/katex/"))
    fonts = set(re.findall(r"url\((fonts/[^)]+\.woff2)\)", (DOCS / css).read_text()))
    assert len(fonts) >= 19
    for font in fonts:  # the first source of every @font-face, so the browser asks for no other
        assert (DOCS / css).parent.joinpath(font).is_file(), font
    math = (DOCS / "javascripts/math.js").read_text()
    assert "katex.render" in math and ".arithmatex" in math
    for vendored in ("katex", "iframe-worker"):
        assert "MIT" in (DOCS / "javascripts" / vendored / "LICENSE").read_text()


def test_the_pages_write_their_maths_as_tex():
    """Maths in $...$ (and $$ blocks) for KaTeX, not as ASCII or Unicode text, on every page
    with maths; a table cell's maths has no ``|`` (it would split the cell: ``\\vert``)."""
    with_maths = ["index.md", "api.md", "clock.md", "reliability.md", "simulation.md",
                  "running.md", "outputs.md", "your-project.md",
                  *(f"strategies/{p.name}" for p in sorted((DOCS / "strategies").glob("*.md")))]
    without_maths = ["getting-started.md", "first-hour.md", "deployment.md"]
    # maths as ASCII or Unicode text: eta_g, <-, sum_k, tau_(k,i), w_{t+1}, 2^22, sqrt(,
    # grad F, ←, Greek letters, Σ, ‖, ∇, ⌊, super- and subscript digits
    ascii_maths = re.compile(
        r"<-|←|\b(?:eta|tau|alpha|beta|delta|Delta|lambda|theta|sigma|rho|mu|eps|sum|grad)_\w"
        r"|\bsqrt\(|\bgrad F\b|\b[A-Za-z]_[A-Za-z0-9({]|\w\^[\w({−-]"
        r"|[\u0391-\u03a9\u03b1-\u03c9∑‖∇⌊⌈∝∈√∞ℓ²³⁰-⁹₀-₉ᵢⱼ]")
    inline_maths = re.compile(r"\$[^$\n]+\$")
    for name in with_maths + without_maths:
        prose = (DOCS / name).read_text()
        for pattern, flags in ((r"```.*?```", re.S), (r"`[^`]*`", 0),  # code
                               (r"<!--.*?-->", re.S), (r"^\$\$\n.*?^\$\$$", re.S | re.M)):
            prose = re.sub(pattern, "", prose, flags=flags)
        prose = re.sub(r"\]\([^)\s]*\)", "]", prose)  # link targets
        assert bool(inline_maths.search(prose)) == (name in with_maths), name
        words = inline_maths.sub("", prose)
        found = ascii_maths.search(words)
        assert not found, f"{name}: {words[max(found.start() - 60, 0):found.end() + 20]!r}"
        for line in prose.splitlines():
            if line.startswith("|"):
                assert not any("|" in m for m in inline_maths.findall(line)), f"{name}: {line}"


# ----------------------------------------------------------------- the home page
FAMILIES = {  # page -> names the home page must give with it
    "strategies/fedavg.md": ["FedAvg", "FedSGD", "weightings", "FedAvgM", "FedAdam",
                             "FedYogi", "FedAdagrad"],
    "strategies/fedprox-fednova.md": ["FedProx", "FedNova"],
    "strategies/scaffold.md": ["SCAFFOLD"],
    "strategies/feddyn.md": ["FedDyn"],
    "strategies/moon.md": ["MOON"],
    "strategies/fedveca.md": ["FedVeca"],
    "strategies/fedexp.md": ["FedExP"],
    "strategies/fedlc.md": ["FedLC"],
    "strategies/dynamicfl.md": ["DynamicFL"],
    "strategies/async.md": ["FedBuff", "FedAsync"],
    "strategies/selection.md": ["Oort", "Power-of-Choice", "TiFL"],
    "strategies/width.md": ["HeteroFL", "FjORD", "FedRolex"],
    "strategies/robust.md": ["median", "trimmed mean"],
    "clock.md": ["clock"],
}


def test_the_home_page_links_every_family_and_every_link_leads_to_a_page():
    index = DOCS / "index.md"
    text = index.read_text()
    linked = {path for path, _ in local_links(index)}
    for page, names in FAMILIES.items():
        assert page in linked, f"index.md does not link {page}"
        for name in names:
            assert name in text, f"index.md does not name {name}"
    strategy_pages = {f"strategies/{p.name}" for p in (DOCS / "strategies").glob("*.md")}
    assert strategy_pages <= linked, strategy_pages - linked
    for path, _ in local_links(index):
        if path:
            assert (DOCS / path).is_file(), f"index.md links {path}, which is not a page"


# ----------------------------------------------------------------- the API page
ENGINES = {"strategies.engine.round_engine.RoundEngine",
           "strategies.engine.async_engine.AsyncEngine"}
# what the API page lists besides the exports, each with a reason on the page
EXTRAS = ENGINES | {"strategies.client"}
USER_METHODS = {"start", "summary", "state_dict", "load_state_dict"}  # what a user calls


def api_entries() -> dict[str, dict]:
    """{path: options} of every ``:::`` block of api.md."""
    found: dict[str, dict] = {}
    blocks = re.split(r"^::: ", (DOCS / "api.md").read_text(), flags=re.M)[1:]
    for block in blocks:
        path, _, rest = block.partition("\n")
        options = re.match(r"    options:\n((?:      .*\n)+)", rest)
        found[path.strip()] = dict(re.findall(r"^      (\w+): (.*)$", options.group(1), re.M)) \
            if options else {}
    return found


def member_list(value: str) -> bool | list[str]:
    """``true``, ``false`` or ``[a, b]`` of a ``members:`` option."""
    if value in ("true", "false"):
        return value == "true"
    return [name.strip() for name in value.strip("[]").split(",")]


def resolve(path: str) -> object:
    """The object a dotted path names (module, then attributes)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def test_the_api_page_documents_exactly_the_exported_names():
    documented = api_entries()
    exported = set(strategies.__all__)
    by_name = {path.rsplit(".", 1)[-1]: path for path in documented if path not in EXTRAS}
    assert len(by_name) == len(documented) - len(EXTRAS), "one name documented twice"
    assert set(by_name) == exported, (f"missing: {exported - set(by_name)}, "
                                      f"not exported: {set(by_name) - exported}")
    for name, path in by_name.items():
        assert resolve(path) is getattr(strategies, name), path
    for extra in EXTRAS:
        assert extra in documented and resolve(extra) is not None


def test_the_api_page_shows_only_the_public_methods_it_lists():
    plugins = top_block("plugins")
    assert option(plugins, "members") == "false"  # no methods unless api.md names them
    assert option(plugins, "filters") == '["!^_"]'
    assert option(plugins, "docstring_section_style") == "spacy"  # the default under, unclipped
    for path, block in api_entries().items():
        members = member_list(block.get("members", "false"))
        if path == "strategies.client":
            assert members is True  # the helpers module: its __all__
            continue
        if members is False:
            continue
        obj = resolve(path)
        for member in members:
            assert not member.startswith("_") and callable(getattr(obj, member)), (path, member)
        if path in ENGINES or "algorithms" in path:
            assert set(members) <= USER_METHODS, path


def test_grouped_parameters_get_one_entry_and_constants_their_values(tmp_path, monkeypatch):
    """docs/griffe_docstrings.py on a class that documents three names in one entry and has
    a constant default: one row with each name's default, the constant's value."""
    griffe = pytest.importorskip("griffe")
    sys.path.insert(0, str(DOCS))
    try:
        extension = importlib.import_module("griffe_docstrings")
    finally:
        sys.path.remove(str(DOCS))
    code = '''
LIMIT = 10


class Policy:
    """A policy.

    Parameters
    ----------
    start, decay, floor : float
        eps_0, its decay and its floor.
    limit : int
        At most this many.
    """

    def __init__(self, start: float = 0.9, decay: float = 0.98, floor: float = 0.2,
                 limit: int = LIMIT) -> None:
        pass
'''
    (tmp_path / "policy_module.py").write_text(code)
    monkeypatch.setattr(griffe.GitInfo, "from_package", classmethod(lambda cls, module: None))
    module = griffe.load("policy_module", search_paths=[tmp_path], docstring_parser="numpy",
                         extensions=griffe.load_extensions(extension.NumpyDocstrings()))
    (section,) = [s for s in module["Policy"].docstring.parsed
                  if s.kind is griffe.DocstringSectionKind.parameters]
    rows = {p.name: (str(p.annotation), str(p.value), p.description) for p in section.value}
    assert rows == {
        "start, decay, floor": ("float", "start=0.9, decay=0.98, floor=0.2",
                                "eps_0, its decay and its floor."),
        "limit": ("int", "10", "At most this many."),
    }


# ----------------------------------------------------------------- the run-config keys
def test_the_keys_table_keeps_names_whole_and_the_meaning_in_full():
    table = config_docs.markdown_table()
    rows = [line for line in table.split("\n") if line.startswith("| `")]
    assert len(rows) == len(KEYS)
    assert "| key = default | meaning |" in table  # two columns: the meaning gets the width
    for row, key in zip(rows, KEYS):
        first, meaning = re.fullmatch(r"\| (.*?) \| (.*) \|", row).groups()
        assert first.startswith(f"`{key.name}`<br>= `"), first  # the name in one code span
        assert "*allowed:*" in meaning and '<span class="read-by">' in meaning
        raw = re.sub(r"`[^`]*`|<br>|</?span[^>]*>", "", meaning)
        assert not re.search(r"<[A-Za-z/!]", raw), f"{key.name}: a '<' that opens a tag"
    css = (DOCS / "stylesheets/extra.css").read_text()
    nowrap = re.search(r"table:not\(\[class\]\):has\(\.read-by\) td:first-child code \{\s*"
                       r"white-space: nowrap;", css)
    assert nowrap, "key names must not wrap"
    assert (DOCS / "javascripts/config-keys.js").is_file()
    assert "javascripts/config-keys.js" in items(top_block("extra_javascript"))


def test_the_strategy_filter_shows_the_keys_fedhetero_keys_prints():
    """The page's filter (docs/javascripts/config-keys.js), done here as it does it: a row
    shows for strategy S when its read-by, groups expanded, names S; that is the app's keys
    and those S reads, as ``fedhetero keys --strategy S`` (simulation/list_keys.py)."""
    table = config_docs.markdown_table()
    mark = re.search(rf"<!-- {re.escape(config_docs.GROUPS_MARK)} (.*?) -->", table)
    groups = json.loads(mark.group(1))
    assert groups["app"] == list(ALL)
    rows = re.findall(r'^\| `([a-z0-9-]+)`<br>.*<span class="read-by">(.*?)</span> \|$',
                      table, re.M)
    assert len(rows) == len(KEYS)
    for strategy in ALL:
        shown = set()
        for key, read_by in rows:
            names = [part.strip().strip("`") for part in read_by.split(",")]
            if any(strategy in groups.get(name, [name]) for name in names):
                shown.add(key)
        listed = {k.name for k in KEYS if APP in k.used_by or strategy in k.used_by}
        assert shown == listed, (strategy, shown ^ listed)


# ----------------------------------------------------------------- make docs
def test_make_docs_installs_the_docs_extra_alone_without_torch():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["docs"]
    names = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in extra}
    assert {"mkdocs", "mkdocs-material", "mkdocstrings", "pymdown-extensions"} <= names
    assert not names & {"torch", "torchvision", "flwr", "fedhetero", "flwr-datasets"}
    makefile = (ROOT / "Makefile").read_text()
    rules = re.findall(r"^(docs|\$\(DOCS_STAMP\)):[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert {name for name, _ in rules} == {"docs", "$(DOCS_STAMP)"}
    recipes = "".join(recipe for _, recipe in rules)
    assert "DOCS_VENV" in recipes and "$(PY)" not in recipes  # not the app's venv
    assert '-e "' not in recipes and ".[" not in recipes  # not the project with its extras
    assert "optional-dependencies" in makefile and '["docs"]' in makefile
    docs_rule = re.search(r"^docs: (.*)$", makefile, re.M).group(1)
    assert "$(STAMP)" not in docs_rule


# ----------------------------------------------------------------- ports
def test_deploy_run_help_and_the_docs_use_one_port_for_remote_supernodes():
    remote = re.compile(r"deploy run --host 0\.0\.0\.0 --port (\d+)")
    import deploy.run  # noqa: PLC0415 - the --help text is its module docstring

    in_help = set(remote.findall(deploy.run.__doc__))
    in_docs = set(remote.findall((DOCS / "deployment.md").read_text()))
    assert in_help and in_help == in_docs, (in_help, in_docs)


# ----------------------------------------------------------------- the build
def docs_python() -> str | None:
    """An interpreter with mkdocs: this one, or `make docs`'s venv."""
    try:
        importlib.import_module("mkdocs")
        importlib.import_module("material")
        importlib.import_module("mkdocstrings_handlers.python")
    except ImportError:
        venv = ROOT / ".venv" / "docs" / "bin" / "python"
        return str(venv) if venv.is_file() else None
    return sys.executable


@pytest.mark.usefixtures("processes")
def test_the_site_builds_strict_offline_and_from_the_disk(tmp_path):
    """mkdocs build --strict (any warning fails) in a few seconds; the pages are files, the
    maths spans are on the pages that have maths, and no page loads a remote script."""
    python = docs_python()
    if python is None:
        pytest.skip("mkdocs is not installed here (make docs installs it in .venv/docs)")
    site = tmp_path / "site"
    started = time.monotonic()
    done = subprocess.run([python, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    assert seconds < 60, seconds
    assert (site / "config.html").is_file() and (site / "strategies" / "fedavg.html").is_file()
    assert (site / "search" / "search_index.js").is_file()  # the offline plugin's index
    for name in ("index.html", "api.html"):
        assert 'class="arithmatex"' in (site / name).read_text(), name
    api = (site / "api.html").read_text()  # docs/griffe_docstrings.py at work
    assert api.count("<code>exploration, exploration_decay, exploration_min</code>") == 1
    assert "NUM_EXAMPLES" not in api and "&#39;num-examples&#39;" in api
    assert 'id="strategies.algorithms.dynamicfl.DynamicFL.train_round"' not in api
    assert '<th>Default</th>' not in api  # no clipped Default column
    for page in site.rglob("*.html"):
        html = page.read_text()
        assert not re.search(r"<(script|link)[^>]+(src|href)=\"(https?:)?//", html), page
