"""MkDocs hooks of the docs site (``mkdocs.yml``, ADR 0013): pages made from the repository,
links that work both on the site and in the repository, and a nav that takes new guides alone.

* Pages from outside ``docs/``: the ADRs (``adr/`` → ``adr/``, its README as the index),
  ``CHANGELOG.md`` and ``RELEASING.md``; the HTTP API, rendered from the same ``openapi.json``
  the server serves (``api/openapi.py``, so it cannot drift from the routes), which is also
  published beside it; the Python API pages, whose ``:::`` directives mkdocstrings expands from
  the docstrings.
* Links are written for the repository (``docs/distributed.md`` links ``../adr/0007-….md``) and
  rewritten here to where the page lands on the site. A link to a repository file that is not a
  page stays as it is, and ``--strict`` fails on it: link to a page, or name the file in code.
* A guide in ``docs/`` missing from the nav is appended under "More guides" (so a new page never
  fails the build; moving it to its section is one line in ``mkdocs.yml``).
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
DOCS = "docs"
MORE = "More guides"
_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")

PYTHON_API = {
    "reference/python.md": (
        "Python API",
        "The package root: what `import gpulayer_kernel` offers (its `__all__`). Jupyter, IPython "
        "and torch are imported only by the parts that need them.",
        "gpulayer_kernel",
    ),
    "reference/torch.md": (
        "PyTorch API",
        "`gpulayer_kernel.torch`: runtime helpers for code in a job, `Module` and `Trainer` "
        "(guide: [trainer.md](../trainer.md)). Needs the `torch` extra.",
        "gpulayer_kernel.torch",
    ),
    "reference/client.md": (
        "Client API",
        "`gpulayer_kernel.client`: `Client` and `AsyncClient` for a served control plane, with the "
        "same calls as an in-process `ControlPlane`.",
        "gpulayer_kernel.client.clients",
    ),
}


def repo_pages() -> dict[str, str]:
    """Repository files outside ``docs/`` that become pages: repository path → site path."""
    pages = {"CHANGELOG.md": "changelog.md", "RELEASING.md": "releasing.md"}
    for adr in sorted((ROOT / "adr").glob("*.md")):
        pages[f"adr/{adr.name}"] = "adr/index.md" if adr.name == "README.md" else f"adr/{adr.name}"
    return pages


def _site_of(repo_path: str, pages: dict[str, str]) -> str | None:
    if repo_path in pages:
        return pages[repo_path]
    if repo_path.startswith(f"{DOCS}/"):
        return repo_path[len(DOCS) + 1 :]  # a guide or an image under docs/
    return None


def rewrite_links(markdown: str, repo_path: str, site_path: str, pages: dict[str, str]) -> str:
    """Relative links of a page written at ``repo_path``, pointed at where the targets land."""

    def fix(m: re.Match[str]) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return m.group(0)
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), target))
        site = _site_of(resolved, pages)
        if site is None:
            return m.group(0)  # not a page: --strict reports it
        new = posixpath.relpath(site, posixpath.dirname(site_path) or ".")
        return f"{m.group(1)}{new}{m.group(3) or ''}{m.group(4)}"

    return _LINK.sub(fix, markdown)


# -- the HTTP API page ---------------------------------------------------------------------------


def _type(schema: dict[str, Any] | bool) -> str:
    if isinstance(schema, bool):
        return "any"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {_type(schema['additionalProperties'])}"
    return str(kind)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def http_api_markdown(doc: dict[str, Any]) -> str:
    """The OpenAPI document as one page: every operation, then every schema."""
    out = [
        "# HTTP API",
        "",
        f"Generated from [`openapi.json`](openapi.json) (OpenAPI {doc['openapi']}, GPUlayer "
        f"{doc['info']['version']}), the document every server serves at "
        "`/api/v1/openapi.json`, made from the routes' own declarations. Base: "
        "`/api/v1` under `gpulayer serve`, `{base_url}gpulayer/api/v1` inside Jupyter. Errors are "
        "[ErrorBody](#errorbody). The table of routes with their rules: "
        "[HTTP routes](../api-routes.md).",
        "",
    ]
    for tag, title in (("public", "Public"), ("user", "User routes"), ("worker", "Worker routes")):
        out += [f"## {title}", ""]
        for path, methods in doc["paths"].items():
            for method, op in methods.items():
                if op["tags"] != [tag]:
                    continue
                out += [f"### `{method.upper()} {path}`", "", _cell(op["summary"]), ""]
                if not op["security"]:
                    out += ["No token: anyone may call it.", ""]
                elif "description" in op:
                    out += [op["description"], ""]
                else:
                    out += ["A client token (or Jupyter's login inside Jupyter).", ""]
                if op["parameters"]:
                    out += ["| parameter | in | type | |", "| --- | --- | --- | --- |"]
                    out += [
                        f"| `{p['name']}` | {p['in']} | {_type(p['schema'])} "
                        f"| {_cell(p.get('description', ''))} |"
                        for p in op["parameters"]
                    ]
                    out.append("")
                body = op.get("requestBody", {}).get("content", {})
                for media, content in body.items():
                    out += [f"Body (`{media}`): {_type(content['schema'])}", ""]
                answers = []
                for status, answer in op["responses"].items():
                    schema = answer.get("content", {}).get("application/json", {}).get("schema")
                    what = _type(schema) if schema and status.startswith("2") else ""
                    answers.append(f"`{status}` {_cell(answer['description'])} {what}".strip())
                out += ["Answers: " + "; ".join(answers) + ".", ""]
    out += ["## Schemas", ""]
    for name, schema in doc["components"]["schemas"].items():
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [_cell(schema["description"]), ""]
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            out += ["| field | type | required | |", "| --- | --- | --- | --- |"]
            out += [
                f"| `{field}` | {_type(p)} | {'yes' if field in required else ''} "
                f"| {_cell(p.get('description', ''))} |"
                for field, p in props.items()
            ]
        elif "enum" in schema:
            out.append(f"One of {_type(schema)}.")
        out.append("")
    return "\n".join(out)


def openapi_document() -> dict[str, Any]:
    from gpulayer_kernel.api import build_openapi, operations

    return build_openapi(operations())


# -- the hooks -----------------------------------------------------------------------------------


def _listed(nav: Any) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(_listed(v) for v in nav.values()))
    if isinstance(nav, list):
        return set().union(*(_listed(v) for v in nav))
    return set()


def _with_adrs(nav: Any, adrs: list[str]) -> Any:
    """The nav with its ``adr/index.md`` entry grown into a section of every ADR."""
    if isinstance(nav, list):
        return [_with_adrs(v, adrs) for v in nav]
    if isinstance(nav, dict):
        return {
            k: ["adr/index.md", *adrs] if v == "adr/index.md" else _with_adrs(v, adrs)
            for k, v in nav.items()
        }
    return nav


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Every ADR under the ADR index; guides the nav does not list yet under "More guides"."""
    adrs = sorted(v for v in repo_pages().values() if v.startswith("adr/") and v != "adr/index.md")
    nav = _with_adrs(config.nav or [], adrs)
    listed = _listed(nav)
    docs = Path(config.docs_dir)
    new = sorted(
        p.relative_to(docs).as_posix()
        for p in docs.rglob("*.md")
        if p.relative_to(docs).as_posix() not in listed
    )
    if new:
        nav.append({MORE: new})
    config.nav = nav
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for repo_path, site_path in repo_pages().items():
        text = (ROOT / repo_path).read_text()
        files.append(File.generated(config, site_path, content=text))
    for site_path, (title, intro, module) in PYTHON_API.items():
        text = f"# {title}\n\n{intro}\n\n::: {module}\n"
        files.append(File.generated(config, site_path, content=text))
    files.append(
        File.generated(config, "reference/http-api.md", content=http_api_markdown(_openapi()))
    )
    files.append(
        File.generated(
            config, "reference/openapi.json", content=json.dumps(_openapi(), indent=1) + "\n"
        )
    )
    return files


_DOC: dict[str, Any] = {}


def _openapi() -> dict[str, Any]:
    if not _DOC:
        _DOC.update(openapi_document())
    return _DOC


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    site_path = page.file.src_uri
    pages = repo_pages()
    by_site = {v: k for k, v in pages.items()}
    repo_path = by_site.get(site_path, f"{DOCS}/{site_path}")
    if site_path in PYTHON_API or site_path == "reference/http-api.md":
        return markdown  # generated with site links already
    return rewrite_links(markdown, repo_path, site_path, pages)
